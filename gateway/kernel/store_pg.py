"""The store on PostgreSQL: the same ``Store`` (every table, every query) for several gateway
processes on one database, chosen by ``database: postgresql://...`` in the config.

Shaped like the SQLite side so the tables' modules run unchanged: one psycopg connection used
from one thread (as aiosqlite does), ``_write(fn)`` runs a whole transaction there in one hop
(with the writes queued meanwhile: group commit, as on SQLite),
``transaction()`` yields a connection whose ``execute`` is awaitable and an async context
manager, like aiosqlite's. Statements are rewritten once per text by ``store_sql.to_postgres``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Generator, Iterable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from functools import partial
from typing import Any, Self, TypeVar

import psycopg

from gateway.kernel.events import InboundMessage
from gateway.kernel.store_db import MessageTakenOver
from gateway.kernel.store_queues import QueueTables, inbox_row
from gateway.kernel.store_schema import CORE
from gateway.kernel.store_search import SearchTables
from gateway.kernel.store_sessions import SessionTables
from gateway.kernel.store_snapshots import SnapshotTables
from gateway.kernel.store_sql import TableSet, hide_password, postgres_ddl, to_postgres
from gateway.kernel.store_usage import UsageTables

T = TypeVar("T")
_log = logging.getLogger(__name__)

_FENCED = "no longer holds this message"
"""What ``parley_inbox_fence`` (``store_pg_cluster``) raises with: a turn's write for a message
another process took over."""

_NOW = "EXTRACT(EPOCH FROM clock_timestamp())"
_LIVE = f"SELECT id FROM cluster_processes WHERE expires_at > {_NOW}"
_TAKE_AT_INSERT = (
    "WITH m (channel, chat_id, message_id, payload, received_at, me, take_free) AS "
    "(VALUES (?, ?, ?, ?, ?, ?, ?::boolean)), "
    f"me AS (SELECT p.id FROM cluster_processes p, m WHERE p.id = m.me AND p.expires_at > {_NOW}), "
    "lease AS (INSERT INTO chat_leases (channel, chat_id, holder, since) "
    f"SELECT m.channel, m.chat_id, me.id, {_NOW} FROM m, me WHERE CASE WHEN m.take_free "
    "THEN NOT EXISTS (SELECT 1 FROM chat_leases l WHERE l.channel = m.channel "
    f"AND l.chat_id = m.chat_id AND l.holder <> me.id AND l.holder IN ({_LIVE})) "
    "ELSE EXISTS (SELECT 1 FROM chat_leases l WHERE l.channel = m.channel "
    "AND l.chat_id = m.chat_id AND l.holder = me.id) END "
    "ON CONFLICT (channel, chat_id) DO UPDATE SET holder = EXCLUDED.holder, "
    "since = EXCLUDED.since WHERE chat_leases.holder = EXCLUDED.holder "
    f"OR chat_leases.holder NOT IN ({_LIVE}) RETURNING holder) "
    "INSERT INTO inbox (channel, chat_id, message_id, payload, received_at, claimed_by) "
    "SELECT m.channel, m.chat_id, m.message_id, m.payload, m.received_at, (SELECT holder "
    "FROM lease WHERE NOT EXISTS (SELECT 1 FROM inbox i WHERE i.channel = m.channel "
    "AND i.chat_id = m.chat_id AND i.status = 'pending' "
    "AND i.claimed_by IS DISTINCT FROM lease.holder)) FROM m "
    "ON CONFLICT DO NOTHING RETURNING claimed_by")
"""An inbound message stored and, in the same statement, claimed by the process storing it
when that process is alive and holds the chat's lease, or (``take_free``: a channel every
process receives, so where a chat's messages arrive spreads the chats) can take it: no other
live holder; a chat another live process holds is not even tried, so its lease row is never
locked here. And only when no earlier message of the chat waits unclaimed or claimed by
another (it would be answered after this one). Otherwise it is stored unclaimed and
``NOTIFY parley_inbox`` (the cluster's trigger) wakes the claim rounds, which take a chat's
messages in order."""


class Cursor:
    """A statement's result, shaped like sqlite3's cursor: ``rowcount``, ``lastrowid``
    (the generated id an ``INSERT`` returned), ``fetchone``/``fetchall``.

    Read at once, on the store's thread; in a pipelined write (``SyncConnection.pipelined``)
    only when asked for: the statements before it are then sent and answered in one round
    trip, and those after it wait for the next question or the write's end."""

    __slots__ = ("_at", "_cur", "_lastrowid", "_pipe", "_returning", "_rowcount", "_rows")

    def __init__(self, cur: psycopg.Cursor[Any], returning: bool,
                 pipe: psycopg.Pipeline | None = None) -> None:
        self._cur = cur
        self._returning = returning
        self._pipe = pipe
        self._rows: list[Any] | None = None
        self._at = 0
        if pipe is None:
            self._load()

    def _load(self) -> list[Any]:
        rows = self._rows
        if rows is None:
            cur = self._cur
            if cur.pgresult is None and self._pipe is not None:
                self._pipe.sync()  # everything queued so far, in one round trip
            self._rowcount = cur.rowcount
            rows = list(cur.fetchall()) if cur.description is not None else []
            self._lastrowid: int | None = None
            if self._returning:
                self._lastrowid = rows[0][0] if rows else None
                rows = []
            self._rows = rows
            self._pipe = None
        return rows

    @property
    def rowcount(self) -> int:
        self._load()
        return self._rowcount

    @property
    def lastrowid(self) -> int | None:
        self._load()
        return self._lastrowid

    def fetchone(self) -> Any:
        rows = self._load()
        if self._at >= len(rows):
            return None
        self._at += 1
        return rows[self._at - 1]

    def fetchall(self) -> list[Any]:
        rows = self._load()
        out, self._at = rows[self._at:], len(rows)
        return out

    def fetchmany(self, n: int) -> list[Any]:
        rows = self._load()[self._at:self._at + n]
        self._at += len(rows)
        return rows

    def __iter__(self) -> Any:
        return iter(self.fetchall())


class SyncConnection:
    """What ``_write``'s function gets on PostgreSQL, shaped like ``sqlite3.Connection``."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self._conn = conn
        self._pipe: psycopg.Pipeline | None = None
        self._lazy: list[Cursor] = []

    def execute(self, sql: str, params: Iterable[Any] = ()) -> Cursor:
        text, returning = to_postgres(sql)
        cur = self._conn.cursor()
        cur.execute(text, tuple(params))  # type: ignore[arg-type]  # rewritten text
        out = Cursor(cur, returning, self._pipe)
        if self._pipe is not None:
            self._lazy.append(out)
        return out

    def pipelined(self, fn: Callable[[SyncConnection], T]) -> T:
        """``fn`` in one transaction whose statements go to the server without waiting
        for each answer (psycopg's pipeline mode): a write of a dozen statements takes a round
        trip for each result it reads, and one at its end, in place of one a statement and
        two for BEGIN and COMMIT. Raises what any statement raised, and then leaves no
        transaction open (rolled back)."""
        conn = self._conn
        try:
            with conn.pipeline() as pipe:
                self._pipe = pipe
                conn.execute("BEGIN")
                result = fn(self)
                conn.execute("COMMIT")
        except BaseException:
            if not (conn.closed or conn.broken) and \
                    conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                try:
                    conn.execute("ROLLBACK")
                except psycopg.Error as e:  # what failed first is what the caller hears;
                    # a connection left inside a transaction is given up (the next call
                    # connects again: ``PgStore._run``)
                    _log.warning("PostgreSQL: rolling back a failed write failed too: %s", e)
                    conn.close()
            raise
        finally:
            self._pipe = None
            lazy, self._lazy = self._lazy, []
        for cur in lazy:  # answered by now: read here, on the store's thread
            cur._load()
        return result

    def executemany(self, sql: str, rows: Iterable[Iterable[Any]]) -> None:
        batch = [tuple(r) for r in rows]
        if batch:
            text, _ = to_postgres(sql)
            with self._conn.cursor() as cur:
                cur.executemany(text, batch)  # type: ignore[arg-type]


class AsyncCursor:
    """aiosqlite's cursor shape over a fetched ``Cursor`` (no I/O left to do)."""

    def __init__(self, cur: Cursor) -> None:
        self._cur = cur
        self.rowcount = cur.rowcount
        self.lastrowid = cur.lastrowid

    async def fetchone(self) -> Any:
        return self._cur.fetchone()

    async def fetchall(self) -> list[Any]:
        return self._cur.fetchall()

    async def close(self) -> None:
        pass

    def __aiter__(self) -> AsyncIterator[Any]:
        async def rows() -> AsyncIterator[Any]:
            for row in self._cur.fetchall():
                yield row
        return rows()


class _Pending:
    """``await conn.execute(...)`` and ``async with conn.execute(...) as cur``, as aiosqlite."""

    def __init__(self, run: Callable[[], Any]) -> None:
        self._run = run

    def __await__(self) -> Generator[Any, None, AsyncCursor]:
        return self._go().__await__()

    async def _go(self) -> AsyncCursor:
        return AsyncCursor(await self._run())

    async def __aenter__(self) -> AsyncCursor:
        return await self._go()

    async def __aexit__(self, *exc: object) -> None:
        pass


class AsyncConnection:
    """What ``transaction()`` yields on PostgreSQL, shaped like ``aiosqlite.Connection``."""

    def __init__(self, db: PgStore) -> None:
        self._db = db

    def execute(self, sql: str, params: Iterable[Any] = ()) -> _Pending:
        return _Pending(lambda: self._db._call(lambda c: c.execute(sql, params)))

    async def executemany(self, sql: str, rows: Iterable[Iterable[Any]]) -> None:
        batch = [tuple(r) for r in rows]
        await self._db._call(lambda c: c.executemany(sql, batch))

    async def execute_fetchall(self, sql: str, params: Iterable[Any] = ()) -> list[Any]:
        cur = await self._db._call(lambda c: c.execute(sql, params))
        return cur.fetchall()


class PgStore(SessionTables, QueueTables, SnapshotTables, UsageTables, SearchTables):
    """``Store`` on PostgreSQL (the same tables' classes, this connection under them; not a
    subclass of ``Store``, which opens it: ``await Store.open("postgresql://...")``)."""

    dialect = "postgresql"
    claims_inbound = True
    claimer: str | None = None
    """This process's id in the cluster while it takes work (``gateway/cluster.py``): what it
    stores it may claim at once (``inbox_take``). None: every message is left to the claims."""
    takes_free: frozenset[str] = frozenset()
    """Channels whose new chats the storing process takes as it stores their first message:
    those every process receives (the local channel, WebChat). A platform one process polls
    (a leader lease) would otherwise gather all its chats there; its new chats are left to the
    claim rounds, which spread them."""
    trigram = False
    search_mode = "like"
    _gather_passes = 0  # Database._flush: no gathering here (see there)

    def __init__(self, conn: psycopg.Connection[Any], url: str) -> None:  # noqa: D107
        self._conn = conn
        self._sync = SyncConnection(conn)
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="parley-pg")
        self.url = url
        self.target = hide_password(url)
        self._write_lock = asyncio.Lock()
        self._queued: list[Any] = []  # Database._write's group commit
        self._flusher: asyncio.Task[None] | None = None
        self._closed = False
        self.problem: str | None = None
        self._texts_known: dict[str, float] = {}  # LayerTexts' (store_snapshots): its __init__ is
        # SQLite's, not run here

    @classmethod
    async def connect(cls, url: str) -> Self:
        try:
            conn: psycopg.Connection[Any] = await asyncio.to_thread(
                lambda: psycopg.connect(url, autocommit=True, connect_timeout=10))
        except psycopg.Error as e:
            raise ConnectionError(f"cannot connect to PostgreSQL at {hide_password(url)}: "
                                  f"{str(e).strip().splitlines()[0] if str(e) else e}") from None
        self = cls(conn, url)
        try:
            await self.migrate(CORE)
            await self.ensure_search()
            await self.backfill_search()
        except BaseException:
            await self.close()
            raise
        return self

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            async with self._write_lock:
                await self._call(lambda c: self._conn.close())
            self._thread.shutdown(wait=False)

    async def _call(self, fn: Callable[[SyncConnection], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._thread, self._run, fn)

    def _run(self, fn: Callable[[SyncConnection], T]) -> T:
        """``fn`` on the store's thread, on a new connection when the last one was lost (the
        server restarted, the network dropped): what failed then failed, and was said; the
        store works again once the database answers (the cluster's health shows the gap)."""
        if self._conn.closed and not self._closed:
            self._conn = psycopg.connect(self.url, autocommit=True, connect_timeout=10)
            self._sync = SyncConnection(self._conn)
            _log.warning("PostgreSQL at %s: connected again", self.target)
        return fn(self._sync)

    # ``_write`` is ``Database._write``: group commit, the writes that queue while one
    # transaction runs go together in the next (one BEGIN…COMMIT, one thread hop, a round trip
    # for each instead of three), each caller answered only after that COMMIT.

    async def _run_batch(self, batch: list[Any]) -> None:
        """Every write of ``batch`` in one transaction; when one of them raised (a constraint,
        the inbox fence, a deadlock the server broke) the whole is rolled back and each runs
        alone, so another's write never fails for it. When the connection was lost the batch
        fails as a whole: whether its COMMIT landed is unknown, and running it again could
        store it twice."""
        for entry in await self._call(lambda c: self._batch_in_transaction(c, batch)):
            try:
                entry.result = await self._call(partial(self._in_transaction, fn=entry.fn))
                entry.error = None
            except Exception as exc:
                entry.error = exc
        for entry in batch:  # the inbox fence (store_pg_cluster): said as what it means
            if entry.error is not None and _FENCED in str(entry.error):
                entry.error = MessageTakenOver(str(entry.error).splitlines()[0])

    def _in_transaction(self, c: SyncConnection, fn: Callable[[Any], T]) -> T:
        return c.pipelined(fn)

    def _batch_in_transaction(self, c: SyncConnection, batch: list[Any]) -> list[Any]:
        """On the store's thread: the ones to run alone (all of them) when the batch failed."""
        if len(batch) == 1:
            try:
                batch[0].result = self._in_transaction(c, batch[0].fn)
            except Exception as exc:
                batch[0].error = exc
            return []
        try:
            results = c.pipelined(lambda c: [entry.fn(c) for entry in batch])
        except Exception as exc:
            if not (self._conn.closed or self._conn.broken):
                return batch
            for entry in batch:
                entry.error = exc
            return []
        for entry, result in zip(batch, results, strict=True):
            entry.result = result
        return []

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Any]:
        async with self._write_lock:
            await self._call(lambda c: c.execute("BEGIN"))
            try:
                yield AsyncConnection(self)
            except BaseException:
                await self._call(lambda c: c.execute("ROLLBACK"))
                raise
            else:
                await self._call(lambda c: c.execute("COMMIT"))

    async def ensure_schema(self, sql: str, *, postgres: str | None = None) -> None:
        text = postgres if postgres is not None else postgres_ddl(sql)
        async with self._write_lock:
            await self._call(lambda c: self._conn.execute(text))  # type: ignore[arg-type]

    async def migrate(self, tables: TableSet) -> int:
        """As on SQLite, one process at a time: several may start together."""
        await self._call(lambda c: c.execute("SELECT pg_advisory_lock(19)"))
        try:
            return await super().migrate(tables)
        finally:
            await self._call(lambda c: c.execute("SELECT pg_advisory_unlock(19)"))

    async def read_alone(self, fn: Callable[[Any], T]) -> T:
        """``Database.read_alone``: a connection of its own, so the store's thread and its
        connection stay free for the turns."""
        def run() -> T:
            with psycopg.connect(self.url, autocommit=True, connect_timeout=10) as conn:
                return fn(SyncConnection(conn))

        return await asyncio.to_thread(run)

    async def vacuum(self) -> None:
        """``VACUUM (ANALYZE)`` outside a transaction (``parley db vacuum``)."""
        async with self._write_lock:
            await self._call(lambda c: c.execute("VACUUM (ANALYZE)"))

    async def inbox_take(self, msg: InboundMessage) -> tuple[bool, bool]:
        """Store an inbound message, claimed here at once when this process holds its chat
        (``_TAKE_AT_INSERT``): no wake-up of every process, no claim round, no second
        transaction for most messages. (stored, claimed here)."""
        me = self.claimer
        if me is None:
            return await super().inbox_take(msg)
        channel, chat, message_id, payload, received = inbox_row(msg)
        params = (channel, chat, message_id, payload, received, me,
                  channel in self.takes_free)
        row = await self._write(lambda db: db.execute(_TAKE_AT_INSERT, params).fetchone())
        return row is not None, row is not None and row[0] is not None

    def check_file(self) -> str | None:
        """SQLite's check that its file is still there; a lost connection shows in the
        cluster's health (``gateway/cluster.py``)."""
        return None

    async def columns(self, table: str) -> set[str]:
        rows = await self._fetchall(
            "SELECT column_name FROM information_schema.columns WHERE table_name = ?", (table,))
        return {r[0] for r in rows}

    async def iterate(self, sql: str, params: tuple[Any, ...] = ()) -> AsyncIterator[Any]:
        for row in await self._fetchall(sql, params):
            yield row

    def _others_version(self) -> int | None:
        return None  # every read goes to the server (other processes write)

    async def _fetchone(self, sql: str, params: tuple[Any, ...]) -> Any:
        cur = await self._call(lambda c: c.execute(sql, params))
        return cur.fetchone()

    async def _fetchall(self, sql: str, params: tuple[Any, ...]) -> list[Any]:
        cur = await self._call(lambda c: c.execute(sql, params))
        return cur.fetchall()

    async def _fetchone_thread(self, sql: str, params: tuple[Any, ...]) -> Any:
        return await self._fetchone(sql, params)  # PostgreSQL: every read is off the loop

    async def _fetchall_thread(self, sql: str, params: tuple[Any, ...]) -> list[Any]:
        return await self._fetchall(sql, params)
