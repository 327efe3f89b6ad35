"""The connection under the ``Store``: the schema, opening (WAL, pragmas), closing and the
two ways to write — ``transaction()`` and the one-hop ``_write()`` — plus reads for other modules'
tables.
Every write first checks that the file is still the one opened (``check_file``): a data folder
deleted while the gateway runs would otherwise leave SQLite writing into an unlinked file, every
write "succeeding" and all of it lost at the next start. A write that cannot land raises
``StoreUnavailable``, and ``problem`` says why until a write lands again.

Separate from the tables' methods (``store_sessions``, ``store_queues``,
``store_snapshots``) so the locking and transaction rules, which every write depends on, read
in one place together with every table they guard.

Longer than 450 lines: the group commit, the two connections and the file checks are one set
of rules (each relies on the others' locking); split, none of them reads whole.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sqlite3
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager, suppress
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Self, TypeVar

import aiosqlite
import orjson

from gateway.kernel.events import isoformat, utcnow
from gateway.kernel.store_schema import CORE, SCHEMA, SCHEMA_VERSION, VERSIONS, upgrade_sqlite
from gateway.kernel.store_sql import TableSet

_log = logging.getLogger(__name__)

T = TypeVar("T")

_LOST = ("disk i/o error", "readonly database", "database or disk is full", "unable to open",
         "no such table", "file is not a database")
"""SQLite errors that mean the file cannot take writes, not that a statement was wrong."""


class StoreUnavailable(Exception):
    """Nothing can be stored: the database file is gone, replaced, read-only or the disk full."""


class MessageTakenOver(Exception):
    """The message a write answers was claimed by another process meanwhile (this one was given
    up for dead): that process answers it, and nothing of this write was stored."""


def iso(ts: datetime | None = None) -> str:
    """A timestamp as stored: ISO 8601, now when not given."""
    return isoformat(ts or utcnow())


def dump_json(data: Any) -> str:
    """A payload as stored: compact JSON, non-ASCII kept as is (orjson: the same text as
    ``json.dumps(..., separators=(",", ":"), ensure_ascii=False)``, several times faster)."""
    try:
        return orjson.dumps(data).decode()
    except TypeError:  # a key that is not a string, an int beyond 64 bits
        return json.dumps(data, ensure_ascii=False, separators=(",", ":"))


def load_json(raw: str | bytes) -> Any:
    """JSON read by orjson (several times faster than ``json``); what orjson refuses and
    ``json`` takes (NaN, integers beyond 64 bits, escaped lone surrogates, nesting past
    orjson's limit) is read by ``json``, so the result and the errors raised are ``json``'s."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return json.loads(raw)


@dataclass(slots=True, eq=False)
class _Queued:
    """A write waiting for its group's transaction (``Database._write``)."""

    fn: Callable[[sqlite3.Connection], Any]
    future: asyncio.Future[Any]
    slow: bool = False
    """May take long (a backfill, a retention pass): its batch runs on the database thread."""
    result: Any = None
    error: BaseException | None = None
    then: Callable[[Any], object] | None = None
    """Run with ``result`` once the write committed, whether or not its caller still waits."""


def _batch_in_transaction(conn: sqlite3.Connection, batch: list[_Queued], *,
                          begun: bool = False) -> list[_Queued]:
    """Every write of ``batch`` in one transaction (``begun``: its BEGIN IMMEDIATE already
    ran); the ones to run alone (all of them) when one raised, after rolling the whole back.
    A lone write that raised has its error set instead."""
    if not begun:
        conn.execute("BEGIN IMMEDIATE")
    try:
        results = [entry.fn(conn) for entry in batch]
        conn.execute("COMMIT")
    except Exception as exc:
        with suppress(sqlite3.Error):  # a failed COMMIT may have ended the transaction
            conn.execute("ROLLBACK")
        if len(batch) == 1:
            batch[0].error = exc
            return []
        return batch
    for entry, result in zip(batch, results, strict=True):
        entry.result = result
    return []


def _followed(entry: _Queued) -> None:
    """``entry``'s ``then``, once it committed; a bug of the caller's in it is logged (the
    batch's other writers are still told)."""
    if entry.then is not None:
        try:
            entry.then(entry.result)
        except Exception:
            _log.exception("after a write committed")


_BUSY = ("database is locked", "database is busy", "database table is locked")
"""Another connection (another process: ``parley chat``, ``parley db vacuum``) holds the lock."""

GATHER_PASSES = 64
"""At most this many passes of the event loop a busy group commit waits for more writes
(``Database._flush``) ..."""
GATHER_SECONDS = 0.002
"""... for at most this long ..."""
GATHER_WRITES = 128
"""... or until this many writes wait."""
BUSY_PASS = 0.00002
"""A pass of the loop shorter than this that brought no write: nothing else is running, and
the batch goes now (so a gateway that is not busy never waits, nor spins)."""

CHECKPOINT_EVERY = 256
"""In-loop commits between two checkpoints of the write-ahead log (on the database thread)."""
LOG_LIMIT_BYTES = 64 * 1024 * 1024
"""``journal_size_limit``: a write-ahead log that grew past this (a burst of writes, or a long
read that kept it from starting over) is cut back to it when it next starts over. Under it,
the log's blocks are written over in place: 256 commits of 100 chats fill ~40 MiB."""

_clock = time.perf_counter
"""What the gathering measures passes with (a test's fake clock replaces it)."""


def _now_connection(path: Path) -> sqlite3.Connection:
    """The connection used on the event loop's own thread: never waits for a lock (busy
    timeout 0: a busy database sends the work to the thread connection, which waits), never
    checkpoints (that writes the database file and syncs it: done on the thread instead)."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        for pragma in ("busy_timeout=0", "synchronous=NORMAL", "foreign_keys=ON",
                       "cache_size=-1024", "wal_autocheckpoint=0",
                       f"journal_size_limit={LOG_LIMIT_BYTES}"):
            conn.execute(f"PRAGMA {pragma}")
    except BaseException:
        conn.close()
        raise
    return conn


def _busy(exc: sqlite3.Error) -> bool:
    return isinstance(exc, sqlite3.OperationalError) and str(exc).lower().startswith(_BUSY)


class Database:
    """Two connections to one file: aiosqlite's (a thread of its own; ``transaction()``, long
    reads, anything that may wait for another process) and one used on the event loop's thread
    for what is short — point reads and the group-committed ``_write()`` batches — which costs
    no thread hop (two context switches and a GIL handover each, ~8 per turn). Writes go
    through ``transaction()`` or ``_write()`` under one lock, so two concurrent turns never
    interleave statements in one transaction."""

    dialect = "sqlite"
    """``sqlite`` or ``postgresql`` (``store_pg``): the few places that differ ask."""
    claims_inbound = False
    """True on PostgreSQL: a stored inbound message is queued by the process that claims it
    (several processes), not by the one that stored it."""
    target: str
    """Where the data is: the SQLite file's path, or the PostgreSQL URL (password hidden)."""
    _last_batch = 0
    """Writes in the last group commit (``_flush``): more than one, and the next gathers."""
    _now: sqlite3.Connection | None = None
    """The event loop thread's connection (None: everything on the database thread, and on
    PostgreSQL)."""
    _went_now = False
    """A write committed at once (``_write_now``) in this pass of the event loop: the next
    write of the same pass is not alone, and queues."""
    _behind_now = 0
    """Writes that queued behind one committed at once in the same pass: counted into the
    next batch's size, so that the store knows it is busy."""
    _gather_passes = GATHER_PASSES
    """0 on PostgreSQL (``store_pg``): its batches fill while the last one's round trip runs
    on the store's thread; gathering there measured +0.2 to +0.6 % instructions a turn."""

    def __init__(self, db: aiosqlite.Connection, path: Path,
                 now: sqlite3.Connection | None = None) -> None:
        self._db = db
        self._now = now
        self._commits_since_checkpoint = 0
        self._checkpoint: asyncio.Task[None] | None = None
        self.path = path
        self.target = str(path)
        self._write_lock = asyncio.Lock()
        self._queued: list[_Queued] = []
        self._flusher: asyncio.Task[None] | None = None
        self._closed = False
        info = os.stat(path)
        self._identity = (info.st_dev, info.st_ino)
        self._writable: tuple[int, int, int, int] | None = None
        """(mode, owner, group, change time) of the file when ``access`` last said writable."""
        self.problem: str | None = None
        """Why the last write could not land (None once one did)."""

    @classmethod
    async def open(cls, path: Path) -> Self:
        path.parent.mkdir(parents=True, exist_ok=True)
        db = await aiosqlite.connect(path, isolation_level=None)
        try:
            await db.execute("PRAGMA journal_mode=WAL")
            await db.execute("PRAGMA synchronous=NORMAL")
            await db.execute("PRAGMA foreign_keys=ON")
            await db.execute("PRAGMA busy_timeout=5000")
            # the thread's connection now does the rarer work (the loop's does point reads and
            # the group commits): 1 MiB of page cache, not SQLite's default 2
            await db.execute("PRAGMA cache_size=-1024")
            await db.execute(f"PRAGMA journal_size_limit={LOG_LIMIT_BYTES}")
            await db.executescript(SCHEMA)
            await upgrade_sqlite(db)
            await db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            now = _now_connection(path)
        except BaseException:
            await db.close()
            raise
        self = cls(db, path, now)
        await self.migrate(CORE)
        return self

    async def migrate(self, tables: TableSet) -> int:
        """Bring a table set to its newest version (each missing migration once, in order, in
        this database's dialect); its version now. Databases from before versions were kept
        have every table made with ``IF NOT EXISTS``, so version 1 is safe to apply there."""
        await self.ensure_schema(VERSIONS, postgres=VERSIONS)
        row = await self._fetchone("SELECT version FROM schema_versions WHERE component = ?",
                                   (tables.name,))
        have = int(row[0]) if row else 0
        for step in sorted(tables.migrations, key=lambda m: m.version):
            if step.version > have:
                await self.ensure_schema(step.sqlite, postgres=step.postgres)
                async with self.transaction() as db:
                    await db.execute(
                        "INSERT OR REPLACE INTO schema_versions (component, version, "
                        "applied_at) VALUES (?, ?, ?)", (tables.name, step.version, iso()))
                have = step.version
        return have

    async def columns(self, table: str) -> set[str]:
        """A table's column names (for upgrades of databases older than their migrations)."""
        return {row[1] for row in await self._fetchall(f"PRAGMA table_info({table})", ())}

    async def iterate(self, sql: str, params: tuple[Any, ...] = ()) -> AsyncIterator[Any]:
        """Rows one by one, not all at once (a whole session's messages)."""
        async with self._db.execute(sql, params) as cursor:
            async for row in cursor:
                yield row

    async def read_alone(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """``fn`` on a connection of its own on a worker thread, outside the store's
        transactions and lock: a long read (retention's pass over every snapshot) that no
        turn waits for."""
        def run() -> T:  # read-only: a file deleted meanwhile is not made again, empty
            conn = sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro", uri=True)
            try:
                return fn(conn)
            finally:
                conn.close()

        return await asyncio.to_thread(run)

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            if self._checkpoint is not None:  # before the lock: its second pass takes it
                await asyncio.gather(self._checkpoint, return_exceptions=True)
            async with self._write_lock:
                if self._checkpoint is not None:  # one a batch started meanwhile (one pass)
                    await asyncio.gather(self._checkpoint, return_exceptions=True)
                if self._now is not None:
                    self._now.close()
                    self._now = None
                await self._db.close()  # the last connection: SQLite checkpoints the log

    def check_file(self) -> str | None:
        """Why the database file can take no writes (gone, replaced, read-only), or None.
        One ``stat``: cheap enough for every write and every health check (``access`` only
        when the file's mode, owner or change time moved since it last said writable)."""
        try:
            info = os.stat(self.path)
        except FileNotFoundError:
            return (f"database {self.path} is gone (deleted or moved while the gateway ran); "
                    "messages are refused until it is restored and the gateway restarted")
        except OSError as exc:
            return f"database {self.path}: {exc.strerror or exc}"
        if (info.st_dev, info.st_ino) != self._identity:
            return f"database {self.path} was replaced while the gateway ran; restart the gateway"
        seen = (info.st_mode, info.st_uid, info.st_gid, info.st_ctime_ns)
        if seen != self._writable:  # chmod, chown, an ACL: each moves one of them
            if not os.access(self.path, os.W_OK):
                return (f"database {self.path} is not writable; give the gateway's user "
                        "write access")
            self._writable = seen
        return None

    def _fail(self, problem: str) -> StoreUnavailable:
        self.problem = problem
        return StoreUnavailable(problem)

    def _check_writable(self) -> None:
        if (problem := self.check_file()) is not None:
            raise self._fail(problem)

    @contextmanager
    def _mapped(self) -> Iterator[None]:
        """An SQLite error that means the file takes no writes → ``StoreUnavailable``."""
        try:
            yield
        except sqlite3.Error as exc:
            mapped = self._mapped_error(exc)
            if mapped is exc:
                raise
            raise mapped from exc

    def _mapped_error(self, exc: sqlite3.Error) -> BaseException:
        if any(mark in str(exc).lower() for mark in _LOST):
            failed = self._fail(f"database {self.path}: {exc}")
            failed.__cause__ = exc
            return failed
        return exc

    async def _write(self, fn: Callable[[sqlite3.Connection], T], *, slow: bool = False,
                     then: Callable[[T], object] | None = None) -> T:
        """Run ``fn`` in a transaction: on the event loop's connection, with no thread hop; on
        the database thread when another process holds the lock or ``slow`` says it may take
        long (aiosqlite's ``_execute``/``_conn``; the version is pinned).

        Group commit: the writes that queue up while one transaction runs go together in the
        next (one BEGIN…COMMIT, one hop), which is most of a busy gateway's writes. Each
        caller returns only after that COMMIT, so nothing is acknowledged before it is stored;
        when one of them fails the batch is rolled back and each is run alone, so another's
        write never fails for it. A caller cancelled before its batch starts is left out; one
        cancelled later does not stop it (as a cancel during a COMMIT never could); ``then``
        runs with the result once it committed, even when its caller no longer waits (what a
        committed write must be followed by: a reply sent in it shown, ``TurnSend``).

        On SQLite, when the last batch held more than one write (turns running side by
        side), the next waits for more while the loop is busy: pass after pass of the event
        loop, until a pass that ran nothing else (under ``BUSY_PASS``) brought no write, or
        ``GATHER_SECONDS`` passed, or ``GATHER_WRITES`` wait. Each COMMIT writes every page
        its batch changed to the log (~3.7 µs a page, ~15 pages a turn alone), and the turns
        of one batch share their tables' last pages: at 100 chats 0.44 → 0.26 COMMITs a turn
        and 164 → 139 µs of SQLite a turn (bench/RESULTS.md, round sixteen; stopping at the
        first pass that brought nothing, as before, left batches at two turns). One chat
        alone never waits; a gateway that is not busy does not wait long, nor spin: a write
        that finds nothing queued or being written, after a lone write's batch, commits in
        this call (``_write_now``)."""
        loop = asyncio.get_running_loop()
        entry = _Queued(fn, loop.create_future(), slow, then=then)
        idle = not self._queued and (self._flusher is None or self._flusher.done())
        if idle and self._now is not None and not slow and self._last_batch <= 1 \
                and not self._write_lock.locked():
            if not self._went_now:
                if self._write_now(entry, loop):
                    if entry.error is not None:
                        raise entry.error
                    return entry.result  # type: ignore[no-any-return]
            else:  # a second write in one pass: the store is busy
                self._behind_now += 1
        self._queued.append(entry)
        if self._flusher is None or self._flusher.done():
            self._flusher = loop.create_task(self._flush())
        return await entry.future  # type: ignore[no-any-return]

    def _write_now(self, entry: _Queued, loop: asyncio.AbstractEventLoop) -> bool:
        """``entry`` alone, committed before ``_write`` returns, when nothing else is queued
        or being written and the last batch was a lone write (one chat; a gateway that is not
        busy): no task, no pass of the loop for the batch, none to wake its caller — two of
        each a turn at one chat. The same transaction ``_flush`` would have run; ``then``
        runs as it would. False when the database is busy (another process): it queues."""
        try:
            self._check_writable()
            alone = self._batch_now([entry])
        except StoreUnavailable as exc:
            entry.error = exc
            return True
        except Exception as exc:  # the connection closed under it
            entry.error = exc
            return True
        if alone is None:
            return False
        self._went_now = True
        loop.call_soon(self._pass_over)
        if isinstance(entry.error, sqlite3.Error):
            entry.error = self._mapped_error(entry.error)
        if entry.error is None:
            self.problem = None
            _followed(entry)
        return True

    def _pass_over(self) -> None:
        self._went_now = False

    async def _flush(self) -> None:
        if self._last_batch > 1:  # busy: let the turns that are running queue theirs too
            queued = -1
            try:
                clock = _clock
                started = last = clock()
                for _ in range(self._gather_passes):
                    now = clock()
                    if (len(self._queued) == queued and now - last < BUSY_PASS) \
                            or now - started > GATHER_SECONDS \
                            or len(self._queued) >= GATHER_WRITES:
                        break  # idle, long enough, or enough
                    queued, last = len(self._queued), now
                    await asyncio.sleep(0)
            except BaseException:  # the gateway stopping: nothing queued is left waiting
                waiting, self._queued = self._queued, []
                for e in waiting:
                    if not e.future.done():
                        e.future.set_exception(StoreUnavailable(
                            "the gateway stopped before this write finished"))
                raise
        while self._queued:
            async with self._write_lock:
                batch = [e for e in self._queued if not e.future.done()]
                self._queued = []
                self._last_batch = len(batch) + self._behind_now
                self._behind_now = 0
                if not batch:
                    continue
                try:
                    await self._run_batch(batch)
                except Exception as exc:  # the connection closed under it
                    for e in batch:
                        e.error = exc
                except BaseException:  # the gateway stopping mid-batch
                    for e in batch:
                        if not e.future.done():
                            e.future.set_exception(StoreUnavailable(
                                "the gateway stopped before this write finished"))
                    raise
            for e in batch:
                if e.error is None:
                    _followed(e)
                if e.future.done():
                    continue
                if e.error is not None:
                    e.future.set_exception(e.error)
                else:
                    e.future.set_result(e.result)

    async def _run_batch(self, batch: list[_Queued]) -> None:
        try:
            self._check_writable()
        except StoreUnavailable as exc:
            for entry in batch:
                entry.error = exc
            return
        alone = await self._batch(batch)
        for entry in alone:  # the batch failed as a whole: each on its own
            try:
                await self._batch([entry])
            except Exception as exc:
                entry.error = exc
        for entry in batch:
            if isinstance(entry.error, sqlite3.Error):
                entry.error = self._mapped_error(entry.error)
        if any(entry.error is None for entry in batch):
            self.problem = None

    async def _batch(self, batch: list[_Queued]) -> list[_Queued]:
        alone = self._batch_now(batch)
        if alone is None:  # another process holds the lock: the thread waits for it
            alone = await self._db._execute(_batch_in_transaction, self._db._conn, batch)
        return alone

    def _batch_now(self, batch: list[_Queued]) -> list[_Queued] | None:
        """``batch`` on the event loop's connection, or None: the database is busy, or a write
        in it may take long (``slow``: it goes to the database thread, the loop goes on)."""
        if self._now is None or any(entry.slow for entry in batch):
            return None  # the loop does not wait for it
        try:
            self._now.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            if _busy(exc):
                return None
            raise
        alone = _batch_in_transaction(self._now, batch, begun=True)
        self._commits_since_checkpoint += 1
        if self._commits_since_checkpoint >= CHECKPOINT_EVERY and (
                self._checkpoint is None or self._checkpoint.done()):
            self._commits_since_checkpoint = 0
            self._checkpoint = asyncio.get_running_loop().create_task(self._checkpoint_log())
        return alone

    async def _checkpoint_log(self) -> None:
        """Copy the write-ahead log into the database file, on the database thread (the
        in-loop connection never does: it would sync the file on the loop).

        The first pass runs beside the loop's writes; what they committed meanwhile is copied
        by a second pass that holds the next batch back (the write lock; a pass with little
        to copy takes the two syncs, ~3 ms), so that the log then holds nothing the file
        lacks and the next write starts it over from its beginning. With the first pass
        alone a busy gateway's log never started over — each pass ended behind the commits
        made while it ran — and grew by every turn's pages for as long as the load lasted:
        1.4 GB after 30 s at 100 chats, each new block of it zeroed by the kernel before
        SQLite wrote it (bench/RESULTS.md, round seventeen)."""
        with suppress(sqlite3.Error, ValueError):  # busy, or the connection closing
            await self._db.execute_fetchall("PRAGMA wal_checkpoint(PASSIVE)")
            if self._closed:  # close() holds the lock and waits for this
                return
            async with self._write_lock:
                if not self._closed:
                    await self._db.execute_fetchall("PRAGMA wal_checkpoint(PASSIVE)")

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[aiosqlite.Connection]:
        """One write transaction; everything in it lands or nothing does."""
        async with self._write_lock:
            self._check_writable()
            with self._mapped():
                await self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                with suppress(sqlite3.Error):  # never hide why (a cancel must stay a cancel)
                    await self._db.execute("ROLLBACK")
                raise
            # A cancel while COMMIT runs leaves it running on the database thread: no ROLLBACK
            # then. A COMMIT that failed (disk full) is rolled back, and said.
            try:
                with self._mapped():
                    await self._db.execute("COMMIT")
            except (sqlite3.Error, StoreUnavailable):
                with suppress(sqlite3.Error):
                    await self._db.execute("ROLLBACK")
                raise
            self.problem = None

    # for other modules' tables (pairing, cron, ...) ------------------------------------------

    async def ensure_schema(self, sql: str, *, postgres: str | None = None) -> None:
        """Create a module's tables (``CREATE TABLE IF NOT EXISTS ...``) in the one database;
        ``postgres``: the same in PostgreSQL's dialect (used there; see ``store_sql``)."""
        async with self._write_lock:
            await self._db.executescript(sql)

    async def fetchone(self, sql: str, params: tuple[Any, ...] = ()) -> Any:
        return await self._fetchone(sql, params)

    async def write(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """``fn`` as one write transaction in one hop to the database thread (``_write``)."""
        return await self._write(fn)

    async def fetchall(self, sql: str, params: tuple[Any, ...] = ()) -> list[Any]:
        return await self._fetchall(sql, params)

    # helpers ------------------------------------------------------------------------------

    async def _fetchone(self, sql: str, params: tuple[Any, ...]) -> Any:
        return next(iter(await self._fetchall(sql, params)), None)

    def _others_version(self) -> int | None:
        """SQLite's ``PRAGMA data_version`` on the loop's connection: the same number for as
        long as no other connection (this process's database thread, another process)
        committed; its own commits leave it. None where that cannot be told."""
        if self._now is None:
            return None
        try:
            return int(self._now.execute("PRAGMA data_version").fetchone()[0])
        except sqlite3.Error:
            return None

    async def _fetchall(self, sql: str, params: tuple[Any, ...]) -> list[Any]:
        """On the loop's connection (a read in WAL mode never waits for a writer; a busy
        one, rare, goes to the thread). Long reads use ``_fetchall_thread``."""
        if self._now is not None:
            try:
                return self._now.execute(sql, params).fetchall()
            except sqlite3.Error as exc:
                if not _busy(exc):
                    raise
        return await self._fetchall_thread(sql, params)

    async def _fetchone_thread(self, sql: str, params: tuple[Any, ...]) -> Any:
        return next(iter(await self._fetchall_thread(sql, params)), None)

    async def _fetchall_thread(self, sql: str, params: tuple[Any, ...]) -> list[Any]:
        """On the database thread: a read that may take long (a search, a whole session)."""
        return list(await self._db.execute_fetchall(sql, params))  # one hop, not three
