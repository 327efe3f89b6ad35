"""Several gateway processes on one PostgreSQL store: who is alive, who holds which chat, and
claiming work so each inbound message is taken once and each chat's turns run in one process.

- Each process has a row in ``cluster_processes`` whose ``expires_at`` it pushes forward every
  third of the lease (``cluster.lease``). A process is alive while that lies ahead (the
  database's clock decides, not the machines'). ``kill -9`` stops the renewals: after at most
  one lease its chats and its unfinished work belong to whoever claims them next.
- A chat's lease (``chat_leases``) names the process that runs its turns; a process takes a
  chat's pending inbound messages only while it holds the lease, or can take it over (no
  holder, or a dead one). The lease row stays locked while its messages are claimed (so they
  are claimed together, in order, by one process); the message rows are taken with
  ``FOR UPDATE SKIP LOCKED``, so a claimer never waits on a row another transaction holds.
- A reply is written (``outbox.claimed_by`` defaults to the writing process, from the
  session setting ``parley.process``) and delivered by that process; a dead process's
  undelivered replies are claimed by a survivor.
- The process storing an inbound message claims it in the same statement when it holds the
  chat or can take it (``PgStore.inbox_take``: most messages, no claim round). A row stored
  unclaimed wakes every process through ``NOTIFY parley_inbox`` (a trigger); there is no
  polling loop. A survivor also wakes when a peer's lease runs out.

The SQLite store needs none of this (one process): its twin of these tables is empty.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import socket
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any

import psycopg

from gateway.kernel.events import InboundMessage, OutboundMessage
from gateway.kernel.frozen import frozen
from gateway.kernel.store_pg import _LIVE, _NOW, PgStore
from gateway.kernel.store_queues import PendingOutbound
from gateway.kernel.store_sql import Migration, TableSet, register

_log = logging.getLogger(__name__)

_SCHEMA_PG = """
CREATE TABLE IF NOT EXISTS cluster_processes (
    id TEXT PRIMARY KEY,
    host TEXT NOT NULL,
    pid INTEGER NOT NULL,
    channels TEXT NOT NULL,
    started_at DOUBLE PRECISION NOT NULL,
    expires_at DOUBLE PRECISION NOT NULL
);
CREATE TABLE IF NOT EXISTS chat_leases (
    channel TEXT NOT NULL,
    chat_id TEXT NOT NULL,
    holder TEXT NOT NULL,
    since DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (channel, chat_id)
);
CREATE INDEX IF NOT EXISTS chat_leases_holder ON chat_leases(holder);
CREATE TABLE IF NOT EXISTS leader_leases (
    name TEXT PRIMARY KEY,
    holder TEXT NOT NULL,
    since DOUBLE PRECISION NOT NULL
);
ALTER TABLE inbox ADD COLUMN IF NOT EXISTS claimed_by TEXT;
ALTER TABLE outbox ADD COLUMN IF NOT EXISTS claimed_by TEXT
    DEFAULT current_setting('parley.process', true);
CREATE OR REPLACE FUNCTION parley_inbox_notify() RETURNS trigger AS $$
BEGIN
    PERFORM pg_notify('parley_inbox', '');
    RETURN NULL;
END $$ LANGUAGE plpgsql;
CREATE OR REPLACE TRIGGER inbox_notify AFTER INSERT ON inbox
    FOR EACH STATEMENT EXECUTE FUNCTION parley_inbox_notify();
CREATE OR REPLACE FUNCTION parley_inbox_fence() RETURNS trigger AS $$
BEGIN
    IF NEW.status = 'done' AND OLD.claimed_by IS NOT NULL
       AND OLD.claimed_by IS DISTINCT FROM current_setting('parley.process', true) THEN
        RAISE EXCEPTION 'parley: % no longer holds this message (it was given up for dead)',
            current_setting('parley.process', true);
    END IF;
    RETURN NEW;
END $$ LANGUAGE plpgsql;
CREATE OR REPLACE TRIGGER inbox_fence BEFORE UPDATE OF status ON inbox
    FOR EACH ROW EXECUTE FUNCTION parley_inbox_fence();
"""
"""``inbox_fence``: a turn's write (one transaction) fails whole when its message was claimed
by another process meanwhile (this one was given up for dead): never answered twice."""

_WAKE_ON_UNCLAIMED = """
DROP TRIGGER IF EXISTS inbox_notify ON inbox;
CREATE TRIGGER inbox_notify AFTER INSERT ON inbox FOR EACH ROW
    WHEN (NEW.claimed_by IS NULL) EXECUTE FUNCTION parley_inbox_notify();
"""
"""Version 2: a message claimed as it was stored (``PgStore.inbox_take``) wakes nobody; the
others still wake every process once per transaction (one notification: PostgreSQL folds
the same channel and payload sent twice in a transaction)."""

CLUSTER = register(TableSet("cluster", (Migration(1, "", _SCHEMA_PG),
                                        Migration(2, "", _WAKE_ON_UNCLAIMED)), ()))
"""Only PostgreSQL has these (SQLite runs one process); nothing in them is copied."""

_CANDIDATES = (
    "SELECT DISTINCT i.channel, i.chat_id, EXISTS (SELECT 1 FROM chat_leases l "
    "WHERE l.channel = i.channel AND l.chat_id = i.chat_id AND l.holder <> ? "
    f"AND l.holder IN ({_LIVE})) FROM inbox i WHERE i.status = 'pending' "
    "AND i.channel = ANY(?) "
    f"AND (i.claimed_by IS NULL OR i.claimed_by NOT IN ({_LIVE})) LIMIT 2000")
"""The chats with messages no live process claimed, and whether another live process holds
each (those are left to it: trying its lease would lock the row its holder claims through,
and the processes would take turns instead of claiming side by side)."""
_TAKE_LEASES = (
    "INSERT INTO chat_leases (channel, chat_id, holder, since) "
    f"SELECT c, h, ?, {_NOW} FROM unnest(?::text[], ?::text[]) AS t(c, h) ORDER BY c, h "
    "ON CONFLICT (channel, chat_id) DO UPDATE SET holder = EXCLUDED.holder, "
    "since = EXCLUDED.since WHERE chat_leases.holder = EXCLUDED.holder "
    f"OR chat_leases.holder NOT IN ({_LIVE}) RETURNING channel, chat_id")
_CLAIM = (
    "UPDATE inbox SET claimed_by = ? WHERE id IN (SELECT i.id FROM inbox i "
    "JOIN unnest(?::text[], ?::text[]) AS t(c, h) ON i.channel = t.c AND i.chat_id = t.h "
    f"WHERE i.status = 'pending' AND (i.claimed_by IS NULL OR i.claimed_by NOT IN ({_LIVE})) "
    "FOR UPDATE OF i SKIP LOCKED) RETURNING id, payload")
_CLAIM_OUTBOX = (
    "UPDATE outbox SET claimed_by = ? WHERE id IN (SELECT id FROM outbox "
    "WHERE status = 'pending' AND channel = ANY(?) "
    f"AND (claimed_by IS NULL OR claimed_by NOT IN ({_LIVE})) "
    "FOR UPDATE SKIP LOCKED) RETURNING id, payload, attempts, expires_at")


_DEPTHS = (
    "SELECT 'inbox', claimed_by, COUNT(*) FROM inbox WHERE status = 'pending' "
    "GROUP BY claimed_by UNION ALL SELECT 'outbox', claimed_by, COUNT(*) FROM outbox "
    "WHERE status = 'pending' GROUP BY claimed_by")
"""Each process's queues: inbound messages it claimed and has not answered, replies it has
not delivered yet (both read through the pending rows' partial indexes)."""


@frozen
class Claimed:
    inbound: list[InboundMessage]
    outbound: list[PendingOutbound]
    waiting: bool = False
    """Messages wait in chats another live process holds (look again when its lease ends)."""


def process_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


class ClusterStore:
    """This process's side of the cluster tables, on its ``PgStore``; a second connection
    listens for wake-ups (``listen``/``wait``)."""

    def __init__(self, store: PgStore, *, lease: float, channels: list[str],
                 me: str | None = None) -> None:
        self.store = store
        self.lease = lease
        self.channels = channels
        self.me = me or process_id()
        self._listen: psycopg.AsyncConnection[Any] | None = None
        self._beat: psycopg.AsyncConnection[Any] | None = None
        """Renewals have their own connection: never queued behind the turns' writes."""

    async def join(self) -> None:
        """Register this process (alive for one lease) and tag the replies it writes."""
        await self.store.migrate(CLUSTER)
        me, channels = self.me, json.dumps(self.channels)
        await self.store._write(lambda db: (
            db.execute("SELECT set_config('parley.process', ?, false)", (me,)),
            db.execute(
                "INSERT INTO cluster_processes (id, host, pid, channels, started_at, "
                f"expires_at) VALUES (?, ?, ?, ?, {_NOW}, {_NOW} + ?) ON CONFLICT (id) DO "
                "UPDATE SET expires_at = EXCLUDED.expires_at",
                (me, socket.gethostname(), os.getpid(), channels, self.lease))))

    async def renew(self) -> bool:
        """Push this process's lease forward; False when the database is unreachable or
        this process was given up for dead (then it must stop taking work)."""
        try:
            if self._beat is None or self._beat.closed:
                self._beat = await psycopg.AsyncConnection.connect(
                    self.store.url, autocommit=True, connect_timeout=max(int(self.lease), 2))
            cur = await self._beat.execute(
                f"UPDATE cluster_processes SET expires_at = {_NOW} + %s WHERE id = %s "
                f"AND expires_at > {_NOW}", (self.lease, self.me))
        except psycopg.Error:
            return False
        return cur.rowcount == 1

    async def claim(self) -> Claimed:
        """Take the pending inbound messages of the chats this process holds or can take
        over (oldest first), and replies left undelivered by dead processes."""
        me, channels = self.me, self.channels

        def claim(db: Any) -> tuple[list[Any], list[Any], bool]:
            found = db.execute(_CANDIDATES, (me, channels)).fetchall()
            chats = sorted((r[0], r[1]) for r in found if not r[2])
            elsewhere = any(r[2] for r in found)
            taken: list[Any] = []
            held: list[Any] = []
            if chats:
                # the lease rows stay locked until this transaction ends: while this process
                # claims a chat's messages, no other can (it waits on the lease), so a chat's
                # messages are claimed all together, in order, by its one holder
                held = sorted(tuple(r) for r in db.execute(
                    _TAKE_LEASES, (me, [c[0] for c in chats], [c[1] for c in chats])
                ).fetchall())
                if held:
                    taken = db.execute(_CLAIM, (me, [c[0] for c in held],
                                                [c[1] for c in held])).fetchall()
            out = db.execute(_CLAIM_OUTBOX, (me, channels)).fetchall()
            return sorted(taken), sorted(out), elsewhere or len(held) < len(chats)

        taken, out, waiting = await self.store._write(claim)
        return Claimed(
            [InboundMessage.from_dict(json.loads(r[1])) for r in taken],
            [PendingOutbound(OutboundMessage.from_dict(json.loads(r[1])), r[2],
                             datetime.fromisoformat(r[3])) for r in out], waiting)

    async def lead(self, name: str) -> bool:
        """Hold the leader lease ``name`` (one process at a time: the schedules); True when
        this process holds it now (it had it, or its holder is dead or gone)."""
        me = self.me
        row = await self.store._write(lambda db: db.execute(
            f"INSERT INTO leader_leases (name, holder, since) VALUES (?, ?, {_NOW}) "
            "ON CONFLICT (name) DO UPDATE SET holder = EXCLUDED.holder, since = EXCLUDED.since "
            "WHERE leader_leases.holder = EXCLUDED.holder "
            f"OR leader_leases.holder NOT IN ({_LIVE}) RETURNING holder", (name, me)).fetchone())
        return row is not None

    async def next_expiry(self) -> float | None:
        """Seconds until the first other live process's lease runs out (then its chats may
        need a new holder); None when no other process is alive."""
        me = self.me
        row = await self.store._fetchone(
            f"SELECT MIN(expires_at) - {_NOW} FROM cluster_processes WHERE id <> ? "
            f"AND expires_at > {_NOW}", (me,))
        return None if row is None or row[0] is None else max(float(row[0]), 0.0)

    async def leave(self) -> None:
        """A clean stop: hand back this process's chats and unfinished work at once."""
        me = self.me
        await self.store._write(lambda db: (
            db.execute("DELETE FROM chat_leases WHERE holder = ?", (me,)),
            db.execute("DELETE FROM leader_leases WHERE holder = ?", (me,)),
            db.execute("UPDATE inbox SET claimed_by = NULL WHERE claimed_by = ? AND "
                       "status = 'pending'", (me,)),
            db.execute("UPDATE outbox SET claimed_by = NULL WHERE claimed_by = ? AND "
                       "status = 'pending'", (me,)),
            db.execute("DELETE FROM cluster_processes WHERE id = ?", (me,)),
            db.execute("SELECT pg_notify('parley_inbox', '')")))

    # wake-ups -----------------------------------------------------------------------------

    async def listen(self) -> None:
        self._listen = await psycopg.AsyncConnection.connect(self.store.url, autocommit=True)
        await self._listen.execute("LISTEN parley_inbox")
        await self._listen.execute("LISTEN parley_local")
        await self._listen.execute("LISTEN parley_webchat")
        await self._listen.execute("LISTEN parley_cron")

    async def notify_cron(self) -> None:
        """Tell the process running the schedules that a job changed (``parley_cron``):
        without it, it would see the change at its next poll (``cron.poll_interval``)."""
        try:
            await self.store._write(lambda db: db.execute("SELECT pg_notify('parley_cron', '')"))
        except Exception as exc:  # the poll finds the job all the same
            _log.warning("cluster: could not tell the schedules of a cron change: %s", exc)

    async def notifications(self) -> AsyncIterator[tuple[str, str, bool]]:
        """(channel, payload, mine) each time a process stored an inbound message
        (``parley_inbox``), a local channel's reply (``parley_local``, its chat), a WebChat
        answer (``parley_webchat``, its chat) or changed a cron job (``parley_cron``);
        ``mine``: this process's store connection sent it (the server's backend pid says
        so). One generator for the connection's life: none is missed between two waits."""
        assert self._listen is not None
        async for note in self._listen.notifies():
            conn = self.store._conn
            yield note.channel, note.payload, not conn.closed and note.pid == conn.info.backend_pid

    async def close(self) -> None:
        for conn in (self._listen, self._beat):
            if conn is not None:
                await conn.close()
        self._listen = self._beat = None

    async def members(self) -> list[dict[str, Any]]:
        """Every registered process: its id, host, pid, channels, seconds of lease left
        (negative: given up for dead), how many chats it holds, its queue depths."""
        rows = await self.store._fetchall(
            f"SELECT p.id, p.host, p.pid, p.channels, p.expires_at - {_NOW}, "
            "(SELECT COUNT(*) FROM chat_leases l WHERE l.holder = p.id), "
            "(SELECT string_agg(name, ',' ORDER BY name) FROM leader_leases l "
            "WHERE l.holder = p.id) "
            "FROM cluster_processes p ORDER BY p.started_at", ())
        depths: dict[tuple[str, str | None], int] = {
            (r[0], r[1]): int(r[2]) for r in await self.store._fetchall(_DEPTHS, ())}
        return [{"id": r[0], "host": r[1], "pid": r[2], "channels": json.loads(r[3]),
                 "lease_left": round(float(r[4]), 1), "chats": int(r[5]),
                 "leads": r[6].split(",") if r[6] else [],
                 "inbox_claimed": depths.get(("inbox", r[0]), 0),
                 "outbox_pending": depths.get(("outbox", r[0]), 0),
                 "me": r[0] == self.me} for r in rows]

    async def unclaimed(self) -> int:
        """Inbound messages no live process has claimed yet (the cluster's queue)."""
        row = await self.store._fetchone(
            "SELECT COUNT(*) FROM inbox WHERE status = 'pending' AND (claimed_by IS NULL "
            f"OR claimed_by NOT IN ({_LIVE}))", ())
        return int(row[0]) if row else 0
