"""One turn, top to bottom: prepare → build the context → run the tool loop → record →
deliver.

A turn ends in one transaction: the user's message, the model's messages, the inbox entries
it answered and its reply (into the outbox; or, when its channel's sending is a write to our
database and nothing is ahead of it in the chat, sent in that same transaction: ``TurnSend``).
A crash before that leaves the inbox entry pending, and the next start answers it; a crash
after it leaves the reply in the outbox, and the next start sends it.

Longer than 450 lines: the path of one turn, whose parts are modules already (assembly,
sessions, turn_ends, replies, compacting); what is left here is the order they run in.

When it goes wrong: a provider error is recorded with what was done and the chat hears it in
one line; a request the server finds too large compacts the session harder and is tried once
more; ``/stop`` cancels the turn and keeps its complete tool rounds; a shutdown cancels it
and stores nothing, so its message stays pending and is answered after the next start.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from agent.assembly import ContextAssembly
from agent.compacting import SessionCompaction
from agent.compacting_background import BackgroundCompaction
from agent.compaction import CompactionFailed
from agent.context import BuiltContext, TurnState
from agent.errors import ProviderContextTooLarge, ProviderError
from agent.lanes import Lane
from agent.limits import Limits, Verdict
from agent.media import MediaStep
from agent.model_choice import ModelChoice
from agent.prompt_cut import PromptCutWarning
from agent.queueing import Work
from agent.replies import Replies, nowhere, outbound
from agent.runner import Runner, RunResult
from agent.sessions import SessionRecorder, TurnRecord
from agent.snapshots import RecordingTranscript
from agent.turn import TurnContext, TurnServices
from agent.turn_ends import TurnEnds
from agent.usage import Ledger
from gateway.kernel.bus import MessageBus
from gateway.kernel.config import Config
from gateway.kernel.events import (
    InboundMessage,
    MessageStage,
    OutboundMessage,
    Stage,
    new_id,
    utcnow,
)
from gateway.kernel.heartbeat_ack import heartbeat_ok
from gateway.kernel.store import Compaction, Store
from gateway.kernel.streams import Outcome, ReplyStream, stream_key

_log = logging.getLogger(__name__)

STEERED_PREFIX = "[New message while you were working]"
CONTEXT_BUILD_ERROR = "context_build_error"
CONTEXT_ERROR_CHARS = 200


@dataclass(slots=True)
class TurnStats:
    """What the gateway's status shows of the turns."""

    turns_done: int = 0
    limited: int = 0
    """Messages not answered because their sender was over a limit."""
    recent_errors: list[str] = field(default_factory=list)

    def error(self, text: str) -> None:
        self.recent_errors = [*self.recent_errors[-9:], f"{utcnow():%H:%M:%S} {text}"]


@dataclass(slots=True, weakref_slot=True)
class _Turn:
    """One turn's state as it goes through the steps. ``built``, ``record`` and ``hooks``
    belong to one try at the model; a retry after compacting starts them afresh."""

    work: Work
    lane: Lane | None
    ctx: TurnContext
    compaction: Compaction | None
    state: TurnState
    stream: ReplyStream | None = None
    """The reply shown while it is written (None: the chat's channel shows nothing live)."""
    after: str | None = None
    """What to start in the background once answered: "compact", "flush" or nothing."""
    built: BuiltContext = field(init=False)
    record: TurnRecord = field(init=False)
    hooks: _Hooks = field(init=False)

    @property
    def msg(self) -> InboundMessage:
        return self.work.msg

    @property
    def stopped(self) -> bool:
        """Cancelled by ``/stop``, not by a shutdown."""
        return self.lane is not None and self.lane.stop_requested


class _Hooks(RecordingTranscript):
    """What the turn does while the tool loop runs: tells the chat which tools run, hands
    the model messages that arrived meanwhile (``steer`` mode), keeps what was done and
    each model call's snapshot entry."""

    def __init__(self, flow: TurnFlow, turn: _Turn) -> None:
        super().__init__(turn.built.snapshot, turn.built.texts, turn.built.messages)
        self.flow = flow
        self._turn = weakref.ref(turn)
        """Not the turn itself: it holds these hooks, and a cycle would keep every turn's
        objects (its context, its messages, its task) until the collector found it."""

    @property
    def turn(self) -> _Turn:
        turn = self._turn()
        assert turn is not None, "the turn's hooks outlived it"
        return turn

    @property
    def wants_text(self) -> bool:  # type: ignore[override]
        return self.turn.stream is not None

    def on_text(self, visible: str) -> None:
        if self.turn.stream is not None:
            self.turn.stream.append(visible)

    def on_text_reset(self) -> None:
        if self.turn.stream is not None:
            self.turn.stream.reset()

    async def progress(self, text: str) -> None:
        msg = self.turn.msg
        if self.turn.stream is not None:
            self.turn.stream.set_status(text)
        if not nowhere(msg):
            await self.flow.bus.publish_outbound(
                outbound(msg, text, "progress", self.turn.ctx.turn_id, key=new_id()))

    def steer(self) -> list[dict[str, Any]]:
        lane = self.turn.lane
        if lane is None or self.flow.config.agent.queue_mode != "steer":
            return []
        out: list[dict[str, Any]] = []
        for arrived in lane.take_arrived(self.turn.msg.trust):
            self.turn.work.sources.extend(arrived.sources)  # answered by this turn
            body = self.flow.assembly.builder.stored_user_message(arrived.msg)
            out.append({"role": "user", "content": f"{STEERED_PREFIX} {body['content']}"})
        return out


def search_tags(msg: InboundMessage) -> tuple[str, str]:
    """(chat, person) a turn's messages are indexed under for ``session_search``."""
    return f"{msg.channel}:{msg.chat_id}", f"{msg.channel}:{msg.sender_id}"


def stage(bus: MessageBus, sources: list[InboundMessage], name: Stage) -> None:
    """Where people's messages are (acknowledgement reactions); the gateway's own turns and
    kept chatter have none."""
    for msg in sources:
        if msg.kind in ("user", "command") and not msg.context_only:
            bus.stage(MessageStage(channel=msg.channel, chat_id=msg.chat_id,
                                   message_id=msg.message_id, stage=name,
                                   thread_id=msg.thread_id))


def _final(turn: _Turn, text: str, kind: Literal["reply", "error"]) -> OutboundMessage:
    """The turn's answer, marked as the final of the turn's stream if it had one."""
    return outbound(turn.msg, text, kind, turn.ctx.turn_id,
                    stream=None if turn.stream is None else turn.stream.key)


def _deliverable(turn: _Turn, text: str) -> bool:
    """Whether a turn's final reply is sent: not when a tool already answered the chat, when
    a heartbeat has nothing to report, or when the turn has nowhere to send it."""
    if turn.ctx.notes.answered_current_chat or nowhere(turn.msg):
        return False
    return not (turn.msg.kind == "heartbeat" and heartbeat_ok(text))


class TurnFlow:
    def __init__(self, *, config: Config, bus: MessageBus, store: Store, runner: Runner,
                 recorder: SessionRecorder, assembly: ContextAssembly,
                 compaction: SessionCompaction, replies: Replies, stats: TurnStats,
                 services: Callable[[InboundMessage], TurnServices],
                 ledger: Ledger | None = None, limits: Limits | None = None,
                 models: ModelChoice | None = None, media: MediaStep | None = None,
                 background: BackgroundCompaction) -> None:
        self.config = config
        self.bus = bus
        self.store = store
        self.runner = runner
        self.recorder = recorder
        self.assembly = assembly
        self.compaction = compaction
        self.replies = replies
        self.stats = stats
        self.services = services
        self.ledger = ledger
        self.limits = limits
        self.models = models
        self.media = media
        self.background = background
        self.workspace = config.workspace_path  # resolved once, not on every turn
        self.prompt_cut = PromptCutWarning(self.stats)
        self.ends = TurnEnds(recorder, store)

    async def run(self, work: Work, lane: Lane | None) -> None:
        """Answer ``work`` with the model; ``lane`` (None outside a lane) is where ``/stop``
        and messages that arrive meanwhile come from. A sender over a limit
        (``agent/limits.py``) gets no turn: the model is not asked."""
        limits = self.limits
        if limits is not None and limits.enabled and (verdict := await limits.check(work.msg)):
            await self._refuse(work, verdict)
            return
        stage(self.bus, work.sources, "taken")  # before the model is asked
        turn = await self._prepare(work, lane)
        if self.media is not None and self.media.wanted(work.msg):
            await self._understand(turn)
        outcome: Outcome = "none"
        failed = False
        try:
            try:
                await self._build_context(turn)
            except (asyncio.CancelledError, ProviderError, CompactionFailed):
                raise
            except Exception as exc:
                failed = True
                await self._context_failed(turn, exc)
                return
            try:
                result = await self._run_tools(turn)
            except (ProviderError, CompactionFailed) as exc:
                failed = True
                outcome = await self._record_failure(turn, exc)
                return
            except asyncio.CancelledError:
                if turn.stopped:  # /stop: keep what was done
                    await asyncio.shield(self.ends.finish(turn.record, turn.hooks.so_far,
                                                          status="stopped"))
                else:  # shutdown: nothing stored, answered after the next start
                    outcome = "shutdown"
                raise
            self.prompt_cut.check(turn.built, result)
            outcome = await self._record_and_deliver(turn, result)
            if turn.after is not None:  # answered: the summary is made for the next turn
                self.background.start(turn.ctx, turn.compaction,
                                      flush_only=turn.after == "flush")
        finally:
            if turn.stream is not None:
                turn.stream.close(outcome)
            if outcome != "shutdown":
                stage(self.bus, work.sources, "failed" if failed else "done")

    async def keep_as_context(self, work: Work) -> None:
        """A group message not addressed to us: part of the history, no turn, no reply."""
        session = await self.store.active_session(work.msg.session_key)
        body = self.assembly.builder.stored_user_message(work.msg)
        await self.recorder.finish(
            TurnRecord(session_id=session.id, turn_id=new_id(), inbound_id=work.msg.message_id,
                       started_at=utcnow(), user_message=body,
                       user_tokens=self.assembly.counter.count_message(body),
                       sources=work.sources, index=search_tags(work.msg)),
            None, status="context")

    # the steps ----------------------------------------------------------------------------

    async def _prepare(self, work: Work, lane: Lane | None) -> _Turn:
        """The session, and what the turn's tools know of it."""
        msg = work.msg
        session_id, compaction = await self.store.turn_start(msg.session_key)
        ctx = TurnContext(message=msg, session_id=session_id, workspace=self.workspace,
                          tools=self.config.agent.tools, services=self.services(msg),
                          audience=self.assembly.audience(msg),
                          model=self.models.alias(msg) if self.models is not None else None)
        turn = _Turn(work, lane, ctx, compaction, await self.ends.state(session_id, lane))
        if msg.kind == "user" and not nowhere(msg):
            turn.stream = self.bus.open_stream(outbound(
                msg, "", "reply", ctx.turn_id,
                stream=stream_key(msg.channel, msg.chat_id, msg.message_id)))
        return turn

    async def _understand(self, turn: _Turn) -> None:
        """The pre-turn media step (``agent/media``): what was heard, seen and read of the
        message's files goes into it; its notices to the chat, its costs to the ledger."""
        assert self.media is not None
        try:
            done = await self.media.understand(turn.msg, turn.ctx.model)
        except Exception:  # our bug: the turn still runs, with the files' paths
            _log.exception("turn %s: the media step failed", turn.ctx.turn_id)
            return
        turn.work.msg = done.msg
        turn.ctx = replace(turn.ctx, message=done.msg)
        for n, line in enumerate(done.notices if not nowhere(done.msg) else ()):
            await self.bus.publish_outbound(
                outbound(done.msg, line, "notice", turn.ctx.turn_id, key=f"media-{n}"))
        if done.calls and self.ledger is not None:
            await self.ledger.record_calls(turn.ctx.session_id, turn.ctx.turn_id, done.msg,
                                           done.calls)

    async def _build_context(self, turn: _Turn) -> None:
        """The stored history built into messages. Summarised first only when it cannot fit
        otherwise; past ``compact_at_share`` the summary (and the memory flush before it)
        is made in the background once the turn has answered (``compacting_background``)."""
        history, more = await self.assembly.history(turn.ctx.session_id, turn.compaction)
        built = self.assembly.build(turn.msg, history, turn.compaction,
                                    turn_id=turn.ctx.turn_id, state=turn.state,
                                    audience=turn.ctx.audience)
        due = self.compaction.due(built, more, turn.compaction, turn.ctx.session_id) \
            if self.compaction.enabled else None
        if due == "compact" and self.background.must_wait(built, more):
            if await self._compact_before(turn):
                built = await self._rebuild(turn)
        elif self.compaction.enabled:
            turn.after = due or ("compact" if self.background.approaching(built, len(history))
                                 else None)
        self._try_with(turn, built)

    async def _run_tools(self, turn: _Turn) -> RunResult:
        """The tool loop. A request the server found too large (its window is smaller than
        we thought) compacts the session harder and is tried once more."""
        try:
            return await self._run_once(turn)
        except ProviderContextTooLarge:
            if not self.compaction.enabled:
                raise
        turn.compaction = await self.compaction.after_overflow(turn.ctx, turn.compaction)
        self._try_with(turn, await self._rebuild(turn))
        return await self._run_once(turn)

    async def _record_and_deliver(self, turn: _Turn, result: RunResult) -> Outcome:
        """The turn and its reply stored in one transaction, then the reply sent (unless
        it is not to be: see ``_deliverable``), or sent in that transaction (``TurnSend``)."""
        reply = _final(turn, result.text, "reply")
        deliver = _deliverable(turn, result.text)
        if deliver and self.media is not None and self.media.speaks(turn.msg, result.text):
            reply = await self._spoken(turn, reply)
        sent = self.bus.send_with_turn(reply) if deliver else None  # in the turn's write
        await self.ends.finish(turn.record, result, status=result.stop_reason,
                               outbound=self.replies.outbox(reply) if deliver else [], sent=sent)
        self.stats.turns_done += 1
        if deliver and sent is None:
            await self.bus.publish_outbound(reply, stored=True)
        return "final" if deliver else "none"

    async def _spoken(self, turn: _Turn, reply: OutboundMessage) -> OutboundMessage:
        """A voice note answered with a voice note too (``agent.media.speech``)."""
        assert self.media is not None
        voice, calls = await self.media.voice_reply(turn.msg, reply.text, turn.ctx.turn_id)
        if calls and self.ledger is not None:
            await self.ledger.record_calls(turn.ctx.session_id, turn.ctx.turn_id, turn.msg,
                                           calls)
        return replace(reply, media=(voice,)) if voice is not None else reply

    async def _record_failure(self, turn: _Turn,
                              exc: ProviderError | CompactionFailed) -> Outcome:
        """What was done is stored, and the chat hears what went wrong in one line."""
        _log.warning("turn %s: %s: %s", turn.ctx.turn_id, type(exc).__name__, exc)
        self.stats.error(f"{type(exc).__name__}: {exc}")
        text = exc.user_message if isinstance(exc, ProviderError) else \
            ProviderContextTooLarge(str(exc)).user_message
        reply = _final(turn, text, "error")
        quiet = nowhere(turn.msg)
        await self.ends.finish(turn.record, turn.hooks.so_far, status="error", error=str(exc),
                               outbound=[] if quiet else self.replies.outbox(reply))
        if not quiet:
            await self.bus.publish_outbound(reply, stored=True)
        return "none" if quiet else "final"

    async def _context_failed(self, turn: _Turn, exc: Exception) -> None:
        """The context could not be built (a workspace file that cannot be read, a window
        found too small, a bug): classified ``context_build_error``, recorded with the
        user's message (nothing is lost), and told in the chat in one line."""
        _log.exception("turn %s: the context could not be built", turn.ctx.turn_id)
        error = f"context_build_error: {type(exc).__name__}: {exc}"
        self.stats.error(error)
        reply = outbound(turn.msg, "I couldn't prepare this conversation's context "
                         f"({error[:CONTEXT_ERROR_CHARS]}). Your message is saved; the owner "
                         "can see the details in the gateway's log.", "error",
                         turn.ctx.turn_id)
        stored = self.assembly.builder.stored_user_message(turn.msg)
        record = TurnRecord(
            session_id=turn.ctx.session_id, turn_id=turn.ctx.turn_id,
            inbound_id=turn.msg.message_id, started_at=utcnow(), user_message=stored,
            user_tokens=self.assembly.counter.count_message(stored), sources=turn.work.sources,
            index=search_tags(turn.msg))
        quiet = nowhere(turn.msg)
        await self.ends.finish(record, None, status=CONTEXT_BUILD_ERROR, error=error,
                               outbound=[] if quiet else self.replies.outbox(reply))
        if not quiet:
            await self.bus.publish_outbound(reply, stored=True)

    async def _refuse(self, work: Work, verdict: Verdict) -> None:
        """Over a limit: one notice per limit and period, then silence; the messages are
        marked answered either way (a restart does not bring them back)."""
        assert self.limits is not None
        self.stats.limited += 1
        _log.info("%s is over %s (%s): not answered", verdict.person, verdict.limit,
                  verdict.scope)
        if await self.limits.first_notice(verdict):
            await self.replies.answer(work.sources, work.msg, verdict.text, kind="notice")
        else:
            await self.store.finish_inbound(work.sources, [])

    # parts of the steps -------------------------------------------------------------------

    async def _compact_before(self, turn: _Turn) -> bool:
        """Summarise the oldest part before the turn (the chat sees it in progress). When that
        fails the oldest messages are left out of this answer, and the chat is told so."""
        if turn.stream is not None:
            turn.stream.set_status("summarising the earlier conversation")
        if not nowhere(turn.msg):
            await self.bus.publish_outbound(outbound(
                turn.msg, "summarising the earlier conversation", "progress",
                turn.ctx.turn_id, key="compaction-wait"))
        try:
            turn.compaction = await self.background.compact_now(turn.ctx, turn.compaction)
        except CompactionFailed as exc:
            _log.warning("compaction of %s failed: %s", turn.msg.session_key, exc)
            await self.bus.publish_outbound(outbound(
                turn.msg, f"(I couldn't summarise the older messages — {exc} — so the oldest "
                          "are left out of this answer; they stay saved.)", "notice",
                turn.ctx.turn_id, key="compaction"))
            return False
        return True

    async def _rebuild(self, turn: _Turn) -> BuiltContext:
        """The context again, after a compaction."""
        history, _ = await self.assembly.history(turn.ctx.session_id, turn.compaction)
        return self.assembly.build(turn.msg, history, turn.compaction, turn_id=turn.ctx.turn_id,
                                   state=turn.state, audience=turn.ctx.audience)

    def _try_with(self, turn: _Turn, built: BuiltContext) -> None:
        """A fresh try at the model with ``built``: its record and its hooks."""
        turn.built = built
        turn.ctx.notes.loaded = built.loaded
        turn.record = TurnRecord(
            session_id=turn.ctx.session_id, turn_id=turn.ctx.turn_id,
            inbound_id=turn.msg.message_id, started_at=utcnow(),
            user_message=built.user_message, user_tokens=built.user_tokens,
            snapshot=built.snapshot, texts=built.texts, sources=turn.work.sources,
            usage=self.ledger.tags(turn.msg) if self.ledger is not None else None,
            index=search_tags(turn.msg))
        turn.hooks = _Hooks(self, turn)

    async def _run_once(self, turn: _Turn) -> RunResult:
        return await self.runner.run(messages=turn.built.messages, ctx=turn.ctx,
                                     hooks=turn.hooks, budget=self.assembly.budget(turn.built),
                                     encoded=turn.built.encoded)
