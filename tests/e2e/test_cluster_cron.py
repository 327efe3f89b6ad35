"""Cron across several gateway processes on one PostgreSQL store (issue 19): a job fires
once whichever processes run, and the cron tool works on every process (not only where the
scheduler runs). Real ``parley gateway`` subprocesses; outcomes read from the records and the
database, waited on with bounded loops (``test_cluster``'s helpers)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import psycopg
import pytest

from tests.e2e.test_cluster import Processes, _config
from tests.fakes.openai_server import ScriptedLLM


@pytest.mark.timeout(180)
async def test_a_job_due_once_fires_once_across_three_processes(
        tmp_path: Path, llm: ScriptedLLM, postgres_url: str) -> None:
    from gateway.kernel.clock import SystemClock
    from gateway.kernel.cron_jobs import CronJobs, NewJob
    from gateway.kernel.store import Store

    store = await Store.open(postgres_url)
    try:
        jobs = CronJobs(store, clock=SystemClock(), timezone="UTC")
        await jobs.ensure()
        await jobs.add(NewJob("tea", "tea time", "at", "1s", "local", "c1"))
    finally:
        await store.close()
    gateways = Processes()
    bases = gateways.bases
    try:
        for n in range(3):
            await gateways.start(_config(tmp_path, llm, postgres_url, f"gw{n}",
                                         cron={"poll_interval": "0.2s"}))
        async with aiohttp.ClientSession() as http:
            async def records(wait: str = "0") -> list[str]:
                out: list[str] = []
                for base in bases:  # each waits up to ``wait`` s for a record (long poll)
                    async with http.get(f"{base}/v1/messages",
                                        params={"chat_id": "c1", "wait": wait}) as resp:
                        out += [m["text"] for m in (await resp.json())["messages"]]
                return out

            async def health(base: str) -> dict[str, Any]:
                async with http.get(f"{base}/v1/health") as resp:
                    return dict(await resp.json())

            for _ in range(20):  # bounded: at most 20 rounds of three 1 s long polls
                if await records("1"):
                    break
            states = [await health(base) for base in bases]
            assert "tea time" in await records()
            members = states[-1]["cluster"]["processes"]  # started last: sees all three
            leaders = [m for m in members if "schedules" in m["leads"]]
            assert len(members) == 3 and len(leaders) == 1
    finally:
        await gateways.stop()
    async with await psycopg.AsyncConnection.connect(postgres_url) as conn:
        cur = await conn.execute("SELECT COUNT(*) FROM cron_runs")
        assert await cur.fetchone() == (1,)


@pytest.mark.timeout(180)
async def test_a_reminder_added_on_a_process_without_the_schedules_fires_once(
        tmp_path: Path, llm: ScriptedLLM, postgres_url: str) -> None:
    """The cron tool works on every process, not only where the scheduler runs; the job it
    adds wakes that process at once (``parley_cron``), not at its next poll (an hour here)."""
    gateways = Processes()
    try:
        for n in range(2):
            await gateways.start(_config(tmp_path, llm, postgres_url, f"gw{n}",
                                         cron={"poll_interval": "1h"}))
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{gateways.bases[1]}/v1/health") as resp:
                members = (await resp.json())["cluster"]["processes"]
            [leader] = [m["pid"] for m in members if "schedules" in m["leads"]]
            pids = [proc.pid for proc in gateways.procs]
            other = gateways.bases[1 - pids.index(leader)]
            llm.tool_call("cron", {"action": "add", "message": "tea time", "at": "1s"})
            llm.reply("I'll remind you.")
            async with http.post(f"{other}/v1/messages", json={
                    "chat_id": "c1", "sender_id": "me", "text": "remind me of tea"}) as resp:
                assert resp.status == 202
            texts: list[str] = []
            after = 0
            for _ in range(20):  # bounded: 20 long polls of up to 2 s; the records decide
                async with http.get(f"{other}/v1/messages", params={
                        "chat_id": "c1", "after": str(after), "wait": "2"}) as resp:
                    data = await resp.json()
                texts += [m["text"] for m in data["messages"]]
                after = data["next"]
                if {"tea time", "I'll remind you."} <= set(texts):
                    break
            # each once, in either order: "at 1s" is due within the second it was added in,
            # which may be before the turn's own answer is stored
            assert sorted(texts) == ["I'll remind you.", "tea time"]
            assert "next run" in llm.last_request["messages"][-1]["content"]
    finally:
        await gateways.stop()
    async with await psycopg.AsyncConnection.connect(postgres_url) as conn:
        cur = await conn.execute("SELECT COUNT(*) FROM cron_runs")
        assert await cur.fetchone() == (1,)
