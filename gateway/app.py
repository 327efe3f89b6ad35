"""Gateway: builds every part from the config, starts them in order, stops them in reverse.

Stop order: intake closes (channels answer "shutting down") → queued inbound messages are
dispatched → running turns finish within the grace period or are cancelled → cron and
heartbeat stop → outbound messages are flushed → channels stop → the database closes last.
``stop()`` is idempotent.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import time
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from agent.loop import AgentLoop
from agent.provider import Provider, warm_up
from agent.subagent import SubagentManager
from agent.tools import build_registry
from agent.tools.exec_access import ExecAccess, GatewayFiles, resolve_exec_access
from agent.turn import TurnServices
from channels.base import Channel, ChannelDeps, ChannelStatus
from gateway.cron import CronScheduler
from gateway.delivery import ChannelManager, ChannelStats
from gateway.heartbeat import Heartbeat
from gateway.inbox_cleanup import InboxCleanup
from gateway.kernel.bus import MessageBus
from gateway.kernel.channel_registry import installed, load
from gateway.kernel.clock import Clock, SystemClock
from gateway.kernel.config import Config
from gateway.kernel.config_channels import section_of
from gateway.kernel.cron_jobs import CRON_CHANNEL, CronJobs
from gateway.kernel.events import InboundMessage
from gateway.kernel.heartbeat_ack import HEARTBEAT_CHANNEL
from gateway.kernel.secrets import register_secrets
from gateway.kernel.store import Store
from gateway.kernel.tasks import TaskSet
from gateway.retention import Retention
from gateway.streaming import channel_streaming
from workspace.bootstrap import seed_workspace

if TYPE_CHECKING:
    from agent.mcp import MCPManager
    from gateway.cluster import ClusterWorker

_log = logging.getLogger(__name__)


class Gateway:
    def __init__(self, config: Config, *, configured_channels: bool = True,
                 channels: list[Channel] | None = None, grace: float | None = None,
                 clock: Clock | None = None,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        """``configured_channels=False`` starts none of the config's channels (``parley chat``
        must not poll a bot a running gateway already polls), nor cron and heartbeat;
        ``channels`` adds adapters; ``clock`` is what schedules run on and ``monotonic``
        what the channels' watchdogs and health do (tests move them)."""
        self.config = config
        register_secrets(config)
        self.grace = config.agent.shutdown_grace if grace is None else grace
        self._configured = configured_channels
        self._extra = list(channels or [])
        self.bus = MessageBus()
        self.manager = ChannelManager(self.bus, config.channels.delivery)
        self.store: Store | None = None
        self.agent: AgentLoop | None = None
        self.cluster_worker: ClusterWorker | None = None
        self.provider = Provider(config.agent)
        self.local: Any = None
        self._started_at: float | None = None
        self._state = "new"
        self._stopped = asyncio.Event()
        self._warm_up: asyncio.Task[None] | None = None
        self._dead_before = 0
        self.clock: Clock = clock or SystemClock()
        self.manager.streams.clock = self.clock  # live replies: throttled on this clock
        self.manager.clock = self.clock  # and a failed send's retry waits on it
        self.manager.streams.settings = partial(channel_streaming, config)
        self.monotonic = monotonic
        self.cron: CronScheduler | None = None
        self.cron_jobs: CronJobs | None = None
        """The jobs table for the agent's cron tool: in every process, whichever runs the
        scheduler (on PostgreSQL one process does; a job added elsewhere wakes it)."""
        self._notes = TaskSet()
        self.heartbeat: Heartbeat | None = None
        self.mcp: MCPManager | None = None
        self.subagents: SubagentManager | None = None
        self.exec_access: ExecAccess | None = None
        self.inbox_cleanup: InboxCleanup | None = None
        self.retention: Retention | None = None  # issue 24: the database's retention

    @property
    def state(self) -> str:
        return self._state

    def prepare_workspace(self) -> None:
        workspace = self.config.workspace_path
        if not workspace.exists():
            written = seed_workspace(workspace)
            _log.info("created workspace %s with %d template file(s)", workspace, len(written))

    async def start(self) -> None:
        if self._state != "new":
            raise RuntimeError(f"gateway already {self._state}")
        self._state = "starting"
        self._started_at = time.monotonic()
        # Trying the sandbox runs a command (tens of ms): alongside opening the database.
        exec_probe = asyncio.create_task(self._resolve_exec(), name="exec-sandbox-probe")
        try:
            self.prepare_workspace()
            self.config.data_path.mkdir(parents=True, exist_ok=True)  # media, on PostgreSQL too
            self.store = await Store.open(self.config.store_target)
            self.bus.attach_store(self.store, self.config.channels.delivery.ttl)
            self._dead_before = (await self.store.outbox_counts())["dead"]
            for channel in self._configured_channel_list():
                self.manager.add(channel)
            for channel in self._extra:
                self.manager.add(channel)
            self.exec_access = await exec_probe
            if self._configured and self.config.cron.enabled:
                self.cron_jobs = CronJobs(self.store, clock=self.clock,
                                          timezone=self.config.cron_timezone,
                                          min_interval=self.config.cron.min_interval,
                                          on_change=self._cron_changed)
                await self.cron_jobs.ensure()
            self.agent = AgentLoop(config=self.config, bus=self.bus, store=self.store,
                                   provider=self.provider,
                                   registry=build_registry(
                                       self.config.agent.tools, memory=self.config.agent.memory,
                                       timezone=self.config.agent.timezone,
                                       exec_access=self.exec_access),
                                   hints=self.manager.hints, services=self._services,
                                   clock=self.clock)
            await self._start_agent_tools(self.store, self.agent)
            # Unanswered messages from the last run go first, ahead of anything new.
            system = [CRON_CHANNEL, HEARTBEAT_CHANNEL] if self._configured else []
            mine = [*self.manager.channels, *system]
            if not self.store.claims_inbound:
                await self.agent.recover(mine)
            else:  # several processes on PostgreSQL: this one takes its share
                from gateway.cluster import cluster_worker  # psycopg only where it is used

                self.cluster_worker = cluster_worker(self.store, self.bus, self.manager,
                                                     lease=self.config.cluster.lease,
                                                     channels=mine)
            await self.manager.start_channels()
            await self.manager.start(self.store, resend=not self.store.claims_inbound)
            await self.agent.start()
            if self.cluster_worker is not None:
                await self.cluster_worker.start()
            if self.cluster_worker is None:
                await self._start_schedules(self.store, self.agent)
            else:  # one process runs them: whichever holds their leader lease
                store, agent = self.store, self.agent
                self.cluster_worker.leaders["schedules"] = \
                    lambda: self._start_schedules(store, agent)
                # given up when this process may have lost the lease: never two runners
                self.cluster_worker.yielders["schedules"] = self._give_up_schedules
                await self.cluster_worker.try_lead()
            if self.provider.needs_litellm:
                # litellm takes seconds to import: load it while the gateway already serves.
                self._warm_up = asyncio.create_task(asyncio.to_thread(self._warm_up_model),
                                                    name="llm-warm-up")
        except BaseException:
            self._state = "failed"
            exec_probe.cancel()
            await asyncio.gather(exec_probe, return_exceptions=True)
            await self._teardown()
            raise
        self._state = "running"
        _log.info("gateway running: model %s, channels %s, workspace %s",
                  self.config.agent.model, ", ".join(self.manager.channels) or "none",
                  self.config.workspace_path)

    def _warm_up_model(self) -> None:
        """(In a thread.) litellm imported, then whether the model has the key it needs:
        health says so from then on, without importing anything itself."""
        warm_up()
        self.provider.health.config_problem = self.provider.configuration_problem()

    async def _resolve_exec(self) -> ExecAccess:
        """Whether ``exec`` runs sandboxed, unsandboxed or not at all; said once, loudly when
        it is not sandboxed."""
        access = await resolve_exec_access(self.config.agent.tools.exec,
                                           GatewayFiles.of(self.config))
        quiet = access.state in ("sandboxed", "disabled")
        _log.log(logging.INFO if quiet else logging.WARNING, "exec: %s", access.describe())
        return access

    async def _start_schedules(self, store: Store, agent: AgentLoop) -> None:
        """Cron and heartbeat run in the gateway only (``parley chat`` would double them)."""
        if not self._configured:
            return
        config = self.config
        if self.cron_jobs is not None:
            self.cron = CronScheduler(self.cron_jobs, self.bus, clock=self.clock,
                                      grace=config.cron.missed_grace,
                                      poll_interval=config.cron.poll_interval)
            if self.cluster_worker is not None:  # a job added by another process
                self.cluster_worker.cron_watchers = [self.cron.wake]
            await self.cron.start()
        if config.heartbeat.enabled:
            self.heartbeat = Heartbeat(config.heartbeat, self.bus,
                                       workspace=config.workspace_path,
                                       timezone=config.cron_timezone, clock=self.clock,
                                       busy=agent.is_busy)
            await self.heartbeat.start()
        self.inbox_cleanup = InboxCleanup(config.agent.media.inbox, store,
                                          workspace=config.workspace_path)
        await self.inbox_cleanup.start()
        self.retention = Retention(config.retention, store)
        await self.retention.start()

    async def _stop_schedules(self) -> None:
        for schedule in (self.heartbeat, self.cron, self.inbox_cleanup, self.retention):
            if schedule is not None:
                await schedule.stop()

    def _cron_changed(self) -> None:
        """A job was added, removed or asked to run here: the scheduler wakes, in this process
        or (on PostgreSQL) in whichever runs it."""
        if self.cron is not None:
            self.cron.wake()
        elif self.cluster_worker is not None:
            self._notes.spawn(self.cluster_worker.cluster.notify_cron(), "cron-changed")

    async def _give_up_schedules(self) -> None:
        await self._stop_schedules()  # started anew when this process leads them again
        self.heartbeat = self.cron = self.inbox_cleanup = self.retention = None
        if self.cluster_worker is not None:
            self.cluster_worker.cron_watchers = []

    async def _start_agent_tools(self, store: Store, agent: AgentLoop) -> None:
        """MCP servers (their tools join the registry as they connect) and subagents."""
        if any(s.enabled for s in self.config.agent.mcp.servers):
            from agent.mcp import MCPManager

            self.mcp = MCPManager(self.config.agent.mcp, log_dir=self.config.data_path / "mcp")
            await self.mcp.start()
            self.mcp.attach(agent.registry)
        if self.config.agent.tools.spawn.enabled:
            self.subagents = SubagentManager(config=self.config, provider=self.provider,
                                             registry=agent.registry, bus=self.bus, store=store,
                                             ledger=agent.ledger)

    def _services(self, msg: InboundMessage) -> TurnServices:
        """What one turn's tools may use: delivery now (message tool), the jobs (cron) and
        subagents (spawn)."""
        return TurnServices(send=self.manager.deliver_now,
                            cron=self.cron_jobs,
                            spawn=self.subagents.spawn if self.subagents is not None else None)

    def _configured_channel_list(self) -> list[Channel]:
        """One adapter per enabled ``channels.<name>`` section, built by the installed channel
        class of that name (``parley.channels`` entry points)."""
        if not self._configured or self.store is None:
            return []
        deps = ChannelDeps(config=self.config, bus=self.bus, store=self.store,
                           data_path=self.config.data_path, health=self.health,
                           monotonic=self.monotonic)
        out: list[Channel] = []
        for name, cls in enabled_channel_classes(self.config).items():
            channel = cls.from_deps(deps)
            if name == "local":
                self.local = channel
            out.append(channel)
        return out

    async def stop(self) -> None:
        if self._state in ("stopping", "stopped", "new"):
            if self._state == "stopping":
                await self._stopped.wait()
            return
        self._state = "stopping"
        try:
            await self._teardown()
        finally:
            self._state = "stopped"
            self._stopped.set()

    async def _teardown(self) -> None:
        self.bus.close()
        if self.cluster_worker is not None:  # takes no more work (nor the schedules) first
            await self.cluster_worker.stop_claiming()
        if self.agent is not None:
            await self.agent.stop(self.grace)
        if self.subagents is not None:  # background ones; their results are not delivered
            await self.subagents.stop()
        if self.mcp is not None:  # after the turns: a stdio server's process ends here
            await self.mcp.stop()
        await self._stop_schedules()
        await self._notes.finish(1.0)
        await self.manager.stop(within=max(self.grace, 0.5))
        # the channels close their connections before the worker hands back its leases (a
        # Discord websocket, a Telegram poller): the next holder never overlaps this one
        await self.manager.stop_channels()
        if self.cluster_worker is not None:  # after the turns and deliveries it fed
            await self.cluster_worker.stop()
            self.cluster_worker = None
        if self._warm_up is not None:  # a thread cannot be cancelled: let the import finish
            await asyncio.gather(self._warm_up, return_exceptions=True)
        try:
            await self.provider.aclose()
        except Exception:  # never let this keep the database open
            _log.exception("closing the model client failed")
        if self.store is not None:
            await self.store.close()

    async def __aenter__(self) -> Gateway:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def health(self) -> dict[str, Any]:
        """What ``GET /v1/health`` and ``parley status`` show; cheap (two ``stat`` calls, no
        database or network I/O). ``status`` is ``ok`` only while nothing is in ``reasons``."""
        uptime = time.monotonic() - self._started_at if self._started_at else 0.0
        channels: dict[str, Any] = {}
        for name, channel in self.manager.channels.items():
            status = channel.status()
            stats = self.manager.stats[name]
            last_in = self.bus.last_inbound.get(name)
            state, reason = channel_state(status, stats, self.manager.down.get(name))
            channels[name] = {
                "last_inbound": last_in.isoformat() if last_in else None,
                "last_send_ok": stats.last_send_ok.isoformat() if stats.last_send_ok else None,
                "sent": stats.sent, "outbox_pending": self.manager.pending(name),
                "dead_letters": stats.dead, "recent_errors": list(stats.recent_errors),
                **status.detail,
                "running": status.running and state != "down",
                "state": state, "reason": reason,
            }
        agent = self.agent
        reasons = [*self._problems(), *(
            f"channel {name}: {c['state']}" + (f": {c['reason']}" if c["reason"] else "")
            for name, c in channels.items() if c["state"] != "connected")]
        cluster = self.cluster_worker.health() if self.cluster_worker else None
        if cluster is not None and cluster.get("problem"):
            reasons.append(f"cluster: {cluster['problem']}")
        return {
            "status": "degraded" if reasons else "ok",
            "reasons": reasons,
            "gateway": self._state,
            "uptime_s": round(uptime, 1),
            "model": self.config.agent.model,
            "channels": channels,
            **({"cluster": cluster} if cluster is not None else {}),
            "busy_sessions": agent.busy_sessions if agent else 0,
            "queued_messages": agent.queued if agent else 0,
            "inbound_queue": self.bus.inbound_size,
            "turns_done": agent.turns_done if agent else 0,
            "usage": agent.ledger.totals() if agent else None,
            "limited_messages": agent.stats.limited if agent else 0,
            "delivered": self.manager.delivered,
            "outbox_pending": self.manager.pending(),
            "dead_letters": self._dead_before + self.manager.failed,
            "recent_errors": agent.recent_errors if agent else [],
            "mcp": self.mcp.status() if self.mcp is not None else {},
            "exec": self.exec_access.describe() if self.exec_access is not None else None,
            "context_window": agent.window if agent else None,
        }

    def _problems(self) -> list[str]:
        """What keeps the gateway from doing its job, besides its channels: the database or
        the data folder gone or unwritable, the model without its key or failing."""
        problems = []
        store = self.store
        if store is not None and (found := store.check_file() or store.problem):
            problems.append(f"storage: {found}")
        data = self.config.data_path
        if self._state == "running" and not os.access(data, os.W_OK | os.X_OK):
            problems.append(f"storage: the data folder {data} is gone or not writable; "
                            "messages and files cannot be kept")
        if (model := self.provider.health.problem()) is not None:
            problems.append(f"model: {model}")
        return problems

    async def run_until_signalled(self, stop_event: asyncio.Event | None = None) -> None:
        """Run until SIGINT/SIGTERM (or ``stop_event``), then stop cleanly."""
        stop_event = stop_event or asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop_event.set)
        try:
            await self.start()
            settle_gc()
            await stop_event.wait()
            _log.info("stopping gateway")
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
            await self.stop()


GC_THRESHOLD = (10_000, 10, 10)
"""The collector's generation thresholds in a running gateway (Python's: 700, 10, 10). A turn
leaves no cycle behind (``tests/e2e/test_gateway.py``), so what the collector examines are the
live objects of the turns in flight, again and again: at 100 chats it took ~2.7 % of the
gateway's CPU with Python's thresholds, ~0.3 % with these and start-up frozen, and the memory
an idle session costs is the same (bench/RESULTS.md, round seven)."""


def settle_gc() -> None:
    """Once started: what start-up built (modules, config, channels: ~100k objects) is moved
    out of the collector's sight (``gc.freeze``: never examined again, so a full collection
    looks only at what the gateway made since), and the young generation collected less often
    (``GC_THRESHOLD``). Only ``parley gateway`` does this, not an embedding program."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLD)


def enabled_channel_classes(config: Config) -> dict[str, Any]:
    """The installed channel classes whose ``channels.<name>`` section is enabled (only those
    are imported); ``terminal`` is ``parley chat``'s, not an installed channel."""
    out: dict[str, Any] = {}
    for name, entry in installed().items():
        section = section_of(config.channels, name)
        if section is not None and getattr(section, "enabled", False):
            out[name] = load(name, entry)
    return out


def channel_state(status: ChannelStatus, stats: ChannelStats,
                  down: str | None) -> tuple[str, str | None]:
    """A channel's state and its reason, from what completed: a start that failed (the
    manager's ``down``), the channel's own receive-side view, then the sends."""
    if down is not None:
        return "down", down
    if status.state is not None:
        state, reason = status.state, status.reason
    elif not status.running:
        state, reason = "down", status.reason or "not running"
    elif status.detail.get("degraded"):
        state, reason = "degraded", status.reason
    else:
        state, reason = "connected", None
    failing = bool(stats.recent_errors) and (stats.last_send_ok is None or
                                             stats.failed_tries > stats.sent)
    if state == "connected" and failing:
        state, reason = "degraded", f"sends failing: {stats.recent_errors[-1]}"
    return state, reason
