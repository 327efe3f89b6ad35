"""The inbox and the outbox: inbound messages stored until answered, replies stored until
delivered (or dead-lettered), so a restart loses neither.

Separate from the sessions (``store_sessions``) so the delivery guarantees read on their own;
``save_turn`` there writes into both tables with the statements named here, in its one
transaction.
"""

from __future__ import annotations

import json
import sqlite3
from datetime import datetime
from typing import Any

import orjson

from gateway.kernel.events import InboundMessage, OutboundMessage, event_to_dict
from gateway.kernel.frozen import frozen
from gateway.kernel.store_db import Database, dump_json, iso
from gateway.kernel.values import OutboxMark


def _in_channels(channels: list[str] | None) -> tuple[str, tuple[Any, ...]]:
    if channels is None:
        return "", ()
    return f" AND channel IN ({', '.join('?' * len(channels)) or 'NULL'})", tuple(channels)


@frozen
class PendingOutbound:
    message: OutboundMessage
    attempts: int
    expires_at: datetime


MARK_DONE = ("UPDATE inbox SET status = 'done', done_at = ? "
             "WHERE channel = ? AND chat_id = ? AND message_id = ?")
INSERT_OUTBOX = (
    "INSERT OR IGNORE INTO outbox (idempotency_key, channel, chat_id, kind, payload, created_at, "
    "expires_at) VALUES (?, ?, ?, ?, ?, ?, ?)")
INSERT_DELIVERED = (
    "INSERT OR IGNORE INTO outbox (idempotency_key, channel, chat_id, kind, payload, created_at, "
    "expires_at, status, attempts, delivered_at) VALUES (?, ?, ?, ?, ?, ?, ?, 'delivered', 1, ?)")
"""An outbox row stored delivered: its reply went out in the same transaction (``TurnSend``)."""


_OUTBOX_RESULT = (
    "UPDATE outbox SET status = ?, attempts = ?, last_error = ?, "
    "delivered_at = CASE WHEN ? THEN ? ELSE delivered_at END WHERE idempotency_key = ?")


def mark_delivered(db: Any, mark: OutboxMark) -> None:
    """``mark``'s outbox row delivered, inside the caller's transaction (``db``: the
    connection a ``_write`` function gets)."""
    db.execute(_OUTBOX_RESULT, ("delivered", mark.attempts, None, True, iso(), mark.key))


def event_payload(event: InboundMessage | OutboundMessage) -> str:
    """An event as the inbox and the outbox store it: ``dump_json(event_to_dict(event))``,
    written by orjson from the dataclass itself (~2x sooner) when nothing in it needs
    ``event_to_dict``'s care (media leave out their empty fields; a value orjson refuses goes
    the long way)."""
    if not event.media:
        try:
            return orjson.dumps(event).decode()
        except TypeError:
            pass
    return dump_json(event_to_dict(event))


def outbox_row(msg: OutboundMessage, expires_at: datetime) -> tuple[Any, ...]:
    """An outbox row's values, in ``INSERT_OUTBOX``'s order."""
    return (msg.idempotency_key, msg.channel, msg.chat_id, msg.kind, event_payload(msg),
            iso(msg.created_at), iso(expires_at))


def inbox_row(msg: InboundMessage) -> tuple[str, str, str, str, str]:
    """(channel, chat_id, message_id, payload, received_at) as the inbox stores them."""
    return (msg.channel, msg.chat_id, msg.message_id, event_payload(msg),
            iso(msg.received_at))


class QueueTables(Database):
    """The inbox (inbound messages until answered) and the outbox (replies until delivered)."""

    # inbox --------------------------------------------------------------------------------

    async def inbox_add(self, msg: InboundMessage) -> bool:
        """Store an inbound message; False when this channel message was stored before."""
        row = inbox_row(msg)
        return await self._write(lambda db: db.execute(
            "INSERT OR IGNORE INTO inbox (channel, chat_id, message_id, payload, received_at) "
            "VALUES (?, ?, ?, ?, ?)", row).rowcount == 1)

    async def inbox_take(self, msg: InboundMessage) -> tuple[bool, bool]:
        """Store an inbound message: (stored, queued here). One process (SQLite) queues what
        it stores; on PostgreSQL ``PgStore.inbox_take`` claims it in the same statement when
        this process holds its chat, else the chat's holder claims it."""
        stored = await self.inbox_add(msg)
        return stored, stored and not self.claims_inbound

    async def finish_inbound(self, done: list[InboundMessage],
                             outbound: list[tuple[OutboundMessage, datetime]]) -> None:
        """Mark inbound messages answered and store the answer, in one transaction."""
        now = iso()
        done_rows = [(now, m.channel, m.chat_id, m.message_id) for m in done]
        outbox_rows = [outbox_row(m, e) for m, e in outbound]

        def write(db: sqlite3.Connection) -> None:
            db.executemany(MARK_DONE, done_rows)
            db.executemany(INSERT_OUTBOX, outbox_rows)

        await self._write(write)

    async def inbox_pending(self, channels: list[str] | None = None) -> list[InboundMessage]:
        """Messages stored but not answered (the gateway stopped or crashed), oldest first;
        only those of ``channels`` when given (another process may own the rest)."""
        where, params = _in_channels(channels)
        rows = await self._fetchall(
            f"SELECT payload FROM inbox WHERE status = 'pending'{where} ORDER BY id", params)
        return [InboundMessage.from_dict(json.loads(r[0])) for r in rows]

    # outbox -------------------------------------------------------------------------------

    async def outbox_add(self, msg: OutboundMessage, expires_at: datetime) -> None:
        row = outbox_row(msg, expires_at)
        await self._write(lambda db: db.execute(INSERT_OUTBOX, row))

    async def outbox_pending(self, channels: list[str] | None = None) -> list[PendingOutbound]:
        where, params = _in_channels(channels)
        rows = await self._fetchall(
            "SELECT payload, attempts, expires_at FROM outbox WHERE status = 'pending'"
            f"{where} ORDER BY id", params)
        return [PendingOutbound(OutboundMessage.from_dict(json.loads(r[0])), r[1],
                                datetime.fromisoformat(r[2])) for r in rows]

    async def outbox_result(self, key: str, *, delivered: bool, attempts: int,
                            error: str | None = None, dead: bool = False) -> None:
        """Record a delivery: delivered, still pending (a failed try), or dead-lettered."""
        status = "delivered" if delivered else ("dead" if dead else "pending")
        row = (status, attempts, error, delivered, iso(), key)
        await self._write(lambda db: db.execute(_OUTBOX_RESULT, row))

    async def outbox_counts(self) -> dict[str, int]:
        rows = await self._fetchall(
            "SELECT status, COUNT(*) FROM outbox WHERE status != 'delivered' GROUP BY status",
            ())
        counts = {"pending": 0, "dead": 0}
        counts.update({r[0]: int(r[1]) for r in rows})
        return counts

    async def dead_letters(self, limit: int = 50) -> list[dict[str, Any]]:
        rows = await self._fetchall(
            "SELECT idempotency_key, channel, chat_id, kind, attempts, last_error, created_at "
            "FROM outbox WHERE status = 'dead' ORDER BY id DESC LIMIT ?", (limit,))
        keys = ("key", "channel", "chat_id", "kind", "attempts", "last_error", "created_at")
        return [dict(zip(keys, r, strict=True)) for r in rows]

