"""Schedules, the jobs table and the scheduler on a fake clock (nothing sleeps)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gateway.cron import CronScheduler
from gateway.kernel.bus import MessageBus, NotStored
from gateway.kernel.cron_jobs import CronJob, CronJobs, NewJob, reminder_key
from gateway.kernel.events import InboundMessage, OutboundMessage
from gateway.kernel.schedule import Schedule, ScheduleError
from gateway.kernel.store import Store
from tests.e2e.waiting import until
from tests.fakes.clock import FakeClock

START = datetime(2025, 1, 6, 8, 0, tzinfo=UTC)  # a Monday; 09:00 in Berlin (UTC+1)
BERLIN = "Europe/Berlin"


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


# schedules ---------------------------------------------------------------------------------

def test_at_a_time_of_day_is_the_next_one_in_the_timezone() -> None:
    # START is 09:00 in Berlin: 09:00 itself is tomorrow, 10:30 still today.
    assert Schedule.parse("at", "09:00", tz=BERLIN, now=START).next_after(START) == \
        utc("2025-01-07 08:00")
    assert Schedule.parse("at", "10:30", tz=BERLIN, now=START).next_after(START) == \
        utc("2025-01-06 09:30")
    spring = datetime(2025, 3, 29, 12, 0, tzinfo=UTC)  # clocks go forward that night
    assert Schedule.parse("at", "9:00", tz=BERLIN, now=spring).next_after(spring) == \
        utc("2025-03-30 07:00")
    assert Schedule.parse("at", "1h30m", tz=BERLIN, now=START).next_after(START) == \
        START + timedelta(minutes=90)
    assert Schedule.parse("every", "1h30m", tz=BERLIN, now=START).interval == \
        timedelta(minutes=90)
    for bad in ("24:00", "9:60", "09:00pm"):
        with pytest.raises(ScheduleError, match="09:00"):
            Schedule.parse("at", bad, tz=BERLIN, now=START)


def test_naive_at_is_read_in_the_given_timezone() -> None:
    winter = Schedule.parse("at", "2025-01-06T10:00", tz=BERLIN, now=START)
    assert winter.next_after(START) == utc("2025-01-06 09:00")
    summer = Schedule.parse("at", "2025-07-01 10:00", tz=BERLIN, now=START)
    assert summer.next_after(START) == utc("2025-07-01 08:00")
    explicit = Schedule.parse("at", "2025-01-06T10:00+00:00", tz=BERLIN, now=START)
    assert explicit.next_after(START) == utc("2025-01-06 10:00")
    delay = Schedule.parse("at", "20m", tz=BERLIN, now=START)
    assert delay.next_after(START) == START + timedelta(minutes=20)


def test_at_runs_once() -> None:
    at = Schedule.parse("at", "2025-01-06T10:00", tz="UTC", now=START)
    assert at.one_shot
    assert at.next_after(utc("2025-01-06 10:00")) is None
    assert at.latest(utc("2025-01-06 09:59")) is None
    assert at.latest(utc("2025-01-07 00:00")) == utc("2025-01-06 10:00")


def test_every_counts_from_its_creation() -> None:
    every = Schedule.parse("every", "90s", tz="UTC", now=START)
    assert every.next_after(START) == START + timedelta(seconds=90)
    assert every.next_after(START + timedelta(seconds=90)) == START + timedelta(seconds=180)
    assert every.latest(START + timedelta(seconds=100)) == START + timedelta(seconds=90)
    assert every.latest(START + timedelta(seconds=89)) is None
    assert Schedule.parse("every", "2h", tz="UTC", now=START).interval == timedelta(hours=2)


def test_cron_expression_keeps_local_time_across_the_spring_change() -> None:
    daily = Schedule.parse("cron", "0 9 * * *", tz=BERLIN, now=START)
    t = utc("2025-03-28 12:00")
    runs = []
    for _ in range(3):
        nxt = daily.next_after(t)
        assert nxt is not None
        runs.append(nxt)
        t = nxt
    # 09:00 Berlin: UTC+1 on the 29th, UTC+2 from the 30th (clocks went forward that night)
    assert runs == [utc("2025-03-29 08:00"), utc("2025-03-30 07:00"), utc("2025-03-31 07:00")]
    assert daily.latest(utc("2025-03-31 07:00")) == utc("2025-03-31 07:00")
    assert daily.latest(utc("2025-03-31 06:59")) == utc("2025-03-30 07:00")


def test_cron_in_the_repeated_and_the_skipped_hour() -> None:
    fixed = Schedule.parse("cron", "30 2 * * *", tz=BERLIN, now=START)
    # autumn: 02:30 happens twice on 2025-10-26; a fixed-hour job runs once
    first = fixed.next_after(utc("2025-10-25 12:00"))
    assert first == utc("2025-10-26 00:30")
    assert fixed.next_after(first) == utc("2025-10-27 01:30")
    # spring: 02:30 does not exist on 2025-03-30; it runs when the clocks reach 03:00
    assert fixed.next_after(utc("2025-03-29 12:00")) == utc("2025-03-30 01:00")
    # a job with a wildcard hour runs in both passes of the repeated hour
    half_hourly = Schedule.parse("cron", "*/30 * * * *", tz=BERLIN, now=START)
    t, runs = utc("2025-10-25 23:45"), []
    for _ in range(5):
        nxt = half_hourly.next_after(t)
        assert nxt is not None
        runs.append(nxt)
        t = nxt
    assert runs == [utc(f"2025-10-26 {h}") for h in ("00:00", "00:30", "01:00", "01:30",
                                                      "02:00")]


@pytest.mark.parametrize(("kind", "spec", "tz", "words"), [
    ("at", "2025-01-06T07:59", "UTC", "is in the past"),
    ("at", "next tuesday", "UTC", "is not a time"),
    ("every", "5s", "UTC", "too often"),
    ("every", "often", "UTC", "not a duration"),
    ("cron", "0 25 * * *", "UTC", "not a cron expression"),
    ("cron", "0 9 * * *", "Mars/Olympus", "unknown IANA timezone"),
    ("weekly", "x", "UTC", "unknown schedule kind"),
])
async def test_bad_schedules_are_refused_with_a_reason(store: Store, kind: str, spec: str,
                                                       tz: str, words: str) -> None:
    jobs = CronJobs(store, clock=FakeClock(START), timezone="UTC", min_interval=60)
    await jobs.ensure()
    with pytest.raises(ScheduleError, match=words):
        await jobs.add(NewJob(name="n", message="m", schedule_kind=kind, schedule=spec,
                              channel="local", chat_id="c1", tz=tz))


# the scheduler -----------------------------------------------------------------------------

class Rig:
    def __init__(self, store: Store, *, grace: float = 600) -> None:
        self.store = store
        self.clock = FakeClock(START)
        self.bus = MessageBus()
        self.bus.attach_store(store, lambda kind: 3600)
        self.jobs = CronJobs(store, clock=self.clock, timezone=BERLIN)
        self.scheduler = CronScheduler(self.jobs, self.bus, clock=self.clock, grace=grace,
                                       poll_interval=5)

    async def add(self, spec: str, kind: str = "at", *, job: str = "reminder",
                  message: str = "Take the pills", chat: str = "c1") -> CronJob:
        await self.jobs.ensure()
        return await self.jobs.add(NewJob(name="pills", message=message, schedule_kind=kind,
                                          schedule=spec, channel="local", chat_id=chat,
                                          kind=job))  # type: ignore[arg-type]

    async def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)
        await self.clock.settled(1)

    def sent(self) -> list[OutboundMessage]:
        out = []
        while self.bus.outbound_size:
            out.append(self.bus._outbound.get_nowait())
        return out


@pytest.fixture
async def rig(store: Store) -> AsyncIterator[Rig]:
    r = Rig(store)
    await r.scheduler.start()
    await r.clock.settled(1)
    yield r
    await r.scheduler.stop()


async def test_a_reminder_is_sent_verbatim_at_its_local_time_then_disabled(rig: Rig) -> None:
    job = await rig.add("2025-01-06T10:00")  # Berlin: 09:00 UTC
    assert job.next_run == utc("2025-01-06 09:00")
    await rig.advance(3599)
    assert rig.sent() == []
    await rig.advance(1)
    [msg] = rig.sent()
    assert (msg.channel, msg.chat_id, msg.text, msg.kind) == ("local", "c1", "Take the pills",
                                                              "cron")
    assert msg.idempotency_key == reminder_key(job.id, utc("2025-01-06 09:00"))
    after = await rig.jobs.get(job.id)
    assert after is not None and not after.enabled and after.next_run is None
    [listed] = await rig.jobs.jobs()
    assert listed.last is not None
    assert (listed.last.status, listed.last.delivery) == ("ran", "pending")
    await rig.store.outbox_result(msg.idempotency_key, delivered=True, attempts=1)
    [listed] = await rig.jobs.jobs()
    assert listed.last is not None and listed.last.delivery == "delivered"
    await rig.advance(86400)
    assert rig.sent() == []


async def test_every_repeats_and_a_long_jump_runs_only_the_latest(rig: Rig) -> None:
    job = await rig.add("30m", "every")
    await rig.advance(1800)
    await rig.advance(1800)
    assert [m.idempotency_key for m in rig.sent()] == [
        reminder_key(job.id, START + timedelta(minutes=30)),
        reminder_key(job.id, START + timedelta(minutes=60))]
    await rig.advance(3 * 1800)  # three runs due at once: the latest runs, no burst
    assert [m.idempotency_key for m in rig.sent()] == [
        reminder_key(job.id, START + timedelta(minutes=150))]
    runs = await rig.store.fetchall("SELECT run_at, status FROM cron_runs ORDER BY run_at")
    assert [r[1] for r in runs] == ["ran", "ran", "missed", "ran"]
    current = await rig.jobs.get(job.id)
    assert current is not None and current.next_run == START + timedelta(minutes=180)


async def test_missed_runs_within_grace_run_once_later_ones_are_recorded(store: Store) -> None:
    first = Rig(store, grace=600)
    soon = await first.add("2025-01-06T09:10")     # 08:10 UTC
    late = await first.add("2025-01-06T09:05", message="too late")
    # the gateway is down until 08:18: `soon` is 8 minutes late, `late` 13
    second = Rig(store, grace=600)
    second.clock.advance(18 * 60)
    await second.scheduler.start()
    await second.clock.settled(1)
    try:
        assert [m.text for m in second.sent()] == ["Take the pills"]
        by_id = {j.id: j for j in await second.jobs.jobs()}
        ran = by_id[soon.id].last
        assert ran is not None and ran.status == "ran"
        missed = by_id[late.id].last
        assert missed is not None and missed.status == "missed"
        assert missed.detail is not None and "13m00s late" in missed.detail
        assert not by_id[late.id].enabled  # one-shot: done either way
    finally:
        await second.scheduler.stop()


async def test_a_restart_after_a_crash_does_not_send_a_reminder_twice(rig: Rig) -> None:
    job = await rig.add("10m")
    run_at = START + timedelta(minutes=10)
    # the last run put it in the outbox and crashed before it recorded the run
    await rig.store.outbox_add(OutboundMessage(channel="local", chat_id="c1", text="x",
                                               kind="cron",
                                               idempotency_key=reminder_key(job.id, run_at)),
                               START + timedelta(hours=1))
    await rig.advance(600)
    assert rig.sent() == []
    [listed] = await rig.jobs.jobs()
    assert listed.last is not None and listed.last.status == "ran"


async def test_a_task_is_a_system_message_in_its_own_session(rig: Rig) -> None:
    job = await rig.add("5m", job="task", message="Summarise the news")
    await rig.advance(300)
    msg = await asyncio.wait_for(rig.bus.consume_inbound(), 5)
    assert msg.session_key == f"cron:{job.id}"
    assert (msg.kind, msg.text, msg.deliver_to) == ("cron", "Summarise the news",
                                                    ("local", "c1"))
    assert msg.received_at == START + timedelta(minutes=5)
    [listed] = await rig.jobs.jobs()
    assert listed.last is not None and listed.last.status == "running"  # no turn stored yet


async def test_run_now_and_remove(rig: Rig) -> None:
    job = await rig.add("2025-01-07T09:00")
    assert await rig.jobs.request_run(job.id)  # wakes the scheduler
    msg = await asyncio.wait_for(rig.bus.consume_outbound(), 5)
    assert msg.text == "Take the pills"
    await rig.clock.settled(1)
    after = await rig.jobs.get(job.id)
    assert after is not None and after.enabled and after.run_requested is None
    assert after.next_run == job.next_run  # the schedule is unchanged
    assert not await rig.jobs.remove(job.id, channel="local", chat_id="another-chat")
    assert await rig.jobs.remove(job.id, channel="local", chat_id="c1")
    assert await rig.jobs.jobs() == []
    assert not await rig.jobs.request_run(job.id)


async def test_a_job_written_by_another_process_is_picked_up_by_polling(rig: Rig,
                                                                        tmp_path: Path) -> None:
    other = await Store.open(tmp_path / "parley.db")  # as `parley cron add` would
    try:
        cli = CronJobs(other, clock=FakeClock(START), timezone=BERLIN)
        await cli.add(NewJob(name="n", message="from the CLI", schedule_kind="at",
                             schedule="2025-01-06T09:01", channel="local", chat_id="c1"))
    finally:
        await other.close()
    await rig.advance(5)  # the poll finds it due at 08:01 UTC
    await rig.advance(55)
    assert [m.text for m in rig.sent()] == ["from the CLI"]


class _Unstorable(MessageBus):
    """The inbox refuses, as when the database file is gone or the disk full."""

    async def publish_inbound(self, msg: InboundMessage) -> bool:
        raise NotStored("the database file is gone")


async def test_a_task_the_inbox_cannot_store_is_a_failed_run_in_one_line(
        store: Store, caplog: pytest.LogCaptureFixture) -> None:
    rig = Rig(store)
    rig.scheduler.bus = rig.bus = _Unstorable()
    await rig.scheduler.start()
    try:
        await rig.clock.settled(1)
        job = await rig.add("5m", job="task", message="Summarise the news")
        await rig.advance(300)
        await until(lambda: any("could not run" in r.getMessage() for r in caplog.records),
                    "the warning")
        await rig.clock.settled(1)  # the scheduler sleeps again: the run is recorded
        [listed] = await rig.jobs.jobs()
        assert listed.id == job.id and listed.last is not None
        assert (listed.last.status, listed.last.detail) == ("failed",
                                                            "the database file is gone")
        assert all(r.exc_info is None for r in caplog.records)  # a line, not a traceback
    finally:
        await rig.scheduler.stop()
