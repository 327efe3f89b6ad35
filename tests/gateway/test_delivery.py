"""``ChannelManager.deliver_now``: the message tool's delivery, with the real result; and
``send_with_turn``: a reply sent in its turn's own write."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import pytest

from channels import local
from channels.base import ChannelDeps
from channels.local import LocalChannel
from channels.webchat_store import WebchatLog
from channels.webchat_store import writer as webchat_writer
from gateway.delivery import ChannelManager
from gateway.kernel.bus import MessageBus
from gateway.kernel.config import DeliveryConfig, parse_config
from gateway.kernel.events import OutboundMessage
from gateway.kernel.store import NewMessage, Store
from gateway.kernel.values import Delivery, OutboxMark, TurnSend
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



async def local_channel(tmp_path: Path, manager: ChannelManager) -> LocalChannel:
    """The local channel, started on ``manager``'s store (its reply log there)."""
    assert manager.store is not None
    config = parse_config({"workspace": str(tmp_path / "ws"), "data_dir": str(tmp_path),
                           "channels": {"local": {"port": 0}}}, env={})
    channel = local.create(ChannelDeps(config=config, bus=manager.bus, store=manager.store,
                                       data_path=config.data_path, health=dict))
    await channel.start()
    manager.add(channel)
    return channel


async def refuse_once(store: Store, when: str, error: str) -> None:
    """The first statement ``when`` (``BEFORE UPDATE ON main.outbox``) fails with ``error``;
    the trigger lives on the connection the group-committed writes use."""
    refused: list[int] = []

    def first() -> int:
        refused.append(1)
        return int(len(refused) == 1)

    await store._write(lambda db: (
        db.create_function("refuse_the_first", 0, first),
        db.execute(f"CREATE TEMP TRIGGER refuse {when} WHEN refuse_the_first() "
                   f"BEGIN SELECT RAISE(ABORT, '{error}'); END")))


async def test_the_local_channel_marks_its_outbox_row_in_the_reply_logs_write(
        tmp_path: Path, manager: ChannelManager) -> None:
    """A reply to the local channel is stored in its reply log and its outbox row marked
    delivered in one transaction (``send_marked``): both or neither. Here the outbox row
    refuses its first update: the reply is not in the log either, and the retry stores both."""
    store = manager.store
    assert store is not None
    channel = await local_channel(tmp_path, manager)
    await refuse_once(store, "BEFORE UPDATE ON main.outbox", "outbox refused")
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

# --- a reply sent in the write of the turn that made it (``TurnSend``) ----------------------
# The local channel's and WebChat's sending is a write to our database, so the turn, its
# outbox row (stored delivered) and the channel's record land in one commit, or none of them
# does; and the delivery side offers that only when nothing is ahead of the reply in its chat.


async def save(store: Store, m: OutboundMessage, sent: TurnSend | None, turn_id: str) -> None:
    session = await store.active_session(f"{m.channel}:{m.chat_id}")
    await store.save_turn(session_id=session.id, turn_id=turn_id, inbound_id=None,
                          messages=[NewMessage({"role": "user", "content": "hi"}, 1)],
                          outbound=[(m, m.created_at + timedelta(minutes=10))], sent=sent)


async def test_a_reply_sent_with_its_turn_lands_with_it_or_not_at_all(
        tmp_path: Path, manager: ChannelManager) -> None:
    store = manager.store
    assert store is not None
    channel = await local_channel(tmp_path, manager)
    await refuse_once(store, "BEFORE INSERT ON main.local_replies", "log refused")
    m = OutboundMessage(channel="local", chat_id="c9", text="answered", turn_id="t1")
    sent = manager.send_with_turn(m)
    assert sent is not None and sent.key == m.idempotency_key
    with pytest.raises(Exception, match="log refused"):
        await save(store, m, sent, "t1")
    # the channel's record refused: the turn, its outbox row and its record are all absent
    assert await store.fetchall("SELECT id FROM turns", ()) == []
    assert await store.fetchall("SELECT status FROM outbox", ()) == []
    assert await store.fetchall("SELECT seq FROM local_replies", ()) == []

    await save(store, m, sent, "t1")  # the turn's write again (as a restart would)
    assert await store.fetchall("SELECT status, attempts, delivered_at IS NOT NULL FROM outbox",
                                ()) == [("delivered", 1, 1)]
    found, _ = await channel.wait_messages("c9", after=0, timeout=0)
    assert [(r["seq"], r["text"], r["turn_id"]) for r in found] == [(1, "answered", "t1")]
    assert manager.stats["local"].sent == 1
    assert await store.outbox_pending() == []  # nothing left for the delivery workers
    # the same reply again (a turn run twice): not stored twice, not shown twice
    assert manager.send_with_turn(m) is None  # the channel knows it was sent
    await channel.stop()


async def test_a_reply_stored_is_shown_though_its_turn_was_cancelled_meanwhile(
        tmp_path: Path, manager: ChannelManager) -> None:
    """``/stop`` or a shutdown landing while the turn's write commits: the write is not undone
    (a COMMIT cannot be), so what it stored is shown all the same (the store runs
    ``TurnSend.done()``, not the turn)."""
    store = manager.store
    assert store is not None
    channel = await local_channel(tmp_path, manager)
    m = OutboundMessage(channel="local", chat_id="c7", text="kept", turn_id="t3")
    sent = manager.send_with_turn(m)
    assert sent is not None
    write = sent.write

    def cancelling(db: object) -> object:  # the turn is cancelled while its batch runs
        turn.cancel()
        return write(db)

    sent.write = cancelling
    turn = asyncio.create_task(save(store, m, sent, "t3"))
    with pytest.raises(asyncio.CancelledError):
        await turn
    found, _ = await channel.wait_messages("c7", after=0, timeout=0)
    assert [r["text"] for r in found] == ["kept"]
    assert await store.fetchall("SELECT status FROM outbox", ()) == [("delivered",)]
    assert manager.stats["local"].sent == 1
    await channel.stop()


async def test_webchat_logs_a_reply_with_its_turn(manager: ChannelManager) -> None:
    store = manager.store
    assert store is not None
    log = WebchatLog(store)
    await log.ensure_schema()
    m = OutboundMessage(channel="webchat", chat_id="w1", text="answered")
    shown: list[tuple[int, bool]] = []

    def settle(logged: tuple[object, bool]) -> Delivery:
        entry, new = logged
        shown.append((entry.seq, new))  # type: ignore[attr-defined]
        return Delivery(ok=True)

    sent = TurnSend(m.idempotency_key, webchat_writer(
        chat_id="w1", role="assistant", kind="reply", text=m.text, key=m.idempotency_key),
        settle)
    await save(store, m, sent, "t2")
    entry = await log.find(m.idempotency_key)
    assert entry is not None and entry.text == "answered" and shown == [(entry.seq, True)]
    assert await store.fetchall("SELECT status FROM outbox", ()) == [("delivered",)]


class Offering(ScriptedChannel):
    """A channel that offers to send with the turn (as a database-backed one does)."""

    def send_with_turn(self, msg: OutboundMessage) -> TurnSend:
        return TurnSend(msg.idempotency_key, lambda db: None, lambda r: Delivery(ok=True))


async def test_only_a_reply_with_nothing_ahead_of_it_is_sent_with_its_turn(
        manager: ChannelManager) -> None:
    channel = Offering()
    manager.add(channel)
    reply = OutboundMessage(channel="platform", chat_id="c1", text="the reply")
    other_chat = OutboundMessage(channel="platform", chat_id="c2", text="elsewhere")
    assert manager.send_with_turn(reply) is not None

    channel.gate = asyncio.Event()  # the platform holds every send until released
    earlier = OutboundMessage(channel="platform", chat_id="c1", text="said before")
    await manager.bus.publish_outbound(earlier)
    assert manager.send_with_turn(reply) is None  # published, not routed yet
    await channel.tried.wait()  # routed: being sent now
    assert manager.send_with_turn(reply) is None  # the chat's earlier message goes first
    assert manager.send_with_turn(other_chat) is not None  # another chat is not held up
    channel.gate.set()
    await channel.wait_sent(1)
    await manager.flush()
    sent = manager.send_with_turn(reply)
    assert sent is not None
    sent.done()
    assert manager.stats["platform"].sent == 2

    manager.down["platform"] = "refused the token"
    assert manager.send_with_turn(reply) is None  # a channel that is down: the outbox
    del manager.down["platform"]
    progress = OutboundMessage(channel="platform", chat_id="c1", text="…", kind="progress")
    assert manager.send_with_turn(progress) is None  # never kept, never sent this way
    assert manager.send_with_turn(
        OutboundMessage(channel="nowhere", chat_id="c1", text="x")) is None
