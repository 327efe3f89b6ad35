"""Scheduled jobs and their runs in the database: what the scheduler (``gateway/cron.py``),
``parley cron`` and the agent's cron tool share.

A ``reminder`` delivers its text exactly as written; a ``task`` is an inbound message on the
system channel ``cron`` (session ``cron:<job_id>``). Each run is recorded once in ``cron_runs``;
its delivery lives in the outbox, keyed so that a restart never sends it twice.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, Literal

from gateway.kernel.clock import Clock
from gateway.kernel.events import Trust
from gateway.kernel.frozen import frozen
from gateway.kernel.schedule import Schedule, ScheduleError
from gateway.kernel.store import Store
from gateway.kernel.store_sql import Migration, TableSet, register

_log = logging.getLogger(__name__)

JobKind = Literal["reminder", "task"]
CRON_CHANNEL = "cron"
"""The system channel of task turns: their session is ``cron:<job_id>``."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS cron_jobs (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    message TEXT NOT NULL,
    kind TEXT NOT NULL,
    schedule_kind TEXT NOT NULL,
    schedule TEXT NOT NULL,
    tz TEXT NOT NULL,
    anchor TEXT NOT NULL,
    channel TEXT NOT NULL,
    chat_id TEXT NOT NULL,
    enabled INTEGER NOT NULL DEFAULT 1,
    next_run TEXT,
    run_requested TEXT,
    created_by TEXT NOT NULL,
    created_at TEXT NOT NULL,
    thread_id TEXT,
    trust TEXT NOT NULL DEFAULT 'owner',
    sender_id TEXT
);
CREATE INDEX IF NOT EXISTS cron_jobs_due ON cron_jobs(next_run) WHERE enabled = 1;
CREATE INDEX IF NOT EXISTS cron_jobs_target ON cron_jobs(channel, chat_id);
CREATE TABLE IF NOT EXISTS cron_runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id TEXT NOT NULL,
    run_at TEXT NOT NULL,
    status TEXT NOT NULL,
    detail TEXT,
    delivery_key TEXT,
    manual INTEGER NOT NULL DEFAULT 0,
    recorded_at TEXT NOT NULL,
    UNIQUE (job_id, run_at)
);
"""
_SCHEMA_PG = _SCHEMA.replace("INTEGER PRIMARY KEY AUTOINCREMENT", "BIGSERIAL PRIMARY KEY")
"""PostgreSQL's twin: the same tables, a BIGSERIAL run id."""
TABLES = register(TableSet("cron", (Migration(1, _SCHEMA, _SCHEMA_PG),),
                           ("cron_jobs", "cron_runs"), generated_ids={"cron_runs": "id"}))
_JOB_COLS = ("id, name, message, kind, schedule_kind, schedule, tz, anchor, channel, chat_id, "
             "enabled, next_run, run_requested, created_by, created_at, thread_id, trust, "
             "sender_id")


def ts(when: datetime) -> str:
    """How times are stored and put in keys: UTC, whole seconds (so they sort as text)."""
    return when.astimezone(UTC).replace(microsecond=0).isoformat()


def _dt(text: str | None) -> datetime | None:
    return datetime.fromisoformat(text) if text else None


def reminder_key(job_id: str, run_at: datetime) -> str:
    """The outbox key of a reminder's delivery: one per run, so a restart never sends twice."""
    return f"cron:{job_id}:{ts(run_at)}"


def task_message_id(job_id: str, run_at: datetime) -> str:
    return f"{job_id}:{ts(run_at)}"


def task_key_prefix(job_id: str, run_at: datetime) -> str:
    """What the outbox keys of a task run's answers start with (see ``agent.replies.outbound``)."""
    return f"{CRON_CHANNEL}:{job_id}:{task_message_id(job_id, run_at)}:"


Run = tuple[datetime, str, str | None, str | None, bool]
"""A run to record: (run_at, status ran|missed|failed, detail, delivery key, manual)."""


@frozen
class NewJob:
    name: str
    message: str
    schedule_kind: str
    schedule: str
    channel: str
    chat_id: str
    kind: JobKind = "reminder"
    tz: str | None = None
    created_by: str = "cli"
    thread_id: str | None = None
    """The topic or thread of the chat the job answers in (the one it was made in)."""
    trust: Trust = "owner"
    """The trust of whoever made the job: its task turns run with that level's tools."""
    sender_id: str | None = None
    """Who made it in a chat (for a task turn's memory); None: the owner from the CLI."""


@frozen
class LastRun:
    run_at: datetime
    status: str
    """ran | missed | failed, or running while a task's turn has not finished."""
    detail: str | None
    delivery: str
    """pending | delivered | dead, or ``-`` when nothing was (or is yet) to be delivered."""


@frozen
class CronJob:
    id: str
    name: str
    message: str
    kind: JobKind
    schedule: Schedule
    channel: str
    chat_id: str
    enabled: bool
    next_run: datetime | None
    run_requested: datetime | None
    created_by: str
    created_at: datetime
    thread_id: str | None = None
    trust: Trust = "owner"
    sender_id: str | None = None
    last: LastRun | None = None

    @property
    def target(self) -> str:
        """``channel:chat_id``, with ``#thread`` when the job answers in a topic or thread."""
        where = f"{self.channel}:{self.chat_id}"
        return f"{where}#{self.thread_id}" if self.thread_id else where


def _job(row: Any) -> CronJob:
    anchor = datetime.fromisoformat(row[7])
    created = datetime.fromisoformat(row[14])
    return CronJob(id=row[0], name=row[1], message=row[2], kind=row[3],
                   schedule=Schedule(row[4], row[5], row[6], anchor), channel=row[8],
                   chat_id=row[9], enabled=bool(row[10]), next_run=_dt(row[11]),
                   run_requested=_dt(row[12]), created_by=row[13], created_at=created,
                   thread_id=row[15], trust=row[16], sender_id=row[17])


class CronJobs:
    """The jobs and their runs in the database: what the scheduler, ``parley cron`` and the
    agent's cron tool share. ``on_change`` wakes an in-process scheduler."""

    def __init__(self, store: Store, *, clock: Clock, timezone: str, min_interval: float = 0.0,
                 on_change: Callable[[], None] | None = None) -> None:
        self.store = store
        self.clock = clock
        self.timezone = timezone
        self.min_interval = min_interval
        self.on_change = on_change

    async def ensure(self) -> None:
        await self.store.migrate(TABLES)
        columns = await self.store.columns("cron_jobs")
        if "thread_id" not in columns:  # a database from before jobs kept their thread
            await self.store.ensure_schema("ALTER TABLE cron_jobs ADD COLUMN thread_id TEXT;")
        if "trust" not in columns:  # from before trust levels: only the owner made jobs
            await self.store.ensure_schema(
                "ALTER TABLE cron_jobs ADD COLUMN trust TEXT NOT NULL DEFAULT 'owner';"
                "ALTER TABLE cron_jobs ADD COLUMN sender_id TEXT;")

    async def add(self, new: NewJob) -> CronJob:
        """Validate and store a job; raises ScheduleError saying what is wrong."""
        if not new.message.strip():
            raise ScheduleError("the message is empty; say what to send or do")
        if new.kind not in ("reminder", "task"):
            raise ScheduleError(f"unknown kind {new.kind!r}: reminder or task")
        if not new.channel or not new.chat_id:
            raise ScheduleError("a job needs a target chat (channel and chat id)")
        now = self.clock.now().replace(microsecond=0)
        schedule = Schedule.parse(new.schedule_kind, new.schedule, tz=new.tz or self.timezone,
                                  now=now, min_interval=self.min_interval)
        next_run = schedule.next_after(now)
        if next_run is None:
            raise ScheduleError(f"{new.schedule!r} is in the past (now it is "
                                f"{now.astimezone(UTC):%Y-%m-%d %H:%M} UTC)")
        job_id = secrets.token_hex(4)
        name = new.name.strip() or new.message.strip().splitlines()[0][:40]
        async with self.store.transaction() as db:
            await db.execute(
                f"INSERT INTO cron_jobs ({_JOB_COLS}) VALUES "
                "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 1, ?, NULL, ?, ?, ?, ?, ?)",
                (job_id, name, new.message, new.kind, schedule.kind, schedule.spec, schedule.tz,
                 ts(schedule.anchor), new.channel, new.chat_id, ts(next_run), new.created_by,
                 ts(now), new.thread_id, new.trust, new.sender_id))
        self._changed()
        job = await self.get(job_id)
        assert job is not None
        return job

    async def get(self, job_id: str) -> CronJob | None:
        row = await self.store.fetchone(f"SELECT {_JOB_COLS} FROM cron_jobs WHERE id = ?",
                                        (job_id,))
        return _job(row) if row else None

    async def jobs(self, *, channel: str | None = None, chat_id: str | None = None,
                   with_last: bool = True) -> list[CronJob]:
        """Jobs (of one chat when given), soonest first, with their last run."""
        where = ""
        params: tuple[str, ...] = ()
        if channel is not None and chat_id is not None:
            where, params = " WHERE channel = ? AND chat_id = ?", (channel, chat_id)
        rows = await self.store.fetchall(
            f"SELECT {_JOB_COLS} FROM cron_jobs{where} "
            "ORDER BY enabled DESC, next_run IS NULL, next_run, created_at", params)
        out = [_job(r) for r in rows]
        if with_last:
            out = [replace(j, last=await self.last_run(j)) for j in out]
        return out

    async def remove(self, job_id: str, *, channel: str | None = None,
                     chat_id: str | None = None) -> bool:
        """Delete a job and its runs; with ``channel``/``chat_id`` only that chat's job."""
        where: str = "id = ?"
        params: tuple[str, ...] = (job_id,)
        if channel is not None and chat_id is not None:
            where, params = "id = ? AND channel = ? AND chat_id = ?", (job_id, channel, chat_id)
        async with self.store.transaction() as db:
            cursor = await db.execute(f"DELETE FROM cron_jobs WHERE {where}", params)
            removed = cursor.rowcount == 1
            if removed:
                await db.execute("DELETE FROM cron_runs WHERE job_id = ?", (job_id,))
        if removed:
            self._changed()
        return removed

    async def request_run(self, job_id: str) -> bool:
        """Run a job once now (``parley cron run``), beside its schedule."""
        async with self.store.transaction() as db:
            cursor = await db.execute("UPDATE cron_jobs SET run_requested = ? WHERE id = ?",
                                      (ts(self.clock.now()), job_id))
            found = cursor.rowcount == 1
        if found:
            self._changed()
        return found

    # for the scheduler ---------------------------------------------------------------------

    async def due(self, now: datetime) -> list[CronJob]:
        rows = await self.store.fetchall(
            f"SELECT {_JOB_COLS} FROM cron_jobs WHERE (enabled = 1 AND next_run <= ?) "
            "OR run_requested IS NOT NULL ORDER BY next_run", (ts(now),))
        return [_job(r) for r in rows]

    async def next_due(self) -> datetime | None:
        row = await self.store.fetchone(
            "SELECT MIN(next_run), MIN(run_requested) FROM cron_jobs WHERE enabled = 1 "
            "OR run_requested IS NOT NULL")
        times = [datetime.fromisoformat(v) for v in row if v] if row else []
        return min(times) if times else None

    async def record(self, job: CronJob, runs: list[Run], *, advance: bool,
                     next_run: datetime | None = None) -> None:
        """Store runs and, with ``advance``, the job's next run (None disables it); a manual
        run request is cleared. One transaction."""
        now = ts(self.clock.now())
        async with self.store.transaction() as db:
            await db.executemany(
                "INSERT OR IGNORE INTO cron_runs (job_id, run_at, status, detail, delivery_key, "
                "manual, recorded_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                [(job.id, ts(at), status, detail, key, int(manual), now)
                 for at, status, detail, key, manual in runs])
            if job.run_requested is not None:  # unless the CLI asked again meanwhile
                await db.execute("UPDATE cron_jobs SET run_requested = NULL "
                                 "WHERE id = ? AND run_requested = ?",
                                 (job.id, ts(job.run_requested)))
            if advance:
                await db.execute(
                    "UPDATE cron_jobs SET next_run = ?, enabled = ? WHERE id = ?",
                    (ts(next_run) if next_run else None, int(next_run is not None), job.id))

    async def outbox_has(self, key: str) -> bool:
        row = await self.store.fetchone("SELECT 1 FROM outbox WHERE idempotency_key = ?", (key,))
        return row is not None

    async def last_run(self, job: CronJob) -> LastRun | None:
        row = await self.store.fetchone(
            "SELECT run_at, status, detail, delivery_key FROM cron_runs WHERE job_id = ? "
            "ORDER BY run_at DESC, id DESC LIMIT 1", (job.id,))
        if row is None:
            return None
        run_at, status, detail, key = datetime.fromisoformat(row[0]), row[1], row[2], row[3]
        delivery = "-"
        if key:
            found = await self.store.fetchone(
                "SELECT status, last_error FROM outbox WHERE idempotency_key >= ? AND "
                "idempotency_key < ? ORDER BY id DESC LIMIT 1", (key, key + "\U0010ffff"))
            if found:
                delivery = found[0]
                if found[0] == "dead" and found[1]:
                    detail = found[1]
        if job.kind == "task" and status == "ran":
            turn = await self.store.fetchone(
                "SELECT status, error FROM turns WHERE inbound_id = ? ORDER BY started_at DESC "
                "LIMIT 1", (task_message_id(job.id, run_at),))
            if turn is None:
                status = "running"
            elif turn[0] == "error":
                status, detail = "failed", turn[1]
        return LastRun(run_at, status, detail, delivery)

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()
