"""Chat platform connections on several gateway processes (issue 19): one Discord gateway
websocket per bot token (a leader lease; the others send over REST on standby and take the
connection over), Telegram's webhook served by every process (a retried update stored and
answered once), and health / ``parley status`` naming who holds which connection.

Two ``Gateway`` objects in this test process share one PostgreSQL database and one fake
platform; the kill of a real process is in ``test_discord_connection_is_taken_over_after_a_
kill``. Nothing is decided by the clock: the tests wait for what the fakes saw.
"""

from __future__ import annotations

import signal
import socket
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gateway.app import Gateway
from gateway.kernel.events import OutboundMessage
from tests.conftest import MakeConfig
from tests.e2e.test_cluster import Processes, _config, _wait_outbox_delivered
from tests.e2e.waiting import until
from tests.fakes.discord_server import FakeDiscord
from tests.fakes.openai_server import ScriptedLLM
from tests.fakes.postgres import renewals_held

ADA_ID = 310000000000001001


def _discord(dc: FakeDiscord) -> dict[str, Any]:
    return {"enabled": True, "token": dc.token, "api_base": dc.api_base,
            "typing_interval": "0.1s", "connect_timeout": "10s", "allow_from": [str(ADA_ID)]}


def _gateways(make_config: MakeConfig, postgres_url: str, tmp_path: Path,
              channels: list[dict[str, Any]]) -> list[Gateway]:
    return [Gateway(make_config(database=postgres_url, cluster={"lease": "5s"},
                                data_dir=str(tmp_path / f"data{n}"),
                                channels={"local": {"enabled": False}, **extra,
                                          "delivery": {"backoff": "0.1s"}}), grace=2.0)
            for n, extra in enumerate(channels)]


async def _two_discord_gateways(make_config: MakeConfig, postgres_url: str, tmp_path: Path,
                                dc: FakeDiscord) -> tuple[Any, Any, list[Gateway]]:
    """Ada, her DM channel, and two started gateways with the same bot, one connected."""
    ada = dc.user(ADA_ID, "ada", global_name="Ada")
    dm = dc.dm_channel(ada)
    gateways = _gateways(make_config, postgres_url, tmp_path, [{"discord": _discord(dc)}] * 2)
    for gw in gateways:
        await gw.start()
    await dc.wait_for(lambda: dc.connected)
    return ada, dm, gateways


def _holders(health: dict[str, Any], prefix: str) -> list[str]:
    """The processes health says hold a connection whose lease starts with ``prefix``."""
    return [p["id"] for p in health["cluster"]["processes"]
            if any(lead.startswith(prefix) for lead in p["leads"])]


async def test_one_process_holds_the_discord_gateway_and_another_takes_it_over(
        make_config: MakeConfig, llm: ScriptedLLM, postgres_url: str, tmp_path: Path,
        dc: FakeDiscord) -> None:
    """Two gateways with the same bot: exactly one gateway websocket session at any time (the
    fake counts the sessions open at once), the other sends over REST; a message is answered
    once; the holder stops and the other connects, reads back and answers."""
    llm.echo()
    ada, dm, gateways = await _two_discord_gateways(make_config, postgres_url, tmp_path, dc)
    try:
        channels = [gw.manager.channels["discord"] for gw in gateways]
        standby = [gw for gw, ch in zip(gateways, channels, strict=True)
                   if ch.status().detail["standby"]]
        assert len(standby) == 1  # the other holds the connection
        holder = next(gw for gw in gateways if gw is not standby[0])
        other = standby[0]
        status = other.manager.channels["discord"].status()
        assert status.state == "connected" and "standby" in (status.reason or "")

        dc.post(dm, ada, "one")
        [first] = await dc.wait_sent(dm["id"], 1)
        assert first.content == "echo: one"
        # the standby process sends over REST (no websocket of its own)
        sent = await other.manager.channels["discord"].send(OutboundMessage(
            channel="discord", chat_id=dm["id"], text="from standby"))
        assert sent.ok
        worker = holder.cluster_worker
        assert worker is not None
        await worker._look()  # what each renewal reads (not waited for here)
        health = holder.health()
        assert _holders(health, "discord:") == [worker.me]
        assert dc.token not in str(health)  # the lease is named by a hash of the token
        assert health["cluster"]["connections"][_lease_of(health, "discord:")] == worker.me

        await holder.stop()  # closes its websocket, then hands the lease back
        dc.post(dm, ada, "two")  # said while the connection changes hands: read back
        texts = [s.content for s in await dc.wait_sent(dm["id"], 3, timeout=30)]
        assert texts == ["echo: one", "from standby", "echo: two"]
        await dc.wait_for(lambda: dc.connected)
        assert not other.manager.channels["discord"].status().detail["standby"]
        assert dc.most_sessions == 1  # never two gateway sessions of the bot at once
    finally:
        for gw in gateways:
            await gw.stop()
    assert [s.content for s in dc.sent_to(dm["id"])] == \
        ["echo: one", "from standby", "echo: two"]


async def test_a_discord_holder_whose_lease_renewals_hang_closes_its_websocket_first(
        make_config: MakeConfig, llm: ScriptedLLM, postgres_url: str, tmp_path: Path,
        dc: FakeDiscord) -> None:
    """The holder's renewals hang (its process row locked): it closes its websocket (and
    stops the schedules) before the other may take the connection over, so there is never a
    second session; the other connects and answers."""
    llm.echo()
    ada, dm, gateways = await _two_discord_gateways(make_config, postgres_url, tmp_path, dc)
    try:
        holder, other = gateways
        worker = holder.cluster_worker
        assert worker is not None and not holder.manager.channels["discord"].standby
        async with renewals_held(postgres_url, worker.me):
            await dc.wait_for(lambda: not other.manager.channels["discord"].standby
                              and dc.connected, timeout=30)
            assert holder.manager.channels["discord"].standby
            assert holder.retention is None  # its schedules given up too
            await until(lambda: other.retention is not None, "the other to run the schedules")
            dc.post(dm, ada, "one")
            [first] = await dc.wait_sent(dm["id"], 1, timeout=30)
            assert first.content == "echo: one"
        assert dc.most_sessions == 1
    finally:
        for gw in gateways:
            await gw.stop()
    assert [s.content for s in dc.sent_to(dm["id"])] == ["echo: one"]


def _lease_of(health: dict[str, Any], prefix: str) -> str:
    return next(name for name in health["cluster"]["connections"] if name.startswith(prefix))


@pytest.mark.timeout(180)
async def test_discord_connection_is_taken_over_after_a_kill(
        tmp_path: Path, llm: ScriptedLLM, postgres_url: str, dc: FakeDiscord) -> None:
    """Two real ``parley gateway`` processes: the one holding the websocket is killed with
    SIGKILL; the other connects once its lease ran out and answers what was said since."""
    llm.echo()
    ada = dc.user(ADA_ID, "ada", global_name="Ada")
    dm = dc.dm_channel(ada)
    gateways = Processes()
    procs, bases = gateways.procs, gateways.bases
    try:
        for n in range(2):
            await gateways.start(_config(tmp_path, llm, postgres_url, f"gw{n}",
                                         channels={"discord": _discord(dc)}))
        await dc.wait_for(lambda: dc.connected, timeout=30)
        dc.post(dm, ada, "one")
        await dc.wait_sent(dm["id"], 1, timeout=30)
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{bases[0]}/v1/health") as resp:
                health = await resp.json()
        [holder_id] = _holders(health, "discord:")
        leader = next(i for i, p in enumerate(procs) if f":{p.pid}:" in holder_id)
        await _wait_outbox_delivered(postgres_url, 1)  # else it is sent again (at least once)
        procs[leader].send_signal(signal.SIGKILL)
        await procs[leader].wait()
        await dc.wait_for(lambda: not dc.connected, timeout=30)
        dc.post(dm, ada, "two")  # nobody connected: read back by the next holder
        sent = await dc.wait_sent(dm["id"], 2, timeout=60)
        assert [s.content for s in sent] == ["echo: one", "echo: two"]
        assert dc.most_sessions == 1
    finally:
        await gateways.stop()
    assert [s.content for s in dc.sent_to(dm["id"])] == ["echo: one", "echo: two"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_a_telegram_webhook_update_delivered_to_two_processes_is_answered_once(
        make_config: MakeConfig, llm: ScriptedLLM, postgres_url: str, tmp_path: Path) -> None:
    """``mode: webhook`` on two processes behind one address: Telegram delivers to one, its
    retry of the same update lands on the other; stored once (the update's message is already
    in the inbox), answered once, and the next update to either is answered in order."""
    from tests.fakes.telegram_server import FakeTelegram

    llm.echo()
    ports = [_free_port(), _free_port()]
    async with FakeTelegram() as tg:
        ada = tg.user(1001, "Ada", username="ada")
        url = f"http://127.0.0.1:{ports[0]}/tg"  # the load balancer's address: process 0
        telegram = [{"telegram": {
            "enabled": True, "token": tg.token, "base_url": tg.base_url,
            "base_file_url": tg.base_file_url, "mode": "webhook", "webhook_url": url,
            "webhook_secret": "s3cret_value", "webhook_port": port,
            "allow_from": [str(ada["id"])]}} for port in ports]
        gateways = _gateways(make_config, postgres_url, tmp_path, telegram)
        for gw in gateways:
            await gw.start()
        try:
            tg.dm(ada, "one")
            update = dict(tg.updates[-1])  # queued; the fake delivers it to process 0
            [first] = await tg.wait_sent(ada["id"], 1, timeout=30)
            assert first.text == "echo: one"
            headers = {"X-Telegram-Bot-Api-Secret-Token": "s3cret_value"}
            async with aiohttp.ClientSession() as http:
                async with http.post(f"http://127.0.0.1:{ports[1]}/tg", json=update,
                                     headers=headers) as resp:
                    assert resp.status == 200  # taken (a repeat): Telegram stops retrying
                tg.dm(ada, "two")
                again = dict(tg.updates[-1])
                async with http.post(f"http://127.0.0.1:{ports[1]}/tg", json=again,
                                     headers=headers) as resp:
                    assert resp.status == 200
            # "two" came after the repeat, in the same chat: had the repeat been stored, its
            # answer would come first
            sent = await tg.wait_sent(ada["id"], 2, timeout=30)
            assert [s.text for s in sent] == ["echo: one", "echo: two"]
            assert not any(m == "getUpdates" for m, _ in tg.calls)
            assert sum(gw.bus.duplicates for gw in gateways) >= 1
        finally:
            for gw in gateways:
                await gw.stop()
        assert [s.text for s in tg.sent if s.chat_id == ada["id"]] == ["echo: one", "echo: two"]


@pytest.mark.timeout(180)
async def test_status_shows_which_process_holds_which_connection(
        tmp_path: Path, llm: ScriptedLLM, postgres_url: str, dc: FakeDiscord) -> None:
    """``parley status`` (through a process's local channel): every process, and who holds
    the Discord bot's gateway connection and the schedules (named by a hash, not the token)."""
    from gateway.cluster import connection_lease
    from tests.e2e.test_cli import parley

    gateways = Processes()
    configs = [_config(tmp_path, llm, postgres_url, f"gw{n}", channels={
        "local": {"port": _free_port()}, "discord": _discord(dc)}) for n in range(2)]
    try:
        for path in configs:
            await gateways.start(path)
        await dc.wait_for(lambda: dc.connected, timeout=30)
        code, out, err = await parley("status", "--config", str(configs[1]))
    finally:
        await gateways.stop()
    assert code == 0, err
    first, second = (f":{p.pid}:" for p in gateways.procs)
    lines = out.splitlines()
    assert any(line.startswith("cluster:  2 process(es); this one") and second in line
               for line in lines), out
    held = {line.split(" is held by ")[0].strip(): line.split(" is held by ")[1]
            for line in lines if " is held by " in line}
    assert set(held) == {connection_lease("discord", dc.token), "schedules"}, out
    assert all(first in holder for holder in held.values())  # started first: took both
    assert dc.token not in out
    [mine] = [line for line in lines if "(this one)" in line]
    assert second in mine and "holds no connection" in mine


async def test_a_telegram_poller_whose_lease_renewals_hang_stops_polling_first(
        make_config: MakeConfig, llm: ScriptedLLM, postgres_url: str, tmp_path: Path) -> None:
    """As for Discord: the poller whose renewals hang stops polling before the other may take
    the bot over (the fake Bot API answers a second concurrent getUpdates with 409: none)."""
    from tests.fakes.telegram_server import FakeTelegram

    llm.echo()
    async with FakeTelegram() as tg:
        ada = tg.user(1001, "Ada", username="ada")
        telegram = {"telegram": {
            "enabled": True, "token": tg.token, "base_url": tg.base_url,
            "base_file_url": tg.base_file_url, "poll_timeout": "1s", "watchdog": "10s",
            "allow_from": [str(ada["id"])]}}
        gateways = _gateways(make_config, postgres_url, tmp_path, [telegram] * 2)
        for gw in gateways:
            await gw.start()
        holder, other = gateways
        try:
            channels = [gw.manager.channels["telegram"] for gw in gateways]
            await tg.wait_for(lambda: tg.completed_polls > 0, timeout=30)
            assert not channels[0].standby and channels[1].standby
            worker = holder.cluster_worker
            assert worker is not None
            async with renewals_held(postgres_url, worker.me):
                await channels[1].wait_until(lambda c: not c.standby, timeout=30)
                assert channels[0].standby
                tg.dm(ada, "one")
                [first] = await tg.wait_sent(ada["id"], 1, timeout=30)
                assert first.text == "echo: one"
            assert tg.conflicts == 0
        finally:
            for gw in gateways:
                await gw.stop()
        assert [s.text for s in tg.sent if s.chat_id == ada["id"]] == ["echo: one"]
