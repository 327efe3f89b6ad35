"""Several gateway processes on one PostgreSQL store (issue 19): real ``parley gateway``
subprocesses, the scripted model on loopback, one of them killed with SIGKILL mid-run.

Outcomes are read from the database (every inbound message done, each chat's answers once and
in order in its session and its delivered outbox) after waiting on that state with ``until``;
the lease is short (configured) so the takeover happens quickly, but nothing is decided by a
clock: the test waits for the rows, bounded.
"""

from __future__ import annotations

import asyncio
import signal
from collections import defaultdict
from pathlib import Path
from typing import Any

import aiohttp
import psycopg
import pytest
import yaml

from tests.e2e.test_durability import _drain_stderr, _start_gateway
from tests.fakes.openai_server import ScriptedLLM
from tests.fakes.openai_wire import Gate

CHATS, PER_CHAT = 100, 20


def _config(tmp_path: Path, llm: ScriptedLLM, database: str, name: str,
            **extra: Any) -> Path:
    """A gateway's config in ``tmp_path/name``; ``extra``: more top-level sections (and
    ``channels`` beside the local one)."""
    folder = tmp_path / name
    folder.mkdir()
    path = folder / "config.yaml"
    channels = {"local": {"port": 0}, **extra.pop("channels", {})}
    path.write_text(yaml.safe_dump({
        "workspace": "../ws", "data_dir": "data", "database": database,
        "cluster": {"lease": "5s"},
        "agent": {"model": "openai/test-model", "api_base": llm.base_url, "api_key": "k",
                  "queue_mode": "followup", "max_concurrent_turns": 16},
        "channels": channels, **extra}))
    return path


class Watch:
    """The store's state, read on a separate connection."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.state: dict[str, int] = {}

    async def refresh(self) -> None:
        async with await psycopg.AsyncConnection.connect(self.url) as conn:
            cur = await conn.execute(
                "SELECT status, claimed_by IS NOT NULL, COUNT(*) FROM inbox GROUP BY 1, 2")
            rows = await cur.fetchall()
        self.state = defaultdict(int)
        for status, claimed, n in rows:
            self.state[status] += n
            if status == "pending" and claimed:
                self.state["claimed"] += n

    async def claimed_by(self, pid: int) -> int:
        async with await psycopg.AsyncConnection.connect(self.url) as conn:
            cur = await conn.execute(
                "SELECT COUNT(*) FROM inbox WHERE status = 'pending' AND claimed_by LIKE %s",
                (f"%:{pid}:%",))
            row = await cur.fetchone()
        return int(row[0]) if row else 0


async def _wait_db(watch: Watch, condition: Any, what: str, timeout: float) -> None:
    """``until`` over the database's state, refreshed between looks."""
    async def poll() -> None:
        while True:
            await watch.refresh()
            if condition(watch.state):
                return
            await asyncio.sleep(0.05)  # paces the reads; the condition decides
    try:
        await asyncio.wait_for(poll(), timeout)
    except TimeoutError:
        raise AssertionError(f"still waiting after {timeout}s for {what}: "
                             f"{dict(watch.state)}") from None


async def _wait_outbox_delivered(url: str, n: int) -> None:
    for _ in range(1200):  # bounded; the rows decide
        async with await psycopg.AsyncConnection.connect(url) as conn:
            cur = await conn.execute("SELECT COUNT(*) FROM outbox WHERE status = 'delivered'")
            row = await cur.fetchone()
        if row and row[0] >= n:
            return
        await asyncio.sleep(0.05)
    pytest.fail(f"fewer than {n} replies recorded as delivered")


async def _answers(url: str) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """Each chat's answers as its session holds them, and as its outbox delivered them."""
    async with await psycopg.AsyncConnection.connect(url) as conn:
        cur = await conn.execute(
            "SELECT s.key, m.body::json->>'content' FROM messages m JOIN sessions s "
            "ON s.id = m.session_id WHERE m.role = 'assistant' ORDER BY m.id")
        sessions: dict[str, list[str]] = defaultdict(list)
        for key, text in await cur.fetchall():
            sessions[key.split(":", 1)[1]].append(text)
        cur = await conn.execute(
            "SELECT chat_id, payload::json->>'text', status FROM outbox ORDER BY id")
        outbox: dict[str, list[str]] = defaultdict(list)
        for chat, text, status in await cur.fetchall():
            outbox[chat].append(text if status == "delivered" else f"{status}: {text}")
    return sessions, outbox


async def _wait_running(base: str) -> None:
    """Until the process's health says it runs (its cluster tables made, its lease taken):
    "listening on" is logged as its local channel starts, before that."""
    async with aiohttp.ClientSession() as http:
        for _ in range(600):  # bounded; the health decides
            async with http.get(f"{base}/v1/health") as resp:
                if (await resp.json()).get("gateway") == "running":
                    return
            await asyncio.sleep(0.05)
    pytest.fail(f"{base} never said it runs")


class Processes:
    """The ``parley gateway`` subprocesses of one test: each started until its health says
    it runs, its log kept beside its config; ``stop`` ends them all."""

    def __init__(self) -> None:
        self.procs: list[asyncio.subprocess.Process] = []
        self.bases: list[str] = []
        self._drains: list[asyncio.Task[None]] = []

    async def start(self, path: Path) -> str:
        proc, base = await _start_gateway(path)
        self.procs.append(proc)
        self.bases.append(base)
        self._drains.append(asyncio.create_task(_drain_stderr(proc, path.with_suffix(".log"))))
        await _wait_running(base)
        return base

    async def stop(self) -> None:
        """SIGTERM every process still running and wait for each (bounded); one that does not
        stop is killed (no orphan outlives the test) and the test fails naming it."""
        for proc in self.procs:
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
        stuck: list[int] = []
        for proc in self.procs:
            try:
                await asyncio.wait_for(proc.wait(), 60)
            except TimeoutError:
                stuck.append(proc.pid)
                proc.kill()
                await proc.wait()
        await asyncio.wait_for(asyncio.gather(*self._drains, return_exceptions=True), 30)
        assert not stuck, f"gateway process(es) {stuck} did not stop on SIGTERM"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("processes", [2, 3])
async def test_kill_9_of_one_process_loses_and_repeats_nothing(
        tmp_path: Path, llm: ScriptedLLM, postgres_url: str, processes: int) -> None:
    """The victim starts alone and takes half the chats; then the others start and the first
    half of every chat's messages go to any process, with the model's answers held: the victim
    certainly holds messages it has not answered when it is killed (not a matter of timing).
    The rest go to the survivors."""
    llm.echo()
    gateways = Processes()
    procs, bases = gateways.procs, gateways.bases

    async def start(n: int) -> None:
        await gateways.start(_config(tmp_path, llm, postgres_url, f"gw{n}"))

    watch = Watch(postgres_url)
    try:
        await start(0)
        victim = procs[0]
        async with aiohttp.ClientSession() as http:
            async def post(base: str, chat: int, i: int) -> None:
                body = {"chat_id": f"chat{chat}", "sender_id": "u1", "text": f"{chat}:{i}",
                        "message_id": f"{chat}-{i}"}
                async with http.post(f"{base}/v1/messages", json=body) as resp:
                    assert resp.status == 202, await resp.text()

            async def feed(chat: int, first: int, last: int, to: list[str]) -> None:
                for i in range(first, last):  # in order within a chat, any process
                    await post(to[(chat + i) % len(to)], chat, i)

            mine = CHATS // 2  # the victim alone: it holds these chats from now on
            await asyncio.gather(*(feed(c, 0, 1, bases) for c in range(mine)))
            await _wait_db(watch, lambda s: s["done"] == mine, "the victim's first answers", 60)
            for n in range(1, processes):
                await start(n)
            gate = Gate()
            llm.echo(gate=gate)  # answers held: claimed messages stay unanswered
            half = PER_CHAT // 2
            await asyncio.gather(*(feed(c, 1 if c < mine else 0, half, bases)
                                   for c in range(CHATS)))
            pid = victim.pid
            for _ in range(2000):  # bounded; the rows decide
                if await watch.claimed_by(pid) > 0:
                    break
                await asyncio.sleep(0.01)
            else:
                pytest.fail("the victim never claimed its chats' messages")
            victim.send_signal(signal.SIGKILL)
            await victim.wait()
            gate.release()

            await asyncio.gather(*(feed(c, half, PER_CHAT, bases[1:]) for c in range(CHATS)))
            await _wait_db(watch, lambda s: s["done"] == CHATS * PER_CHAT and not s["pending"],
                           "every message answered", 150)
            await _wait_outbox_delivered(postgres_url, CHATS * PER_CHAT)
            survivors = bases[1:]
            async with http.get(f"{survivors[0]}/v1/health") as resp:
                cluster = (await resp.json())["cluster"]
        sessions, outbox = await _answers(postgres_url)
    finally:
        await gateways.stop()

    assert len(sessions) == CHATS
    for c in range(CHATS):
        wanted = [f"echo: {c}:{i}" for i in range(PER_CHAT)]
        assert sessions[f"chat{c}"] == wanted, f"chat{c}'s session"
        assert outbox[f"chat{c}"] == wanted, f"chat{c}'s delivered replies"
    assert cluster["taking_work"] and cluster["processes"]
    assert all({"chats", "inbox_claimed", "outbox_pending"} <= p.keys()
               for p in cluster["processes"])
    assert all(q.returncode == 0 for q in procs[1:])  # the survivors stopped cleanly


@pytest.mark.timeout(180)
async def test_one_process_polls_a_telegram_bot_and_another_takes_over_after_a_kill(
        tmp_path: Path, llm: ScriptedLLM, postgres_url: str) -> None:
    from tests.fakes.telegram_server import FakeTelegram

    llm.echo()
    async with FakeTelegram() as tg:
        ada = tg.user(1001, "Ada", username="ada")
        gateways = Processes()
        procs, bases = gateways.procs, gateways.bases
        telegram = {"enabled": True, "token": tg.token, "base_url": tg.base_url,
                    "base_file_url": tg.base_file_url, "poll_timeout": "1s",
                    "watchdog": "10s", "allow_from": [str(ada["id"])]}
        try:
            for n in range(2):
                await gateways.start(_config(tmp_path, llm, postgres_url, f"gw{n}",
                                             channels={"telegram": telegram}))
            async with aiohttp.ClientSession() as http:
                async def cluster(base: str) -> dict[str, Any]:
                    async with http.get(f"{base}/v1/health") as resp:
                        return dict((await resp.json())["cluster"])

                tg.dm(ada, "one")
                [first] = await tg.wait_sent(ada["id"], 1, timeout=30)
                assert first.text == "echo: one"
                assert tg.conflicts == 0  # never two getUpdates of one token at a time
                members = (await cluster(bases[0]))["processes"]
                pollers = [m for m in members
                           if any(lead.startswith("telegram:") for lead in m["leads"])]
                assert len(pollers) == 1
                leader = next(i for i, p in enumerate(procs) if f":{p.pid}:" in pollers[0]["id"])
                # the reply is recorded as delivered first: a send the platform took but the
                # killed process had not yet recorded is sent again (at least once, there)
                await _wait_outbox_delivered(postgres_url, 1)
                procs[leader].send_signal(signal.SIGKILL)
                await procs[leader].wait()

                tg.dm(ada, "two")  # polled by the survivor once the lease ran out
                sent = await tg.wait_sent(ada["id"], 2, timeout=60)
                assert [s.text for s in sent] == ["echo: one", "echo: two"]
                survivor = bases[1 - leader]
                for _ in range(100):  # health shows the lease as of the last renewal
                    members = (await cluster(survivor))["processes"]
                    me = next(m for m in members if m["me"])
                    if any(lead.startswith("telegram:") for lead in me["leads"]):
                        break
                    await asyncio.sleep(0.1)
                else:
                    pytest.fail(f"the survivor's health never showed it polling: {members}")
        finally:
            await gateways.stop()


async def test_the_local_channel_answers_on_every_process(
        make_config: Any, llm: ScriptedLLM, postgres_url: str, tmp_path: Path) -> None:
    """Two gateways on one PostgreSQL: a message posted to either is answered once, and the
    answer is read, in order and with the same ``seq``, from both processes' local channel
    (whichever process ran the turn and stored the reply)."""
    from gateway.app import Gateway

    llm.echo()
    gateways = [Gateway(make_config(database=postgres_url, cluster={"lease": "5s"},
                                    data_dir=str(tmp_path / f"data{n}")), grace=2.0)
                for n in range(2)]
    for gw in gateways:
        await gw.start()
    try:
        bases = [gw.local.base_url for gw in gateways if gw.local is not None]
        assert len(bases) == 2
        async with aiohttp.ClientSession() as http:
            async def read(base: str, after: int, want: int) -> list[dict[str, Any]]:
                found: list[dict[str, Any]] = []
                for _ in range(60):  # bounded long polls; the records decide
                    async with http.get(f"{base}/v1/messages", params={
                            "chat_id": "c1", "wait": "1", "after": str(after)}) as resp:
                        body = await resp.json()
                    found += body["messages"]
                    after = body["next"]
                    if len(found) >= want:
                        return found
                pytest.fail(f"{base} showed {found}, not {want} replies")

            for i in range(4):  # posted to each process in turn
                body = {"chat_id": "c1", "sender_id": "u1", "text": f"m{i}",
                        "message_id": f"m{i}"}
                async with http.post(f"{bases[i % 2]}/v1/messages", json=body) as resp:
                    assert resp.status == 202, await resp.text()
                seen = [await read(base, 0, i + 1) for base in bases]
                assert seen[0] == seen[1]
                assert [r["text"] for r in seen[0]] == [f"echo: m{j}" for j in range(i + 1)]
            # health's queue depths: a message claimed and not yet answered is its holder's
            gate = llm.hold()
            llm.reply("held")
            async with http.post(f"{bases[0]}/v1/messages", json={
                    "chat_id": "c1", "sender_id": "u1", "text": "m4",
                    "message_id": "m4"}) as resp:
                assert resp.status == 202
            await llm.wait_in_flight(1)
            worker = gateways[0].cluster_worker
            assert worker is not None
            await worker._look()  # what each renewal reads (not waited for here)
            health = worker.health()
            assert health["unclaimed"] == 0
            assert sorted(p["inbox_claimed"] for p in health["processes"]) == [0, 1]
            gate.release()
            last = seen[0][-1]["seq"]
            assert [r["text"] for r in await read(bases[1], last, 1)] == ["held"]
    finally:
        for gw in gateways:
            await gw.stop()


async def test_webchat_answers_on_every_process(
        make_config: Any, llm: ScriptedLLM, postgres_url: str, tmp_path: Path) -> None:
    """Two gateways on one PostgreSQL, a page of one chat open on each: a message sent from
    either page is answered once, and the answer reaches both pages once, whichever process
    ran the turn."""
    from gateway.app import Gateway
    from tests.channels.webchat_page import CHAT, Page, channel_of, is_type

    llm.echo()
    gateways = [Gateway(make_config(
        database=postgres_url, cluster={"lease": "5s"}, data_dir=str(tmp_path / f"data{n}"),
        channels={"webchat": {"enabled": True, "port": 0}}), grace=2.0) for n in range(2)]
    for gw in gateways:
        await gw.start()
    try:
        async with aiohttp.ClientSession() as http:
            pages = [Page(http, str(channel_of(gw).base_url)) for gw in gateways]
            conns = [await page.connect() for page in pages]
            for i in range(4):  # sent from each page in turn
                await conns[i % 2].message(f"hello {i}", message_id=f"msg-0000000{i}")
                for conn in conns:
                    assert (await conn.reply())["text"] == f"echo: hello {i}"
            for conn in conns:  # nothing more came: each answer once on each page
                await conn.send(type="ping")
                await conn.until(is_type("pong"))
                answers = [f["message"]["text"] for f in conn.seen if f["type"] == "message"
                           and f["message"]["role"] == "assistant"]
                assert answers == [f"echo: hello {i}" for i in range(4)]
            history = await pages[1].history(CHAT)
            assert [m["text"] for m in history["messages"] if m["role"] == "assistant"] == \
                [f"echo: hello {i}" for i in range(4)]
    finally:
        for gw in gateways:
            await gw.stop()
