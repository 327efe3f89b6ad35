"""AgentLoop: consumes the bus, one lane per session, turns concurrent up to a limit.

A session's messages run in arrival order in its lane; one that arrives while the session is
busy waits there (``agent.queue_mode`` decides how) and is never dropped. Lanes exist only
while they have work, so idle sessions cost nothing in memory: they live in SQLite.

A turn ends in one transaction: the user's message, the model's messages, the inbox entries
it answered and its reply (into the outbox). A crash before that leaves the inbox entry
pending, and the next start answers it; a crash after it leaves the reply in the outbox, and
the next start sends it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from agent.budget import TokenCounter
from agent.commands import IMMEDIATE, CommandInfo, parse_command, run_command
from agent.compaction import FLUSH_PROMPT, CompactionFailed, Compactor, split_history
from agent.context import BuiltContext, ContextBuilder
from agent.errors import AgentError, ProviderContextTooLarge, ProviderError
from agent.provider import Provider, context_window
from agent.queueing import Work, fold, next_batch
from agent.runner import Runner, RunResult, Transcript, TurnBudget
from agent.sessions import SessionRecorder, TurnRecord
from agent.tools.base import ToolRegistry
from agent.turn import TurnContext, TurnServices
from gateway.kernel.bus import MessageBus
from gateway.kernel.config import Config
from gateway.kernel.events import (
    ChatActivity,
    InboundMessage,
    OutboundKind,
    OutboundMessage,
    new_id,
    utcnow,
)
from gateway.kernel.heartbeat_ack import heartbeat_ok
from gateway.kernel.store import Compaction, Store, StoredMessage
from gateway.kernel.tasks import TaskSet
from gateway.kernel.values import ChannelHints

_log = logging.getLogger(__name__)

STOP_WAIT = 5.0
PROMPT_CUT_MIN = 1500
PROMPT_CUT_SHARE = 0.6
"""A server that reports fewer prompt tokens than this share of what was sent is cutting the
prompt (tokenizers differ by ±20 %, not by 40 %)."""
PROMPT_CUT_EVERY = 600.0
MANUAL_KEEP = 2
"""/compact and a context overflow keep only the last exchange word for word."""
COMPACTION_READ_LIMIT = 5000
"""Most messages read to choose what to summarise (only when compacting)."""
STEERED_PREFIX = "[New message while you were working]"


@dataclass(slots=True)
class _Lane:
    waiting: list[Work] = field(default_factory=list)
    task: asyncio.Task[None] | None = None
    turn: asyncio.Task[None] | None = None
    current: Work | None = None
    stop_requested: bool = False


def _nowhere(msg: InboundMessage) -> bool:
    """A scheduled turn without a target (``heartbeat.target: none``): nothing is sent."""
    return msg.kind in ("cron", "heartbeat") and msg.deliver_to is None


def _deliverable(msg: InboundMessage, ctx: TurnContext, text: str) -> bool:
    """Whether a turn's final reply is sent: not when a tool already answered the chat, when
    a heartbeat has nothing to report, or when the turn has nowhere to send it."""
    if ctx.notes.answered_current_chat or _nowhere(msg):
        return False
    return not (msg.kind == "heartbeat" and heartbeat_ok(text))


class AgentLoop:
    def __init__(self, *, config: Config, bus: MessageBus, store: Store, provider: Provider,
                 registry: ToolRegistry, hints: Callable[[str], ChannelHints],
                 services: Callable[[InboundMessage], TurnServices] | None = None) -> None:
        """``services`` builds what tools may use beyond the workspace for one turn."""
        self.config = config
        self.bus = bus
        self.store = store
        self.provider = provider
        self.registry = registry
        self.hints = hints
        self.services = services or (lambda msg: TurnServices())
        self.workspace = config.workspace_path  # resolved once, not on every turn
        self.counter = TokenCounter(config.agent.model)
        self._context: ContextBuilder | None = None
        self.recorder = SessionRecorder(store, self.counter)
        self.runner = Runner(provider, registry, max_iterations=config.agent.max_iterations,
                             max_result_chars=config.agent.tools.max_result_chars)
        self.compaction = config.agent.context.compaction
        self.compactor = Compactor(provider, store, self.counter, self.compaction)
        self._limit = asyncio.Semaphore(config.agent.max_concurrent_turns)
        self._lanes: dict[str, _Lane] = {}
        self._tasks = TaskSet()
        self._dispatcher: asyncio.Task[None] | None = None
        self._tools_tokens: tuple[list[dict[str, Any]], int] | None = None
        self.turns_done = 0
        self.recent_errors: list[str] = []
        self._prompt_cut_said = -PROMPT_CUT_EVERY

    @property
    def context(self) -> ContextBuilder:
        """Built on first use: asking litellm for the model's window imports litellm."""
        if self._context is None:
            window = None
            if self.config.agent.context.max_context_tokens is None:
                window = context_window(self.config.agent.model,
                                        ask_litellm=self.provider.needs_litellm)
            self._context = ContextBuilder(self.config, self.counter, window=window)
        return self._context

    # lifecycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        self._dispatcher = asyncio.create_task(self._dispatch(), name="agent-dispatch")

    async def recover(self, channels: list[str]) -> int:
        """Answer what the last run stored but did not answer (a stop or a crash), for the
        channels this process runs (``parley chat`` must not take the gateway's). Called
        before the channels start, so these go ahead of anything new."""
        pending = await self.store.inbox_pending(channels)
        for msg in pending:
            self.submit(msg)
        if pending:
            _log.info("answering %d message(s) received before the last stop", len(pending))
        return len(pending)

    async def stop(self, grace: float = 10.0) -> None:
        """Stop taking messages, give running turns ``grace`` seconds, then cancel them.

        A cancelled turn stores nothing, so its messages stay pending in the inbox and are
        answered after the next start."""
        if self._dispatcher is not None:
            self._dispatcher.cancel()
            await asyncio.gather(self._dispatcher, return_exceptions=True)
            self._dispatcher = None
        for msg in self.bus.drain_inbound():  # taken before intake closed: still answered
            self.submit(msg)
        await self._tasks.finish(grace)

    @property
    def busy_sessions(self) -> int:
        return len(self._lanes)

    def is_busy(self, session_key: str) -> bool:
        """A turn of this session is running or waiting (the heartbeat skips a busy chat)."""
        return session_key in self._lanes

    @property
    def queued(self) -> int:
        return sum(len(lane.waiting) for lane in self._lanes.values())

    async def _dispatch(self) -> None:
        while True:
            msg = await self.bus.consume_inbound()
            try:
                self.submit(msg)
            except Exception:
                _log.exception("could not dispatch message %s", msg.message_id)

    # lanes --------------------------------------------------------------------------------

    def submit(self, msg: InboundMessage) -> None:
        if msg.is_command and parse_command(msg.text)[0] in IMMEDIATE:
            self._tasks.spawn(self._command(msg), f"command:{msg.session_key}")
            return
        if msg.is_command and parse_command(msg.text)[0] == "stop":
            self._tasks.spawn(self._stop_command(msg), f"stop:{msg.session_key}")
            return
        key = msg.session_key
        lane = self._lanes.get(key)
        if lane is None:
            lane = self._lanes[key] = _Lane()
        lane.waiting.append(Work(msg))
        lane.waiting = fold(lane.waiting, self.config.agent.queue_cap)
        if lane.task is None:
            lane.task = self._tasks.spawn(self._drain(key, lane), f"lane:{key}")

    async def _drain(self, key: str, lane: _Lane) -> None:
        try:
            while lane.waiting:
                work, taken = next_batch(lane.waiting, self.config.agent.queue_mode)
                del lane.waiting[:taken]
                async with self._limit:
                    lane.current, lane.stop_requested = work, False
                    lane.turn = asyncio.create_task(self.handle(work, lane), name=f"turn:{key}")
                    try:
                        await lane.turn
                    except asyncio.CancelledError:
                        if not lane.stop_requested or asyncio.current_task().cancelling():  # type: ignore[union-attr]
                            raise
                    finally:
                        lane.turn = lane.current = None
        finally:
            if self._lanes.get(key) is lane:
                del self._lanes[key]

    def _steer(self, lane: _Lane, work: Work) -> Callable[[], list[dict[str, Any]]] | None:
        """In ``steer`` mode: hand messages that arrived meanwhile to the running turn."""
        if self.config.agent.queue_mode != "steer":
            return None

        def take() -> list[dict[str, Any]]:
            out: list[dict[str, Any]] = []
            while lane.waiting and not lane.waiting[0].msg.is_command and \
                not lane.waiting[0].msg.context_only:
                arrived = lane.waiting.pop(0)
                work.sources.extend(arrived.sources)
                body = self.context.stored_user_message(arrived.msg)
                out.append({"role": "user", "content": f"{STEERED_PREFIX} {body['content']}"})
            return out
        return take

    # one piece of work --------------------------------------------------------------------

    async def handle(self, work: Work, lane: _Lane | None = None) -> None:
        """Process one turn; every failure becomes a message in the chat, not a traceback."""
        msg = work.msg
        if msg.context_only:
            await self._keep_as_context(work)
            return
        self.bus.activity(ChatActivity(channel=msg.channel, chat_id=msg.chat_id,
                                       thread_id=msg.thread_id))
        try:
            if msg.is_command and parse_command(msg.text)[0] == "compact":
                await self._compact_command(msg)
            elif msg.is_command:
                await self._command(msg)
            else:
                await self._turn(work, lane)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            _log.exception("turn for %s failed", msg.session_key)
            self._note_error(f"{type(exc).__name__}: {exc}")
            await self._answer(work.sources, msg, AgentError.user_message, kind="error")
        finally:
            self.bus.activity(ChatActivity(channel=msg.channel, chat_id=msg.chat_id,
                                           thread_id=msg.thread_id, busy=False))

    async def _keep_as_context(self, work: Work) -> None:
        """A group message not addressed to us: part of the history, no turn, no reply."""
        session = await self.store.active_session(work.msg.session_key)
        body = self.context.stored_user_message(work.msg)
        await self.recorder.finish(
            TurnRecord(session_id=session.id, turn_id=new_id(), inbound_id=work.msg.message_id,
                       started_at=utcnow(), user_message=body,
                       user_tokens=self.counter.count_message(body), sources=work.sources),
            None, status="context")

    async def _command(self, msg: InboundMessage) -> None:
        info = CommandInfo(model=self.config.agent.model, tools=self.registry.names,
                           queued=len(lane.waiting) if (lane := self._lanes.get(
                               msg.session_key)) else 0)
        try:
            text = await run_command(msg, self.store, info)
        except Exception:
            _log.exception("command %r failed", msg.text)
            text = AgentError.user_message
        await self._answer([msg], msg, text, kind="notice")

    async def _stop_command(self, msg: InboundMessage) -> None:
        """``/stop``: bypasses the queue and cancels the running turn at once."""
        lane = self._lanes.get(msg.session_key)
        turn = lane.turn if lane else None
        if lane is None or turn is None or turn.done():
            text = "Nothing is running."
        else:
            lane.stop_requested = True
            turn.cancel()
            await asyncio.wait({turn}, timeout=STOP_WAIT)
            waiting = len(lane.waiting)
            text = "Stopped. What you sent is kept in the conversation."
            if waiting:
                text += f" {waiting} message(s) waiting will be answered next."
        await self._answer([msg], msg, text, kind="notice")

    async def _history(self, session_id: int, compaction: Compaction | None,
                       limit: int) -> tuple[list[StoredMessage], bool]:
        """Messages since the last compaction, at most ``limit``; and whether there were
        more (then the session is due for compaction)."""
        start = compaction.first_kept_id if compaction else 0
        history = await self.store.recent_messages(session_id, limit + 1, from_id=start)
        return (history[1:], True) if len(history) > limit else (history, False)

    def _build(self, msg: InboundMessage, ctx: TurnContext, history: list[StoredMessage],
               compaction: Compaction | None) -> BuiltContext:
        return self.context.build(
            inbound=msg, history=history,
            hints=self.hints(msg.deliver_to[0] if msg.deliver_to else msg.channel),
            tools_tokens=self._schema_tokens(), session_key=msg.session_key,
            turn_id=ctx.turn_id, compaction=compaction)

    async def _compact(self, ctx: TurnContext, session_id: int, previous: Compaction | None,
                       *, keep_share: float, keep_messages: int | None = None,
                       focus: str | None = None) -> Compaction:
        """Summarise the oldest part of the session; raises CompactionFailed."""
        start = previous.first_kept_id if previous else 0
        everything = await self.store.recent_messages(session_id, COMPACTION_READ_LIMIT,
                                                      from_id=start)
        probe = self._build(replace(ctx.message, text="", media=()), ctx, [], previous)
        budget = max(self.context.max_context_tokens - self.config.agent.context
                     .reply_reserve_tokens - probe.snapshot["total_tokens"], 0)
        if keep_messages is None:
            keep_messages = self.config.agent.context.max_recent_messages // 2
        split = split_history(everything, keep_tokens=int(budget * keep_share),
                              keep_messages=keep_messages)
        if not split.old:
            raise CompactionFailed("nothing to compact yet")
        if self.compaction.memory_flush:
            await self._flush_memory(ctx, previous, split.old)
        return await self.compactor.compact(session_id, split, previous, focus)

    async def _flush_memory(self, ctx: TurnContext, previous: Compaction | None,
                            old: list[StoredMessage]) -> None:
        """A silent turn: the agent may save lasting facts before they are summarised.
        Nothing of it is stored in the conversation or delivered."""
        memory = self.registry.get("memory")
        if memory is None:
            return
        system = self.context.system_prompt()
        messages: list[dict[str, Any]] = [{"role": "system", "content": system.text}]
        if previous is not None:
            messages.append(self.context.summary_message(previous))
        messages += [m.body for m in old]
        messages.append({"role": "user", "content": FLUSH_PROMPT})
        flusher = Runner(self.provider, ToolRegistry([memory]), max_iterations=4,
                         max_result_chars=self.config.agent.tools.max_result_chars)
        try:
            await asyncio.wait_for(flusher.run(messages=messages, ctx=ctx),
                                   self.compaction.timeout)
        except (TimeoutError, ProviderError) as exc:
            _log.warning("memory flush before compaction skipped: %s", exc)

    async def _turn(self, work: Work, lane: _Lane | None) -> None:
        msg = work.msg
        session = await self.store.active_session(msg.session_key)
        ctx = TurnContext(message=msg, session_id=session.id, workspace=self.workspace,
                          tools=self.config.agent.tools, services=self.services(msg))
        limit = self.config.agent.context.max_recent_messages
        compaction = await self.store.compaction(session.id)
        history, more = await self._history(session.id, compaction, limit)
        built = self._build(msg, ctx, history, compaction)
        if self.compaction.enabled and (built.dropped_turns or more):
            try:
                compaction = await self._compact(
                    ctx, session.id, compaction, keep_share=self.compaction.keep_recent_share)
            except CompactionFailed as exc:
                _log.warning("compaction of %s failed: %s", msg.session_key, exc)
                await self.bus.publish_outbound(self._outbound(
                    msg, f"(I couldn't summarise the older messages — {exc} — so the oldest "
                         "are left out of this answer; they stay saved.)", "notice",
                    ctx.turn_id, key="compaction"))
            else:
                history, _ = await self._history(session.id, compaction, limit)
                built = self._build(msg, ctx, history, compaction)

        async def progress(text: str) -> None:
            if _nowhere(msg):
                return
            await self.bus.publish_outbound(self._outbound(msg, text, "progress", ctx.turn_id,
                                                           key=new_id()))

        steer = self._steer(lane, work) if lane else None

        class Hooks(Transcript):
            async def progress(self, text: str) -> None:
                await progress(text)

            def steer(self) -> list[dict[str, Any]]:
                return steer() if steer else []

        hooks = Hooks()
        result = hooks.so_far
        record = self._record(work, session.id, ctx, built)
        try:
            try:
                result = await self.runner.run(messages=built.messages, ctx=ctx, hooks=hooks,
                                               budget=self._budget(built))
            except ProviderContextTooLarge:
                if not self.compaction.enabled:
                    raise
                compaction = await self._compact(  # the window was smaller than we thought
                    ctx, session.id, compaction, keep_share=self.compaction.keep_recent_share / 4,
                    keep_messages=MANUAL_KEEP)
                history, _ = await self._history(session.id, compaction, limit)
                built = self._build(msg, ctx, history, compaction)
                record = self._record(work, session.id, ctx, built)
                hooks = Hooks()
                result = hooks.so_far
                result = await self.runner.run(messages=built.messages, ctx=ctx, hooks=hooks,
                                               budget=self._budget(built))
        except (ProviderError, CompactionFailed) as exc:
            _log.warning("turn %s: %s: %s", ctx.turn_id, type(exc).__name__, exc)
            self._note_error(f"{type(exc).__name__}: {exc}")
            text = exc.user_message if isinstance(exc, ProviderError) else \
                ProviderContextTooLarge(str(exc)).user_message
            reply = self._outbound(msg, text, "error", ctx.turn_id)
            await self.recorder.finish(record, result, status="error", error=str(exc),
                                       outbound=[] if _nowhere(msg) else
                                       [(reply, self.bus.expires_at(reply))])
            if not _nowhere(msg):
                await self.bus.publish_outbound(reply, stored=True)
            return
        except asyncio.CancelledError:
            if lane is not None and lane.stop_requested:  # /stop: keep what was done
                await asyncio.shield(self.recorder.finish(record, result, status="stopped"))
            raise  # shutdown: nothing stored, the message is answered after the next start
        self._check_prompt_kept(built, result)
        reply = self._outbound(msg, result.text, "reply", ctx.turn_id)
        deliver = _deliverable(msg, ctx, result.text)
        await self.recorder.finish(record, result, status=result.stop_reason,
                                   outbound=[(reply, self.bus.expires_at(reply))] if deliver
                                   else [])
        self.turns_done += 1
        if deliver:
            await self.bus.publish_outbound(reply, stored=True)

    def _check_prompt_kept(self, built: BuiltContext, result: RunResult) -> None:
        """Ollama keeps 4,096 prompt tokens (under 24 GiB of GPU memory) unless told otherwise
        and silently drops the rest from the start: the system prompt first. The usage it
        reports gives it away."""
        if not result.responses:
            return
        sent, seen = built.snapshot["total_tokens"], result.responses[0].prompt_tokens
        now = time.monotonic()
        if sent < PROMPT_CUT_MIN or not 0 < seen < PROMPT_CUT_SHARE * sent or \
                now - self._prompt_cut_said < PROMPT_CUT_EVERY:
            return
        self._prompt_cut_said = now
        text = (f"the model server counted {seen:,} prompt tokens where Parley sent about "
                f"{sent:,}: it is probably cutting the prompt, instructions first. Raise its "
                "context length (Ollama: OLLAMA_CONTEXT_LENGTH, often 4096 by default) or set "
                "agent.context.max_context_tokens to what it keeps")
        _log.warning("%s", text)
        self._note_error(text)

    def _budget(self, built: BuiltContext) -> TurnBudget:
        limit = self.context.max_context_tokens - self.config.agent.context.reply_reserve_tokens
        return TurnBudget(limit=limit, used=built.snapshot["total_tokens"],
                          count=self.counter.count_message)

    def _record(self, work: Work, session_id: int, ctx: TurnContext,
                built: BuiltContext) -> TurnRecord:
        return TurnRecord(session_id=session_id, turn_id=ctx.turn_id,
                          inbound_id=work.msg.message_id, started_at=utcnow(),
                          user_message=built.user_message, user_tokens=built.user_tokens,
                          snapshot=built.snapshot, sources=work.sources)

    async def _compact_command(self, msg: InboundMessage) -> None:
        """``/compact [focus]``: summarise the older part of the conversation now."""
        focus = parse_command(msg.text)[1] or None
        session = await self.store.active_session(msg.session_key)
        ctx = TurnContext(message=msg, session_id=session.id, workspace=self.workspace,
                          tools=self.config.agent.tools)
        previous = await self.store.compaction(session.id)
        try:
            entry = await self._compact(ctx, session.id, previous,
                                        keep_share=self.compaction.keep_recent_share,
                                        keep_messages=MANUAL_KEEP, focus=focus)
        except CompactionFailed as exc:
            text = f"Nothing was compacted: {exc}."
        else:
            text = (f"Compacted {entry.messages_summarised} earlier message(s) "
                    f"({entry.tokens_before:,} tokens) into a {entry.summary_tokens:,}-token "
                    "summary. The full history stays saved.")
        await self._answer([msg], msg, text, kind="notice")

    # replies ------------------------------------------------------------------------------

    def _schema_tokens(self) -> int:
        schemas = self.registry.schemas()  # a new list only when tools come or go (MCP)
        if self._tools_tokens is None or self._tools_tokens[0] is not schemas:
            self._tools_tokens = (schemas, self.counter.count_tools(schemas))
        return self._tools_tokens[1]

    def _note_error(self, text: str) -> None:
        self.recent_errors = [*self.recent_errors[-9:], f"{utcnow():%H:%M:%S} {text}"]

    def _outbound(self, msg: InboundMessage, text: str, kind: OutboundKind,
                  turn_id: str | None = None, key: str | None = None) -> OutboundMessage:
        system = msg.deliver_to is not None
        channel, chat_id = msg.deliver_to or (msg.channel, msg.chat_id)
        if kind == "reply" and msg.kind in ("cron", "heartbeat"):
            kind = msg.kind  # a scheduled answer is marked as such for the channel
        return OutboundMessage(
            channel=channel, chat_id=chat_id, text=text, kind=kind,
            reply_to=None if system else msg.message_id,
            thread_id=msg.deliver_thread if system else msg.thread_id, turn_id=turn_id,
            idempotency_key=f"{msg.channel}:{msg.chat_id}:{msg.message_id}:{kind}:{key or ''}")

    async def _answer(self, sources: list[InboundMessage], msg: InboundMessage, text: str, *,
                      kind: OutboundKind) -> None:
        """A reply that is not a model turn (commands, errors): stored with its inbox
        entries marked answered, in one transaction, then sent."""
        reply = self._outbound(msg, text, kind)
        if _nowhere(msg):
            await self.store.finish_inbound(sources, [])
            return
        await self.store.finish_inbound(sources, [(reply, self.bus.expires_at(reply))])
        await self.bus.publish_outbound(reply, stored=True)
