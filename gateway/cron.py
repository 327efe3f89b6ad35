"""Cron: scheduled jobs in the database, and the scheduler that runs them on an injected clock.

A ``reminder`` delivers its text exactly as written, with no model call, through the outbox.
A ``task`` is an inbound message on the system channel ``cron`` (session ``cron:<job_id>``,
never the user's conversation) whose answer the agent sends to the job's target. Each run is
recorded once in ``cron_runs``; its delivery lives in the outbox (retried with backoff, then
dead-lettered), so a failed delivery is retried without running the job again.

A run missed while the gateway was down runs once at start when it is at most
``cron.missed_grace`` late; otherwise it is recorded as missed. Several missed runs of one job
never run as a burst: only the latest may run. ``parley cron`` (another process) writes the same
tables; the scheduler looks for its changes every ``cron.poll_interval``.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime, timedelta

from gateway.kernel.bus import BusClosed, MessageBus, NotStored
from gateway.kernel.clock import Clock, sleep_or_wake
from gateway.kernel.cron_jobs import (
    CRON_CHANNEL,
    CronJob,
    CronJobs,
    Run,
    reminder_key,
    task_key_prefix,
    task_message_id,
    ts,
)
from gateway.kernel.events import InboundMessage, OutboundMessage

_log = logging.getLogger(__name__)

RETRY_AFTER_ERROR = timedelta(seconds=30)


class CronScheduler:
    """Runs due jobs; sleeps until the next one, a change, or the next poll."""

    def __init__(self, jobs: CronJobs, bus: MessageBus, *, clock: Clock, grace: float,
                 poll_interval: float) -> None:
        self.jobs = jobs
        self.bus = bus
        self.clock = clock
        self.grace = timedelta(seconds=grace)
        self.poll = timedelta(seconds=poll_interval)
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._failed = False
        if jobs.on_change is None:  # else its owner's hook wakes this (the gateway's does)
            jobs.on_change = self.wake

    async def start(self) -> None:
        await self.jobs.ensure()
        self._task = asyncio.create_task(self._run(), name="cron-scheduler")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    def wake(self) -> None:
        self._wake.set()

    async def _run(self) -> None:
        while True:
            self._wake.clear()
            now = self.clock.now()
            self._failed = False
            try:
                await self.run_due(now)
                upcoming = await self.jobs.next_due()
            except BusClosed:
                return  # the gateway is stopping; what is due runs after the next start
            except Exception:
                _log.exception("cron: could not run due jobs")
                upcoming, self._failed = None, True
            until = now + self.poll
            if upcoming is not None and upcoming < until:
                until = upcoming
            if self._failed:  # a job that fails before it is recorded is still due: no spin
                until = max(until, now + RETRY_AFTER_ERROR)
            await sleep_or_wake(self.clock, until, self._wake)

    async def run_due(self, now: datetime) -> int:
        """Run (or record as missed) every job due at ``now``; how many runs were handled."""
        handled = 0
        for job in await self.jobs.due(now):
            try:
                handled += await self._handle(job, now)
            except BusClosed:
                raise
            except Exception:
                self._failed = True
                _log.exception("cron: job %s (%s) failed", job.id, job.name)
        return handled

    async def _handle(self, job: CronJob, now: datetime) -> int:
        runs: list[Run] = []
        if job.run_requested is not None:
            status, detail, key = await self._fire(job, job.run_requested, now)
            runs.append((job.run_requested, status, detail, key, True))
        next_run, advance = job.next_run, False
        if job.enabled and job.next_run is not None and job.next_run <= now:
            latest = max(job.schedule.latest(now) or job.next_run, job.next_run)
            late = now - latest
            if latest > job.next_run:
                runs.append((job.next_run, "missed", f"missed while the gateway was down "
                             f"(every run until {ts(latest)} was skipped)", None, False))
            if late <= self.grace:
                status, detail, key = await self._fire(job, latest, now)
                runs.append((latest, status, detail, key, False))
            else:
                _log.warning("cron: job %s (%s) missed its run at %s (%s late)", job.id,
                             job.name, ts(latest), late)
                runs.append((latest, "missed", f"missed: the gateway was not running "
                             f"({_late(late)} late; grace {_late(self.grace)})", None, False))
            next_run, advance = job.schedule.next_after(now), True
        await self.jobs.record(job, runs, advance=advance, next_run=next_run)
        return len(runs)

    async def _fire(self, job: CronJob, run_at: datetime,
                    now: datetime) -> tuple[str, str | None, str | None]:
        """Hand one run over: (status, detail, delivery key). BusClosed propagates."""
        try:
            if job.kind == "reminder":
                key = reminder_key(job.id, run_at)
                if not await self.jobs.outbox_has(key):  # else: sent before a crash
                    await self.bus.publish_outbound(OutboundMessage(
                        channel=job.channel, chat_id=job.chat_id, text=job.message,
                        thread_id=job.thread_id, kind="cron", idempotency_key=key))
                _log.info("cron: reminder %s (%s) sent to %s", job.id, job.name, job.target)
                return "ran", None, key
            await self.bus.publish_inbound(InboundMessage(
                channel=CRON_CHANNEL, chat_id=job.id, sender_id=job.sender_id or "cron",
                trust=job.trust,
                sender_name=f"scheduled task {job.name!r}", text=job.message, kind="cron",
                deliver_to=(job.channel, job.chat_id), deliver_thread=job.thread_id,
                message_id=task_message_id(job.id, run_at), received_at=now))
            _log.info("cron: task %s (%s) started for %s", job.id, job.name, job.target)
            return "ran", None, task_key_prefix(job.id, run_at)
        except BusClosed:
            raise
        except NotStored as exc:  # the database is gone or full: health says so already
            _log.warning("cron: job %s (%s) could not run: %s", job.id, job.name, exc)
            return "failed", str(exc), None
        except Exception as exc:
            _log.exception("cron: job %s (%s) could not run", job.id, job.name)
            return "failed", f"{type(exc).__name__}: {exc}", None


def _late(delta: timedelta) -> str:
    seconds = int(delta.total_seconds())
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"
