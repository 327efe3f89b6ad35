"""The cron tool: jobs always belong to the turn's chat, whatever the model sends."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from agent.tools import build_registry
from agent.turn import TurnContext, TurnServices
from gateway.kernel.config import ToolsConfig
from gateway.kernel.cron_jobs import CronJobs
from gateway.kernel.events import InboundMessage
from gateway.kernel.store import Store
from tests.fakes.clock import FakeClock

NOW = datetime(2025, 1, 6, 8, 0, tzinfo=UTC)


@pytest.fixture
async def jobs(tmp_path: Path) -> AsyncIterator[CronJobs]:
    store = await Store.open(tmp_path / "parley.db")
    j = CronJobs(store, clock=FakeClock(NOW), timezone="Europe/Berlin", min_interval=60)
    await j.ensure()
    yield j
    await store.close()


def ctx(ws: Path, jobs: CronJobs | None, **kw: Any) -> TurnContext:
    base: dict[str, Any] = {"session_override": "local:c1", "channel": "local",
                            "chat_id": "c1", "sender_id": "u1"}
    msg = InboundMessage(**{"trust": "owner", **base, **kw}, text="", received_at=NOW)
    return TurnContext(message=msg, session_id=1, workspace=ws, services=TurnServices(cron=jobs))


async def call(c: TurnContext, **args: Any) -> tuple[str, bool]:
    result = await build_registry(ToolsConfig()).execute("cron", json.dumps(args), c)
    return result.text, result.is_error


async def test_add_list_remove_in_this_chat(tmp_path: Path, jobs: CronJobs) -> None:
    c = ctx(tmp_path, jobs)
    text, err = await call(c, action="add", message="Stand-up!", at="2025-01-06T10:00",
                           name="standup")
    assert not err, text
    assert "next run 2025-01-06 10:00 Europe/Berlin" in text
    [job] = await jobs.jobs()
    assert (job.channel, job.chat_id, job.kind, job.created_by) == ("local", "c1", "reminder",
                                                                    "agent:local:c1")
    text, _ = await call(c, action="list")
    assert job.id in text and "Stand-up!" in text
    text, err = await call(c, action="remove", job_id=job.id)
    assert not err and await jobs.jobs() == []


async def test_the_model_cannot_reach_another_chat(tmp_path: Path, jobs: CronJobs) -> None:
    mine = ctx(tmp_path, jobs)
    other = ctx(tmp_path, jobs, chat_id="c2", session_override="local:c2")
    await call(mine, action="add", message="mine", every="1h")
    # the tool has no target arguments: what the model adds is refused or ignored
    await call(mine, action="add", message="x", every="1h", channel="telegram", chat_id="999")
    found = await jobs.jobs()
    assert {(j.channel, j.chat_id) for j in found} == {("local", "c1")}
    text, _ = await call(other, action="list")
    assert text == "This chat has no scheduled jobs."
    text, err = await call(other, action="remove", job_id=found[0].id)
    assert err and "no job" in text
    assert len(await jobs.jobs()) == len(found)


async def test_a_task_turn_schedules_for_its_target_chat(tmp_path: Path,
                                                         jobs: CronJobs) -> None:
    c = ctx(tmp_path, jobs, channel="cron", chat_id="abc", session_override="cron:abc", kind="cron",
            deliver_to=("telegram", "42"))
    text, err = await call(c, action="add", message="again tomorrow", at="1d", kind="task")
    assert not err, text
    [job] = await jobs.jobs()
    assert (job.channel, job.chat_id, job.kind) == ("telegram", "42", "task")


async def test_mistakes_go_back_to_the_model(tmp_path: Path, jobs: CronJobs) -> None:
    c = ctx(tmp_path, jobs)
    for args, words in [
        ({"action": "add", "message": "m"}, "exactly one of"),
        ({"action": "add", "message": "m", "at": "1h", "every": "1h"}, "exactly one of"),
        ({"action": "add", "message": "m", "at": "2020-01-01T00:00"}, "in the past"),
        ({"action": "add", "message": "m", "every": "10s"}, "too often"),
        ({"action": "add", "message": "m", "cron_expr": "every day"}, "not a cron"),
        ({"action": "remove"}, "job_id"),
    ]:
        text, err = await call(c, **args)
        assert err and words in text, (args, text)
    text, err = await call(ctx(tmp_path, None), action="list")
    assert err and "not available" in text
