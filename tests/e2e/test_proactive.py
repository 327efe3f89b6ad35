"""Cron, heartbeat and the message tool through the whole gateway: the local channel (or a
scripted platform), the scripted model behind litellm, and a fake clock that the tests move.
Nothing sleeps: a test advances the clock and waits for what a user would see."""

from __future__ import annotations

import asyncio
import os
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import yaml

from gateway.app import Gateway
from gateway.kernel.config import Config, load_config
from gateway.kernel.cron_jobs import NewJob
from gateway.kernel.store import Store
from gateway.kernel.values import Delivery
from tests.conftest import MakeConfig
from tests.e2e.test_durability import ScriptedChannel, inbound
from tests.fakes.clock import FakeClock
from tests.fakes.openai_server import ScriptedLLM
from workspace.bootstrap import seed_workspace

PARLEY = str(Path(sys.executable).parent / "parley")
START = datetime(2025, 1, 6, 7, 0, tzinfo=UTC)  # Monday 08:00 in Berlin
BERLIN = ZoneInfo("Europe/Berlin")
TASKS = "# Heartbeat\n\n- Check whether last night's backup ran.\n"


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def berlin(make_config: MakeConfig, **extra: Any) -> Config:
    agent = {"timezone": "Europe/Berlin", **extra.pop("agent", {})}
    return make_config(agent=agent, **extra)


def heartbeat_config(make_config: MakeConfig, tasks: str | None) -> Config:
    config = berlin(make_config, heartbeat={"enabled": True, "every": "30m",
                                            "active_hours": "00:00-24:00",
                                            "target": "local:c1"})
    seed_workspace(config.workspace_path)
    if tasks is not None:
        (config.workspace_path / "HEARTBEAT.md").write_text(tasks)
    return config


async def records(gw: Gateway, chat: str = "c1", after: int = 0,
                  wait: float = 0.0) -> list[dict[str, Any]]:
    found, _ = await gw.local.wait_messages(chat, after=after, timeout=wait)
    return found


async def stored(config: Config, key: str) -> list[tuple[str, Any]]:
    """(role, content) of a session's stored messages, read after the gateway stopped."""
    store = await Store.open(config.db_path)
    try:
        session = await store.find_session(key)
        if session is None:
            return []
        return [(m.role, m.body.get("content")) async for m in store.all_messages(session.id)]
    finally:
        await store.close()


# cron --------------------------------------------------------------------------------------

async def test_a_reminder_arrives_verbatim_at_its_local_time_without_a_model_call(
        make_config: MakeConfig, llm: ScriptedLLM) -> None:
    config = berlin(make_config)
    clock = FakeClock(START)
    llm.tool_call("cron", {"action": "add", "message": "Call the dentist (0301234567)",
                           "at": "2025-01-06T09:30", "name": "dentist"})
    llm.reply("I'll remind you at 09:30.")
    async with Gateway(config, clock=clock) as gw:
        assert await gw.local.ask("c1", "remind me at 9:30 to call the dentist") == \
            "I'll remind you at 09:30."
        tool_result = llm.last_request["messages"][-1]["content"]
        assert "next run 2025-01-06 09:30 Europe/Berlin" in tool_result
        seen = (await records(gw))[-1]["seq"]
        clock.advance(to=utc("2025-01-06 08:29:59"))  # 09:29:59 in Berlin
        await clock.settled(1)
        assert await records(gw, after=seen) == []
        clock.advance(1)
        [reminder] = await records(gw, after=seen, wait=10)
        assert (reminder["text"], reminder["kind"]) == ("Call the dentist (0301234567)", "cron")
        assert llm.calls == 2  # the reminder itself asked no model
        await clock.settled(1)  # the scheduler recorded the run
        assert gw.cron is not None
        [job] = await gw.cron.jobs.jobs()
        assert job.last is not None and job.last.status == "ran" and not job.enabled
    # the firing is not part of the user's conversation
    conversation = await stored(config, "local:c1")
    assert [role for role, _ in conversation] == ["user", "assistant", "tool", "assistant"]


async def test_jobs_made_in_a_topic_answer_in_that_topic(make_config: MakeConfig,
                                                         llm: ScriptedLLM) -> None:
    config = berlin(make_config)
    clock = FakeClock(START)
    llm.tool_call("cron", {"action": "add", "message": "Stand-up in 5 minutes",
                           "at": "2025-01-06T09:30", "name": "standup"})
    llm.reply("Reminder set.")
    llm.tool_call("cron", {"action": "add", "message": "Summarise the open pull requests.",
                           "at": "2025-01-06T10:00", "kind": "task", "name": "prs"})
    llm.reply("Task set.")
    async with Gateway(config, clock=clock) as gw:
        assert await gw.local.ask("c1", "remind me of the stand-up", thread_id="t42") == \
            "Reminder set."
        assert await gw.local.ask("c1", "and summarise PRs at 10", thread_id="t42") == \
            "Task set."
        assert gw.cron is not None
        assert {j.target for j in await gw.cron.jobs.jobs()} == {"local:c1#t42"}
        seen = (await records(gw))[-1]["seq"]
        clock.advance(to=utc("2025-01-06 08:30"))  # 09:30 in Berlin
        [reminder] = await records(gw, after=seen, wait=10)
        assert (reminder["text"], reminder["thread_id"]) == ("Stand-up in 5 minutes", "t42")
        llm.reply("Two PRs are open.")
        clock.advance(to=utc("2025-01-06 09:00"))
        [answer] = await records(gw, after=reminder["seq"], wait=10)
        assert (answer["text"], answer["kind"], answer["thread_id"]) == (
            "Two PRs are open.", "cron", "t42")


async def test_a_cron_table_from_before_threads_is_upgraded(make_config: MakeConfig,
                                                            llm: ScriptedLLM) -> None:
    config = berlin(make_config)
    config.db_path.parent.mkdir(parents=True, exist_ok=True)
    store = await Store.open(config.db_path)
    await store.ensure_schema(
        "CREATE TABLE cron_jobs (id TEXT PRIMARY KEY, name TEXT NOT NULL, message TEXT NOT "
        "NULL, kind TEXT NOT NULL, schedule_kind TEXT NOT NULL, schedule TEXT NOT NULL, tz TEXT "
        "NOT NULL, anchor TEXT NOT NULL, channel TEXT NOT NULL, chat_id TEXT NOT NULL, enabled "
        "INTEGER NOT NULL DEFAULT 1, next_run TEXT, run_requested TEXT, created_by TEXT NOT "
        "NULL, created_at TEXT NOT NULL);"
        "INSERT INTO cron_jobs VALUES ('j1', 'old', 'hi', 'reminder', 'every', '3600', 'UTC', "
        "'2025-01-06T07:00:00+00:00', 'local', 'c1', 1, '2025-01-06T08:00:00+00:00', NULL, "
        "'cli', '2025-01-06T07:00:00+00:00');")
    await store.close()
    async with Gateway(config, clock=FakeClock(START)) as gw:
        assert gw.cron is not None
        [job] = await gw.cron.jobs.jobs()
        assert (job.id, job.target, job.thread_id) == ("j1", "local:c1", None)


async def test_a_task_runs_in_its_own_session_and_its_reply_reaches_the_target(
        make_config: MakeConfig, llm: ScriptedLLM) -> None:
    platform = ScriptedChannel()
    platform.results = [Delivery(ok=False, error="HTTP 502")]  # the first delivery fails
    config = berlin(make_config, channels={"delivery": {"backoff": "0.01s"}})
    clock = FakeClock(START)
    llm.reply("my name is Ada")
    async with Gateway(config, clock=clock, channels=[platform]) as gw:
        await gw.bus.publish_inbound(inbound("hello, I'm Ada"))
        # refused: the outbox waits its backoff (10 ms ± half) on the gateway's clock
        await clock.sleeper_by(clock.now() + timedelta(seconds=0.02))
        clock.advance(1)
        await platform.wait_sent(1)
        assert gw.cron is not None
        job = await gw.cron.jobs.add(NewJob(
            name="weather", message="Look up today's weather for Berlin.",
            schedule_kind="cron", schedule="0 9 * * 1-5", channel="platform", chat_id="c1",
            kind="task"))
        await clock.settled(1)
        llm.reply("Sunny, 12 °C.")
        clock.advance(to=utc("2025-01-06 08:00"))  # 09:00 in Berlin
        await platform.wait_sent(2)
        reply = platform.sent[-1]
        assert (reply.chat_id, reply.text, reply.kind) == ("c1", "Sunny, 12 °C.", "cron")
        assert reply.reply_to is None
        assert await gw.manager.flush(10)
        assert llm.calls == 2 and platform.tries == 3  # retried; the task ran once
        [listed] = await gw.cron.jobs.jobs()
        assert listed.last is not None
        assert (listed.last.status, listed.last.delivery) == ("ran", "delivered")
        assert listed.next_run == utc("2025-01-07 08:00")
    request = llm.last_request["messages"]
    contents = " ".join(str(m.get("content")) for m in request)
    assert "Ada" not in contents  # nothing of the user's conversation
    assert "Message kind: cron" in request[-2]["content"]
    assert request[-1]["content"] == "Look up today's weather for Berlin."
    assert [r for r, _ in await stored(config, f"cron:{job.id}")] == ["user", "assistant"]
    assert [r for r, _ in await stored(config, "platform:c1")] == ["user", "assistant"]
    names = {t.get_name() for t in asyncio.all_tasks()}
    assert not names & {"cron-scheduler", "heartbeat", "agent-dispatch"}


async def test_a_job_added_with_the_cli_is_picked_up_by_the_running_gateway(
        tmp_path: Path, llm: ScriptedLLM) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({
        "workspace": "ws", "data_dir": "data",
        "agent": {"model": "openai/test-model", "api_base": llm.base_url, "api_key": "k",
                  "timezone": "Europe/Berlin"},
        "channels": {"local": {"port": 0}}}))
    start = datetime.now(UTC).replace(microsecond=0)  # the CLI checks times on the real clock
    clock = FakeClock(start)
    at = (start + timedelta(hours=2)).astimezone(BERLIN).strftime("%Y-%m-%dT%H:%M:%S")
    env = {**os.environ, "COLUMNS": "250", "LITELLM_LOCAL_MODEL_COST_MAP": "True"}

    async def parley(*args: str, columns: int = 250) -> str:
        proc = await asyncio.create_subprocess_exec(
            PARLEY, "cron", *args, "--config", str(path), env={**env, "COLUMNS": str(columns)},
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0, err.decode()
        return out.decode()

    async with Gateway(load_config(path), clock=clock) as gw:
        await clock.settled(1)
        added = await parley("add", "--name", "tea", "--message", "Tea is ready",
                             "--at", at, "--channel", "local", "--to", "c1")
        assert "added reminder" in added and "local:c1" in added
        job_id = added.split()[2]
        clock.advance(5)  # the next poll sees the new job
        await clock.settled(1)
        assert await records(gw) == []
        clock.advance(2 * 3600 - 5)
        [reminder] = await records(gw, wait=10)
        assert (reminder["text"], reminder["kind"]) == ("Tea is ready", "cron")
        assert await gw.manager.flush(10)
        await clock.settled(1)  # the run is recorded
        listing = await parley("list")
        narrow = await parley("list", columns=80)  # a plain terminal: a block per job
    row = next(line for line in listing.splitlines() if job_id in line)
    assert "tea" in row and "done" in row and "ran" in row and "delivered" in row
    assert max(len(line) for line in narrow.splitlines()) <= 80
    assert narrow.splitlines()[0] == f"{job_id}  tea  (reminder → local:c1)"
    assert "status ran  delivery delivered" in narrow
    assert llm.calls == 0


async def test_missed_runs_run_once_within_grace_and_are_recorded_beyond_it(
        make_config: MakeConfig, llm: ScriptedLLM) -> None:
    config = berlin(make_config, cron={"missed_grace": "10m"})
    async with Gateway(config, clock=FakeClock(START)) as gw:
        assert gw.cron is not None
        for name, kind, spec in (("soon", "at", "2025-01-06T08:10"),
                                 ("late", "at", "2025-01-06T08:05"),
                                 ("frequent", "every", "5m")):
            await gw.cron.jobs.add(NewJob(name=name, message=f"{name} reminder",
                                          schedule_kind=kind, schedule=spec,
                                          channel="local", chat_id="c1"))
    # down from 08:00 until 08:18 Berlin: soon is 8 minutes late (within grace), late 13;
    # frequent missed 08:05, 08:10 and 08:15, and only the latest of them runs
    clock = FakeClock(START + timedelta(minutes=18))
    async with Gateway(config, clock=clock) as gw:
        sent: list[dict[str, Any]] = []
        while len(sent) < 2:
            sent += await records(gw, after=sent[-1]["seq"] if sent else 0, wait=10)
        assert [r["text"] for r in sent] == ["frequent reminder", "soon reminder"]
        await clock.settled(1)
        assert len(await records(gw)) == 2
        assert gw.cron is not None and gw.store is not None
        jobs = {j.name: j for j in await gw.cron.jobs.jobs()}
        assert [(n, getattr(jobs[n].last, "status", None), jobs[n].enabled)
                for n in ("soon", "late", "frequent")] == [
            ("soon", "ran", False), ("late", "missed", False), ("frequent", "ran", True)]
        late = jobs["late"].last
        assert late is not None and late.detail is not None and "13m00s late" in late.detail
        runs = await gw.store.fetchall(
            "SELECT run_at, status FROM cron_runs WHERE job_id = ? ORDER BY run_at",
            (jobs["frequent"].id,))
        assert runs == [("2025-01-06T07:05:00+00:00", "missed"),
                        ("2025-01-06T07:15:00+00:00", "ran")]
        assert jobs["frequent"].next_run == START + timedelta(minutes=20)
    assert llm.calls == 0


# heartbeat ---------------------------------------------------------------------------------

async def test_heartbeat_ok_is_stored_but_not_delivered(make_config: MakeConfig,
                                                        llm: ScriptedLLM) -> None:
    config = heartbeat_config(make_config, TASKS)
    clock = FakeClock(START)
    llm.reply("HEARTBEAT_OK - the backup ran at 02:00.")
    async with Gateway(config, clock=clock, grace=5) as gw:
        await clock.settled(2)
        clock.advance(1800)
        await llm.wait_for_requests(1)
    # the gateway let the turn finish before it stopped: nothing reached the chat
    assert await records(gw) == []
    assert "Check whether last night's backup ran." in llm.last_request["messages"][0]["content"]
    assert [r for r, _ in await stored(config, "heartbeat:main")] == ["user", "assistant"]
    assert await stored(config, "local:c1") == []


async def test_a_heartbeat_alert_goes_to_the_target(make_config: MakeConfig,
                                                    llm: ScriptedLLM) -> None:
    config = heartbeat_config(make_config, TASKS)
    clock = FakeClock(START)
    llm.reply("The backup did not run last night.")
    async with Gateway(config, clock=clock) as gw:
        await clock.settled(2)
        clock.advance(1800)
        [alert] = await records(gw, wait=10)
        assert (alert["text"], alert["kind"]) == ("The backup did not run last night.",
                                                  "heartbeat")
        assert gw.heartbeat is not None and gw.heartbeat.last is not None
        assert gw.heartbeat.last[1] == "started"
    assert await stored(config, "local:c1") == []  # not written into the user's conversation


async def test_an_empty_heartbeat_file_makes_no_model_call(make_config: MakeConfig,
                                                           llm: ScriptedLLM) -> None:
    config = heartbeat_config(make_config, None)  # the template: a heading and a placeholder
    clock = FakeClock(START)
    async with Gateway(config, clock=clock) as gw:
        await clock.settled(2)
        for _ in range(3):
            clock.advance(1800)
            await clock.settled(2)
        assert gw.heartbeat is not None and gw.heartbeat.last is not None
        assert gw.heartbeat.last == (START + timedelta(minutes=90),
                                     "skipped: HEARTBEAT.md has no tasks")
    assert llm.calls == 0


async def test_a_heartbeat_is_skipped_while_the_target_chat_is_busy(make_config: MakeConfig,
                                                                    llm: ScriptedLLM) -> None:
    config = heartbeat_config(make_config, TASKS)
    clock = FakeClock(START)
    gate = asyncio.Event()

    async def slow(body: dict[str, Any]) -> str:
        await gate.wait()
        return "finished the long job"

    llm.respond_with(slow)
    async with Gateway(config, clock=clock) as gw:
        await clock.settled(2)
        await gw.local.inject("c1", "do the long job")
        await llm.wait_for_requests(1)
        clock.advance(1800)
        await clock.settled(2)
        assert gw.heartbeat is not None and gw.heartbeat.last is not None
        assert gw.heartbeat.last[1] == "skipped: local:c1 is busy"
        gate.set()
        [reply] = await records(gw, wait=10)
        assert reply["text"] == "finished the long job"
    assert llm.calls == 1


# the message tool --------------------------------------------------------------------------

async def test_the_message_tool_reports_a_failed_delivery(make_config: MakeConfig,
                                                          llm: ScriptedLLM) -> None:
    platform = ScriptedChannel()
    platform.results = [Delivery(ok=False, error="Forbidden: bot was blocked by the user",
                                 permanent=True)]
    llm.tool_call("message", {"text": "Here is the report."}).reply("I could not send it.")
    async with Gateway(make_config(), channels=[platform]) as gw:
        await gw.bus.publish_inbound(inbound("send me the report"))
        await platform.wait_sent(1)
        assert [m.text for m in platform.sent] == ["I could not send it."]
        assert gw.store is not None
        [dead] = await gw.store.dead_letters()
        assert dead["last_error"] == "Forbidden: bot was blocked by the user"
    tool_result = llm.last_request["messages"][-1]
    assert tool_result["role"] == "tool"
    assert "NOT delivered to platform:c1" in tool_result["content"]
    assert "bot was blocked" in tool_result["content"]


async def test_no_double_reply_when_the_message_tool_answered(make_config: MakeConfig,
                                                              llm: ScriptedLLM) -> None:
    llm.tool_call("message", {"text": "The answer is 42."}).reply("I sent you the answer.")
    config = make_config()
    async with Gateway(config) as gw:
        assert await gw.local.ask("c1", "what is the answer?") == "The answer is 42."
    # stop() let the turn finish and flushed the outbox: the final reply was not sent
    assert [r["text"] for r in await records(gw)] == ["The answer is 42."]
    conversation = await stored(config, "local:c1")
    assert conversation[-1] == ("assistant", "I sent you the answer.")
