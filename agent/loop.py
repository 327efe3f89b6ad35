"""AgentLoop: consumes the bus, one lane per session, turns concurrent up to a limit.

A session's messages run in arrival order in its lane; a message that arrives while its
session is busy waits there and is never dropped. Lanes exist only while they have work, so
idle sessions cost nothing in memory (they live in SQLite).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from agent.budget import TokenCounter
from agent.commands import IMMEDIATE, CommandInfo, parse_command, run_command
from agent.context import ContextBuilder
from agent.errors import AgentError, ProviderError
from agent.provider import Provider, context_window
from agent.runner import Runner
from agent.sessions import SessionRecorder, TurnRecord
from agent.tools.base import ToolRegistry
from agent.turn import TurnContext
from channels.base import ChannelHints
from gateway.bus import MessageBus
from gateway.config import Config
from gateway.events import (
    CONTEXT_ONLY,
    ChatActivity,
    InboundMessage,
    OutboundKind,
    OutboundMessage,
    new_id,
    utcnow,
)
from gateway.store import Store

_log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Lane:
    queue: deque[InboundMessage] = field(default_factory=deque)
    task: asyncio.Task[None] | None = None


class AgentLoop:
    def __init__(self, *, config: Config, bus: MessageBus, store: Store, provider: Provider,
                 registry: ToolRegistry, hints: Callable[[str], ChannelHints]) -> None:
        self.config = config
        self.bus = bus
        self.store = store
        self.provider = provider
        self.registry = registry
        self.hints = hints
        self.counter = TokenCounter(config.agent.model)
        self._context: ContextBuilder | None = None
        self.recorder = SessionRecorder(store, self.counter)
        self.runner = Runner(provider, registry, max_iterations=config.agent.max_iterations,
                             max_result_chars=config.agent.tools.max_result_chars)
        self._limit = asyncio.Semaphore(config.agent.max_concurrent_turns)
        self._lanes: dict[str, _Lane] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._dispatcher: asyncio.Task[None] | None = None
        self.turns_done = 0
        self._tools_tokens_cache: int | None = None

    @property
    def context(self) -> ContextBuilder:
        """Built on first use: asking litellm for the model's window imports litellm."""
        if self._context is None:
            window = None
            if self.config.agent.context.max_context_tokens is None:
                window = context_window(self.config.agent.model)
            self._context = ContextBuilder(self.config, self.counter, window=window)
        return self._context

    # lifecycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        self._dispatcher = asyncio.create_task(self._dispatch(), name="agent-dispatch")

    async def stop(self, grace: float = 10.0) -> None:
        """Stop taking messages, give running turns ``grace`` seconds, then cancel them."""
        if self._dispatcher is not None:
            self._dispatcher.cancel()
            await asyncio.gather(self._dispatcher, return_exceptions=True)
            self._dispatcher = None
        for msg in self.bus.drain_inbound():  # taken before intake closed: still answered
            self.submit(msg)
        pending = set(self._tasks)
        if pending:
            _, still = await asyncio.wait(pending, timeout=grace)
            for task in still:
                task.cancel()
            await asyncio.gather(*still, return_exceptions=True)

    @property
    def busy_sessions(self) -> int:
        return len(self._lanes)

    def _spawn(self, coro: object, name: str) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.create_task(coro, name=name)  # type: ignore[arg-type]
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _dispatch(self) -> None:
        while True:
            msg = await self.bus.consume_inbound()
            try:
                self.submit(msg)
            except Exception:
                _log.exception("could not dispatch message %s", msg.message_id)

    def submit(self, msg: InboundMessage) -> None:
        if msg.is_command and parse_command(msg.text)[0] in IMMEDIATE:
            self._spawn(self._command(msg), f"command:{msg.session_key}")
            return
        key = msg.session_key
        lane = self._lanes.get(key)
        if lane is None:
            lane = self._lanes[key] = _Lane()
        lane.queue.append(msg)
        if lane.task is None:
            lane.task = self._spawn(self._drain(key, lane), f"lane:{key}")

    async def _drain(self, key: str, lane: _Lane) -> None:
        try:
            while lane.queue:
                msg = lane.queue[0]
                async with self._limit:
                    await self.handle(msg)
                lane.queue.popleft()
        finally:
            if self._lanes.get(key) is lane:
                del self._lanes[key]

    # one message --------------------------------------------------------------------------

    async def handle(self, msg: InboundMessage) -> None:
        """Process one message; every failure becomes a message in the chat, not a traceback."""
        if msg.metadata.get(CONTEXT_ONLY):
            await self._keep_as_context(msg)
            return
        activity = ChatActivity(channel=msg.channel, chat_id=msg.chat_id, thread_id=msg.thread_id)
        self.bus.activity(activity)
        try:
            if msg.is_command:
                await self._command(msg)
            else:
                await self._turn(msg)
        except asyncio.CancelledError:
            raise
        except Exception:
            _log.exception("turn for %s failed", msg.session_key)
            await self._reply(msg, AgentError.user_message, kind="error")
        finally:
            self.bus.activity(ChatActivity(channel=msg.channel, chat_id=msg.chat_id,
                                           thread_id=msg.thread_id, busy=False))

    async def _keep_as_context(self, msg: InboundMessage) -> None:
        """A group message not addressed to us: part of the history, no turn, no reply."""
        session = await self.store.active_session(msg.session_key)
        body = self.context.stored_user_message(msg)
        await self.recorder.finish(
            TurnRecord(session_id=session.id, turn_id=new_id(), inbound_id=msg.message_id,
                       started_at=utcnow(), user_message=body,
                       user_tokens=self.counter.count_message(body)),
            None, status="context")

    async def _command(self, msg: InboundMessage) -> None:
        info = CommandInfo(model=self.config.agent.model, tools=self.registry.names)
        try:
            text = await run_command(msg, self.store, info)
        except Exception:
            _log.exception("command %r failed", msg.text)
            text = AgentError.user_message
        await self._reply(msg, text, kind="notice")

    async def _turn(self, msg: InboundMessage) -> None:
        session = await self.store.active_session(msg.session_key)
        ctx = TurnContext(
            session_key=msg.session_key, session_id=session.id, channel=msg.channel,
            chat_id=msg.chat_id, sender_id=msg.sender_id, sender_name=msg.sender_name,
            chat_type=msg.chat_type, thread_id=msg.thread_id, message_id=msg.message_id,
            kind=msg.kind, workspace=self.config.workspace_path, received_at=msg.received_at,
            tools=self.config.agent.tools)
        history = await self.store.recent_messages(
            session.id, self.config.agent.context.max_recent_messages)
        built = self.context.build(
            inbound=msg, history=history, hints=self.hints(msg.channel),
            tools_tokens=self._tools_tokens(), session_key=msg.session_key,
            turn_id=ctx.turn_id)
        record = TurnRecord(session_id=session.id, turn_id=ctx.turn_id,
                            inbound_id=msg.message_id, started_at=utcnow(),
                            user_message=built.user_message, user_tokens=built.user_tokens,
                            snapshot=built.snapshot)
        async def progress(text: str) -> None:
            await self._reply(msg, text, kind="progress", turn_id=ctx.turn_id, key=new_id())

        try:
            result = await self.runner.run(built.messages, ctx, progress)
        except ProviderError as exc:
            _log.warning("turn %s: %s: %s", ctx.turn_id, type(exc).__name__, exc)
            await self.recorder.finish(record, None, status="error", error=str(exc))
            await self._reply(msg, exc.user_message, kind="error", turn_id=ctx.turn_id)
            return
        except asyncio.CancelledError:
            await asyncio.shield(self.recorder.finish(record, None, status="cancelled"))
            raise
        await self.recorder.finish(record, result, status=result.stop_reason)
        self.turns_done += 1
        await self._reply(msg, result.text, kind="reply", turn_id=ctx.turn_id)

    def _tools_tokens(self) -> int:
        if self._tools_tokens_cache is None:
            self._tools_tokens_cache = self.counter.count_tools(self.registry.schemas())
        return self._tools_tokens_cache

    async def _reply(self, msg: InboundMessage, text: str, *, kind: OutboundKind,
                     turn_id: str | None = None, key: str | None = None) -> None:
        channel, chat_id = msg.deliver_to or (msg.channel, msg.chat_id)
        await self.bus.publish_outbound(OutboundMessage(
            channel=channel, chat_id=chat_id, text=text, kind=kind,
            reply_to=msg.message_id if msg.deliver_to is None else None,
            thread_id=msg.thread_id if msg.deliver_to is None else None,
            turn_id=turn_id, idempotency_key=f"{turn_id or new_id()}:{kind}:{key or ''}"))
