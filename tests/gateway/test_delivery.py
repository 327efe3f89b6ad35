"""``ChannelManager.deliver_now``: the message tool's delivery, with the real result."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from channels import local
from channels.base import ChannelDeps
from channels.webchat_store import WebchatLog
from gateway.delivery import ChannelManager
from gateway.kernel.bus import MessageBus
from gateway.kernel.config import DeliveryConfig, parse_config
from gateway.kernel.events import OutboundMessage
from gateway.kernel.store import Store
from gateway.kernel.values import Delivery, OutboxMark
from tests.e2e.test_durability import ScriptedChannel


@pytest.fixture
async def manager(tmp_path: Path) -> AsyncIterator[ChannelManager]:
    store = await Store.open(tmp_path / "parley.db")
    bus = MessageBus()
    bus.attach_store(store, DeliveryConfig().ttl)
    mgr = ChannelManager(bus, DeliveryConfig(backoff=0.001, max_backoff=0.01))
    mgr.add(ScriptedChannel())
    await mgr.start(store)
    yield mgr
    await mgr.stop()
    await store.close()


def msg(text: str = "hi") -> OutboundMessage:
    return OutboundMessage(channel="platform", chat_id="c1", text=text)


async def status(mgr: ChannelManager, m: OutboundMessage) -> tuple[str, int, str | None]:
    assert mgr.store is not None
    row = await mgr.store.fetchone(
        "SELECT status, attempts, last_error FROM outbox WHERE idempotency_key = ?",
        (m.idempotency_key,))
    return row[0], row[1], row[2]


def platform(mgr: ChannelManager) -> ScriptedChannel:
    channel = mgr.channels["platform"]
    assert isinstance(channel, ScriptedChannel)
    return channel


async def test_delivered_after_a_quick_retry(manager: ChannelManager) -> None:
    platform(manager).results = [Delivery(ok=False, error="HTTP 502")]
    m = msg()
    delivery = await manager.deliver_now(m)
    assert delivery.ok
    assert [s.text for s in platform(manager).sent] == ["hi"]
    assert await status(manager, m) == ("delivered", 2, None)


async def test_a_permanent_failure_is_reported_at_once_and_never_sent_later(
        manager: ChannelManager) -> None:
    platform(manager).results = [Delivery(ok=False, error="chat not found", permanent=True)]
    m = msg()
    delivery = await manager.deliver_now(m)
    assert (delivery.ok, delivery.error) == (False, "chat not found")
    assert platform(manager).tries == 1
    assert await status(manager, m) == ("dead", 1, "chat not found")
    assert manager.store is not None
    assert await manager.store.outbox_pending() == []


async def test_gives_up_after_the_last_try(manager: ChannelManager) -> None:
    platform(manager).results = [Delivery(ok=False, error="HTTP 500")] * 5
    m = msg()
    delivery = await manager.deliver_now(m, attempts=3)
    assert (delivery.ok, delivery.error) == (False, "HTTP 500")
    assert platform(manager).tries == 3
    assert await status(manager, m) == ("dead", 3, "HTTP 500")


async def test_a_channel_that_is_not_running(manager: ChannelManager) -> None:
    m = OutboundMessage(channel="discord", chat_id="c1", text="hi")
    delivery = await manager.deliver_now(m)
    assert not delivery.ok and "no channel 'discord'" in (delivery.error or "")
    assert (await status(manager, m))[0] == "dead"


async def test_a_send_that_hangs_is_cut_off_at_the_deadline(manager: ChannelManager) -> None:
    platform(manager).gate = asyncio.Event()  # never set: the platform never answers
    m = msg()
    delivery = await manager.deliver_now(m, within=0.2)
    assert (delivery.ok, delivery.error) == (False, "no answer from platform within 0.2s")
    assert platform(manager).tries == 1  # no time was left for another try
    assert await status(manager, m) == ("dead", 1, "no answer from platform within 0.2s")


async def test_an_unknown_outcome_is_resent_once(manager: ChannelManager) -> None:
    platform(manager).results = [Delivery(ok=False, error="read timed out", unknown=True)]
    m = msg()
    assert (await manager.deliver_now(m)).ok
    assert platform(manager).tries == 2 and [s.text for s in platform(manager).sent] == ["hi"]
    assert await status(manager, m) == ("delivered", 2, None)


async def test_a_second_unknown_outcome_is_not_resent(manager: ChannelManager) -> None:
    platform(manager).results = [Delivery(ok=False, error="read timed out", unknown=True)] * 2
    m = msg()
    delivery = await manager.deliver_now(m, attempts=5)
    assert not delivery.ok and platform(manager).tries == 2  # the try and one resend, no more
    state, attempts, error = await status(manager, m)
    assert (state, attempts) == ("dead", 2)
    assert error is not None and error.startswith("outcome unknown twice")



async def test_the_local_channel_marks_its_outbox_row_in_the_reply_logs_write(
        tmp_path: Path, manager: ChannelManager) -> None:
    """A reply to the local channel is stored in its reply log and its outbox row marked
    delivered in one transaction (``send_marked``): both or neither. Here the outbox row
    refuses its first update: the reply is not in the log either, and the retry stores both."""
    store = manager.store
    assert store is not None
    config = parse_config({"workspace": str(tmp_path / "ws"), "data_dir": str(tmp_path),
                           "channels": {"local": {"port": 0}}}, env={})
    channel = local.create(ChannelDeps(config=config, bus=manager.bus, store=store,
                                       data_path=config.data_path, health=dict))
    await channel.start()
    manager.add(channel)
    updates: list[int] = []

    def refuse_the_first() -> int:
        updates.append(1)
        return int(len(updates) == 1)

    await store._write(lambda db: (  # on the connection the delivery's writes use too
        db.create_function("refuse_the_first", 0, refuse_the_first),
        db.execute("CREATE TEMP TRIGGER refuse BEFORE UPDATE ON main.outbox "
                   "WHEN refuse_the_first() BEGIN SELECT RAISE(ABORT, 'outbox refused'); END")))
    m = OutboundMessage(channel="local", chat_id="c9", text="answered")
    delivery = await manager.deliver_now(m)
    assert delivery.ok and delivery.recorded
    assert await status(manager, m) == ("delivered", 2, None)
    rows = await store.fetchall("SELECT chat_id FROM local_replies", ())
    assert [r[0] for r in rows] == ["c9"]  # once: the refused try stored nothing
    found, _ = await channel.wait_messages("c9", after=0, timeout=0)
    assert [r["text"] for r in found] == ["answered"]
    await channel.stop()


async def test_the_webchat_log_marks_the_outbox_row_in_the_same_write(
        manager: ChannelManager) -> None:
    """WebChat's answers are logged the same way (``WebchatLog.add(mark=...)``): a refused
    outbox update leaves no log entry behind; the next try writes both."""
    store = manager.store
    assert store is not None
    log = WebchatLog(store)
    await log.ensure_schema()
    m = OutboundMessage(channel="webchat", chat_id="w1", text="answered")
    await store.outbox_add(m, m.created_at)
    await store._write(lambda db: db.execute(
        "CREATE TEMP TRIGGER refuse BEFORE UPDATE ON main.outbox "
        "BEGIN SELECT RAISE(ABORT, 'outbox refused'); END"))
    with pytest.raises(sqlite3.IntegrityError):
        await log.add(chat_id="w1", role="assistant", kind="reply", text=m.text,
                      key=m.idempotency_key, mark=OutboxMark(m.idempotency_key, 1))
    assert await log.find(m.idempotency_key) is None
    assert (await status(manager, m))[0] == "pending"
    await store._write(lambda db: db.execute("DROP TRIGGER temp.refuse"))
    entry, new = await log.add(chat_id="w1", role="assistant", kind="reply", text=m.text,
                               key=m.idempotency_key, mark=OutboxMark(m.idempotency_key, 2))
    assert new and entry.text == "answered"
    assert await status(manager, m) == ("delivered", 2, None)
