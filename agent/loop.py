"""AgentLoop: consumes the bus and hands each message to the part that answers it.

    lanes          agent/lanes.py       one lane per busy session, turns concurrent to a limit
    a turn         agent/turn_flow.py   prepare → build context → tool loop → record → deliver
    compaction     agent/compacting.py  before a turn, after an overflow, on /compact
    commands       agent/commands.py    /help, /status, /new, /usage, /model, ... answered
                                        without the model
    usage, limits  agent/usage.py, agent/limits.py   the ledger's tallies; caps before a turn
    models         agent/model_choice.py            /model per conversation, chat defaults

``/help``, ``/start``, ``/status`` and ``/stop`` bypass the lanes and are answered at once,
even while the session is busy; everything else waits its turn in its session's lane.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from agent.assembly import ContextAssembly
from agent.budget import WINDOW_KEY, TokenCounter
from agent.commands import IMMEDIATE, CommandInfo, parse_command, refused, run_command
from agent.compacting import SessionCompaction
from agent.compacting_background import BackgroundCompaction
from agent.compaction import Compactor
from agent.context import BUILTIN_SKILLS, ContextBuilder
from agent.errors import AgentError
from agent.lanes import Lane, Lanes
from agent.limits import Limits
from agent.media import MediaStep
from agent.model_choice import ModelChoice
from agent.provider import Provider
from agent.queueing import Work
from agent.replies import Replies
from agent.runner import Runner
from agent.sessions import SessionRecorder
from agent.tools.base import ToolRegistry
from agent.turn import TurnServices
from agent.turn_flow import TurnFlow, TurnStats, stage
from agent.usage import Ledger
from gateway.kernel.bus import MessageBus
from gateway.kernel.clock import Clock, SystemClock
from gateway.kernel.config import Config, ConfigError
from gateway.kernel.events import ChatActivity, InboundMessage
from gateway.kernel.store import Store
from gateway.kernel.store_db import MessageTakenOver
from gateway.kernel.tasks import TaskSet
from gateway.kernel.values import ChannelHints

_log = logging.getLogger(__name__)

FEW_MESSAGES = 200
"""A ``max_recent_messages`` below this (an old config's 50) still caps what a turn reads,
and so compacts by count: said once at start."""


class AgentLoop:
    def __init__(self, *, config: Config, bus: MessageBus, store: Store, provider: Provider,
                 registry: ToolRegistry, hints: Callable[[str], ChannelHints],
                 services: Callable[[InboundMessage], TurnServices] | None = None,
                 clock: Clock | None = None) -> None:
        """``services`` builds what tools may use beyond the workspace for one turn;
        ``clock`` is what the ledger's days and the limits' periods are read from."""
        self.config = config
        self.bus = bus
        self.store = store
        self.provider = provider
        self.registry = registry
        self.counter = TokenCounter(config.agent.model)
        self.ledger = Ledger(store=store, clock=clock or SystemClock(),
                             timezone=config.agent.timezone, config=config.agent.usage)
        self.limits = Limits(config.agent.limits, self.ledger, store)
        self.models = ModelChoice(config.agent, store)
        self.recorder = SessionRecorder(store, self.counter, self.ledger)
        self.replies = Replies(store, bus)
        self.stats = TurnStats()
        self.media = MediaStep(config.agent, provider, self.ledger.prices,
                               workspace=config.workspace_path)
        self.assembly = ContextAssembly(config=config, store=store, provider=provider,
                                        registry=registry, counter=self.counter, hints=hints,
                                        models=self.models)
        self.compaction = SessionCompaction(
            config=config, store=store, provider=provider, registry=registry,
            assembly=self.assembly, compactor=Compactor(provider, store, self.counter,
                                                        config.agent.context.compaction),
            ledger=self.ledger)
        self._tasks = TaskSet()
        self.background = BackgroundCompaction(self.compaction, store, self._tasks,
                                               config.agent.context.max_recent_messages)
        self.turns = TurnFlow(
            config=config, bus=bus, store=store, recorder=self.recorder,
            runner=Runner(provider, registry, max_iterations=config.agent.max_iterations,
                          max_result_chars=config.agent.tools.max_result_chars),
            assembly=self.assembly, compaction=self.compaction, replies=self.replies,
            stats=self.stats, services=self._with_search(services),
            ledger=self.ledger, limits=self.limits, models=self.models, media=self.media,
            background=self.background)
        self.lanes = Lanes(config=config.agent, tasks=self._tasks, handle=self.handle,
                           on_queued=lambda msg: stage(bus, [msg], "queued"))
        self._dispatcher: asyncio.Task[None] | None = None
        workspace = config.workspace_path / "skills"
        skills = config.agent.skills
        self._skill_folders = tuple(
            f for f in (BUILTIN_SKILLS, *skills.folders,
                        *([skills.user_folder] if skills.user_folder else []))
            if f != workspace)
        self.window: dict[str, Any] | None = None
        """How the window is shared out (``WindowPlan.describe``), for ``parley status``."""

    def _with_search(self, services: Callable[[InboundMessage], TurnServices] | None
                     ) -> Callable[[InboundMessage], TurnServices]:
        """The gateway's services for a turn, with the search over stored conversations."""
        base = services or (lambda msg: TurnServices())

        def make(msg: InboundMessage) -> TurnServices:
            made = base(msg)
            made.search = self.store.search_messages
            made.skill_folders = self._skill_folders
            return made

        return make

    @property
    def context(self) -> ContextBuilder:
        """Built on first use: asking litellm for the model's window imports litellm."""
        return self.assembly.builder

    # lifecycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        self._check_window()
        await self.models.load()
        await self.ledger.load()  # the totals the health endpoint shows
        self._dispatcher = asyncio.create_task(self._dispatch(), name="agent-dispatch")

    def _check_window(self) -> None:
        """A window too small for the fixed part of a request is refused at start, naming
        the key. Checked here when the window is known without importing litellm (set, or
        in its bundled model map); otherwise at the first turn."""
        context = self.config.agent.context
        if "max_recent_messages" in context.model_fields_set and \
                context.max_recent_messages < FEW_MESSAGES:
            _log.warning("agent.context.max_recent_messages: %d compacts a session every %d "
                         "turns or so whatever their size; compaction follows tokens now "
                         "(agent.context.compaction.compact_at_share): remove the key, or "
                         "raise it", context.max_recent_messages,
                         max(context.max_recent_messages // 4, 1))
        if context.max_context_tokens is None and self.provider.needs_litellm:
            return
        plan = self.assembly.plan()
        self.window = plan.describe()
        problem = plan.problem()
        if problem is not None:
            raise ConfigError(str(self.config.source or "config"), [(WINDOW_KEY, problem)])

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
        await self.media.aclose()

    # what the gateway's status shows --------------------------------------------------------

    @property
    def busy_sessions(self) -> int:
        return len(self.lanes)

    def is_busy(self, session_key: str) -> bool:
        """A turn of this session is running or waiting (the heartbeat skips a busy chat)."""
        return session_key in self.lanes

    @property
    def queued(self) -> int:
        return self.lanes.queued

    @property
    def turns_done(self) -> int:
        return self.stats.turns_done

    @property
    def recent_errors(self) -> list[str]:
        return self.stats.recent_errors

    # dispatch -----------------------------------------------------------------------------

    async def _dispatch(self) -> None:
        while True:
            msg = await self.bus.consume_inbound()
            try:
                self.submit(msg)
            except Exception:
                _log.exception("could not dispatch message %s", msg.message_id)

    def submit(self, msg: InboundMessage) -> None:
        command = parse_command(msg.text)[0] if msg.is_command else None
        if command is not None and (why := refused(msg)) is not None:
            self._tasks.spawn(self._answer(msg, why), f"command:{msg.session_key}")
        elif command in IMMEDIATE:
            self._tasks.spawn(self._command(msg), f"command:{msg.session_key}")
        elif command == "stop":
            self._tasks.spawn(self._stop(msg), f"stop:{msg.session_key}")
        else:
            self.lanes.add(msg)

    async def handle(self, work: Work, lane: Lane | None = None) -> None:
        """Process one piece of work; every failure becomes a message in the chat, not a
        traceback."""
        msg = work.msg
        if msg.context_only:
            await self.turns.keep_as_context(work)
            return
        self.bus.activity(ChatActivity(channel=msg.channel, chat_id=msg.chat_id,
                                       thread_id=msg.thread_id))
        try:
            if msg.is_command and parse_command(msg.text)[0] == "compact":
                await self._answer(msg, await self.compaction.command(msg))
            elif msg.is_command:
                await self._command(msg)
            else:
                await self.turns.run(work, lane)
        except asyncio.CancelledError:
            raise
        except MessageTakenOver:  # several processes: this one was given up for dead
            _log.warning("turn for %s not stored: another process took its message over and "
                         "answers it", msg.session_key)
        except Exception as exc:
            _log.exception("turn for %s failed", msg.session_key)
            self.stats.error(f"{type(exc).__name__}: {exc}")
            await self.replies.answer(work.sources, msg, AgentError.user_message, kind="error")
        finally:
            self.bus.activity(ChatActivity(channel=msg.channel, chat_id=msg.chat_id,
                                           thread_id=msg.thread_id, busy=False))

    # commands -----------------------------------------------------------------------------

    async def _command(self, msg: InboundMessage) -> None:
        allowed = self.assembly.audience(msg).tools
        info = CommandInfo(model=self.models.model_name(self.models.alias(msg)),
                           tools=[n for n in self.registry.names if allowed.allows(n)],
                           queued=self.lanes.waiting(msg.session_key), models=self.models,
                           ledger=self.ledger)
        try:
            text = await run_command(msg, self.store, info)
        except Exception:
            _log.exception("command %r failed", msg.text)
            text = AgentError.user_message
        await self._answer(msg, text)

    async def _stop(self, msg: InboundMessage) -> None:
        """``/stop``: bypasses the queue and cancels the running turn at once."""
        await self._answer(msg, await self.lanes.stop(msg.session_key))

    async def _answer(self, msg: InboundMessage, text: str) -> None:
        await self.replies.answer([msg], msg, text, kind="notice")
