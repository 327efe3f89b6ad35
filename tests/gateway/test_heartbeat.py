"""The heartbeat's rules: what counts as "nothing to report", what counts as a task, when a
beat runs. The whole heartbeat through the gateway is in tests/e2e/test_proactive.py."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gateway.heartbeat import Heartbeat, has_tasks, within
from gateway.kernel.bus import MessageBus
from gateway.kernel.config import HeartbeatConfig
from gateway.kernel.heartbeat_ack import heartbeat_ok
from tests.fakes.clock import FakeClock
from workspace.bootstrap import seed_workspace

TAIL = "x" * 300


@pytest.mark.parametrize(("text", "ok"), [
    ("HEARTBEAT_OK", True),
    ("  HEARTBEAT_OK\n", True),
    ("**HEARTBEAT_OK**", True),
    ("`HEARTBEAT_OK`.", True),
    ("HEARTBEAT_OK - checked mail and calendar, nothing new.", True),
    ("Checked mail and calendar, nothing new. HEARTBEAT_OK", True),
    (f"HEARTBEAT_OK {TAIL}", True),
    (f"HEARTBEAT_OK {TAIL}y", False),          # more than 300 other characters
    (f"{TAIL}y HEARTBEAT_OK", False),
    ("The server is down! HEARTBEAT_OK is not the case.", False),  # only in the middle
    ("Your flight leaves in 2 hours.", False),
    ("HEARTBEAT_OKAY", False),
    ("NOT_HEARTBEAT_OK", False),
    ("", False),
])
def test_heartbeat_ok(text: str, ok: bool) -> None:
    assert heartbeat_ok(text) is ok


@pytest.mark.parametrize(("text", "tasks"), [
    ("", False),
    ("# Heartbeat\n\n(Tasks to check on each heartbeat. Leave empty to stay quiet.)\n", False),
    ("# Heartbeat\n<!-- e.g.\n- check the mail\n-->\n\n## Later\n", False),
    ("# Heartbeat\n- \n- [ ]\n1.\n", False),
    ("# Heartbeat\n- Check whether the backup ran tonight.\n", True),
    ("Remind me to stretch if I have been quiet for a while", True),
    ("<!-- off --> Look at the build status", True),
])
def test_has_tasks(text: str, tasks: bool) -> None:
    assert has_tasks(text) is tasks


def test_the_template_has_no_tasks(tmp_path: Path) -> None:
    seed_workspace(tmp_path)
    assert not has_tasks((tmp_path / "HEARTBEAT.md").read_text())


@pytest.mark.parametrize(("hours", "hhmm", "inside"), [
    ("08:00-22:00", "08:00", True),
    ("08:00-22:00", "21:59", True),
    ("08:00-22:00", "22:00", False),
    ("08:00-22:00", "07:59", False),
    ("22:00-06:00", "23:30", True),
    ("22:00-06:00", "05:59", True),
    ("22:00-06:00", "12:00", False),
    ("00:00-24:00", "23:59", True),
    (None, "03:00", True),
])
def test_active_hours(hours: str | None, hhmm: str, inside: bool) -> None:
    config = HeartbeatConfig(active_hours=hours)
    h, m = map(int, hhmm.split(":"))
    assert within(config.hours(), datetime(2025, 1, 6, h, m, tzinfo=UTC)) is inside


def test_bad_config_is_refused() -> None:
    for bad in ({"active_hours": "8 to 22"}, {"active_hours": "24:30-06:00"},
                {"target": "telegram"}, {"every": "10s"}):
        with pytest.raises(ValueError):
            HeartbeatConfig(**bad)  # type: ignore[arg-type]


async def test_a_beat_skips_or_starts_a_turn_for_the_target(tmp_path: Path) -> None:
    busy: set[str] = set()
    bus = MessageBus()
    clock = FakeClock(datetime(2025, 1, 6, 6, 30, tzinfo=UTC))  # 07:30 in Berlin
    beat = Heartbeat(HeartbeatConfig(enabled=True, target="local:c1"), bus, workspace=tmp_path,
                     timezone="Europe/Berlin", clock=clock, busy=busy.__contains__)
    assert await beat.beat(clock.now()) == "skipped: outside active hours"
    clock.advance(3600)
    assert await beat.beat(clock.now()) == "skipped: HEARTBEAT.md has no tasks"
    (tmp_path / "HEARTBEAT.md").write_text("- check the build\n")
    busy.add("local:c1")
    assert await beat.beat(clock.now()) == "skipped: local:c1 is busy"
    busy.clear()
    assert await beat.beat(clock.now()) == "started"
    msg = await asyncio.wait_for(bus.consume_inbound(), 5)
    assert (msg.kind, msg.session_key, msg.deliver_to) == ("heartbeat", "heartbeat:main",
                                                           ("local", "c1"))
    busy.add("heartbeat:main")  # the last beat is still running
    assert await beat.beat(clock.now()) == "skipped: heartbeat:main is busy"
