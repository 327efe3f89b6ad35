"""Group commit (issue 24): writes that queue while a transaction runs share the next one;
each caller returns only after that COMMIT; one failing write does not fail the others; a
caller cancelled before its batch starts is left out."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from gateway.kernel import store_db
from gateway.kernel.store import Store
from gateway.kernel.store_db import StoreUnavailable


@pytest.fixture
async def store(tmp_path: Path) -> Store:
    opened = await Store.open(tmp_path / "parley.db")
    await opened.ensure_schema("CREATE TABLE IF NOT EXISTS t (x INTEGER PRIMARY KEY)")
    yield opened  # type: ignore[misc]
    await opened.close()


def insert(x: int) -> object:
    return lambda conn: conn.execute("INSERT INTO t (x) VALUES (?)", (x,)).lastrowid


async def test_queued_writes_share_one_transaction_and_a_failing_one_fails_alone(
        store: Store) -> None:
    statements: list[str] = []
    await store._db.set_trace_callback(statements.append)  # the database thread's connection
    assert store._now is not None  # and the one used on the event loop's thread
    store._now.set_trace_callback(statements.append)
    await store.write(insert(1))
    statements.clear()
    async with store.transaction():  # holds the writer: the next writes queue behind it
        writes = [asyncio.ensure_future(store.write(insert(x))) for x in (2, 3, 1, 4)]
        await asyncio.sleep(0)
        assert not any(w.done() for w in writes)
    results = await asyncio.gather(*writes, return_exceptions=True)
    assert results[:2] == [2, 3] and results[3] == 4
    assert isinstance(results[2], sqlite3.IntegrityError)  # x=1 is there already
    rows = await store.fetchall("SELECT x FROM t ORDER BY x")
    assert [r[0] for r in rows] == [1, 2, 3, 4]
    # the transaction() itself, then the batch (rolled back for the duplicate), then each
    # write alone
    assert statements.count("BEGIN IMMEDIATE") == 2 + 4

    statements.clear()
    async with store.transaction():
        writes = [asyncio.ensure_future(store.write(insert(x))) for x in (5, 6, 7)]
        await asyncio.sleep(0)
    assert await asyncio.gather(*writes) == [5, 6, 7]
    assert statements.count("BEGIN IMMEDIATE") == 2  # the transaction() and one batch
    assert statements.count("COMMIT") == 2


async def staggered(store: Store, xs: list[int]) -> list[object]:
    """A write each for ``xs``, each queued one pass of the event loop after the last (as
    turns running side by side reach their writes)."""
    writes = []
    for x in xs:
        writes.append(asyncio.ensure_future(store.write(insert(x))))
        await asyncio.sleep(0)
    return await asyncio.gather(*writes)


async def test_a_busy_store_gathers_writes_over_a_few_passes_of_the_loop(
        store: Store) -> None:
    """After a batch of several writes, the next batch waits while writes keep coming (pass
    after pass of the loop), so turns running side by side share COMMITs; a store whose
    batches hold one write each (one chat alone) never waits."""
    assert store._now is not None
    statements: list[str] = []
    store._now.set_trace_callback(statements.append)
    assert await staggered(store, [1, 2, 3]) == [1, 2, 3]
    assert statements.count("COMMIT") == 3  # one write a batch: nobody waits
    assert await asyncio.gather(store.write(insert(4)), store.write(insert(5))) == [4, 5]
    statements.clear()
    assert await staggered(store, [6, 7, 8]) == [6, 7, 8]
    assert statements.count("COMMIT") == 1  # busy: the three gathered into one
    rows = await store.fetchall("SELECT x FROM t ORDER BY x")
    assert [r[0] for r in rows] == list(range(1, 9))



async def test_a_lone_write_commits_in_its_call_and_a_second_in_that_pass_queues(
        store: Store) -> None:
    """A store that is not busy (the last batch one write, nothing queued) commits a write in
    the call itself: its coroutine finishes at its first step, with no task and no pass of the
    loop, and what must follow the commit (``then``) has run. A second write in the same pass
    of the loop queues, and the store counts itself busy: the next writes gather."""
    assert store._now is not None
    statements: list[str] = []
    store._now.set_trace_callback(statements.append)
    assert await store.write(insert(1)) == 1
    await asyncio.sleep(0)  # another pass of the loop
    followed: list[object] = []
    flusher = store._flusher  # (the last one's, done)
    lone = store._write(insert(2), then=followed.append)
    with pytest.raises(StopIteration) as finished:
        lone.send(None)
    assert finished.value.value == 2 and followed == [2]
    assert store._flusher is flusher and statements.count("COMMIT") == 2
    statements.clear()
    # two writes whose turns reach them in one pass: the first commits in its call, the
    # second queues behind it
    assert await asyncio.gather(store.write(insert(3)), store.write(insert(4))) == [3, 4]
    assert statements.count("COMMIT") == 2 and store._last_batch == 2  # busy from now on
    statements.clear()
    assert await staggered(store, [5, 6, 7]) == [5, 6, 7]
    assert statements.count("COMMIT") == 1  # gathered
    rows = await store.fetchall("SELECT x FROM t ORDER BY x")
    assert [r[0] for r in rows] == [1, 2, 3, 4, 5, 6, 7]


async def test_a_busy_loop_keeps_gathering_until_a_pass_runs_nothing(
        store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pass of the loop that ran other work (the turns in flight) but brought no write does
    not end the gathering: the write a later pass brings shares the COMMIT. A pass that ran
    nothing ends it, and so does ``GATHER_SECONDS`` (a fake clock: each busy pass moves it)."""
    assert store._now is not None
    now = [0.0]
    monkeypatch.setattr(store_db, "_clock", lambda: now[0])
    statements: list[str] = []
    store._now.set_trace_callback(statements.append)

    async def busy_passes(n: int, each: float) -> None:
        for _ in range(n):
            now[0] += each  # the other callbacks of this pass took ``each`` seconds
            await asyncio.sleep(0)

    assert await asyncio.gather(store.write(insert(1)), store.write(insert(2))) == [1, 2]
    statements.clear()
    first = asyncio.ensure_future(store.write(insert(3)))
    await busy_passes(3, store_db.GATHER_SECONDS / 8)
    now[0] += store_db.GATHER_SECONDS / 8  # and this pass (busy too) makes another write
    second = asyncio.ensure_future(store.write(insert(4)))
    assert await asyncio.gather(first, second) == [3, 4]
    assert statements.count("COMMIT") == 1  # gathered across the busy passes

    statements.clear()
    first = asyncio.ensure_future(store.write(insert(5)))
    await busy_passes(2, store_db.GATHER_SECONDS)  # busy for longer than the gathering waits
    second = asyncio.ensure_future(store.write(insert(6)))
    assert await asyncio.gather(first, second) == [5, 6]
    assert statements.count("COMMIT") == 2  # the first went when its time was up
    rows = await store.fetchall("SELECT x FROM t ORDER BY x")
    assert [r[0] for r in rows] == [1, 2, 3, 4, 5, 6]

async def test_writes_gathering_when_the_gateway_stops_are_told_so(store: Store) -> None:
    await asyncio.gather(store.write(insert(1)), store.write(insert(2)))  # busy from now on
    waiting = asyncio.ensure_future(store.write(insert(3)))
    for _ in range(2):  # the write queued, then the flusher gathering
        await asyncio.sleep(0)
    flusher = store._flusher
    assert flusher is not None and not flusher.done() and not waiting.done()
    flusher.cancel()
    with pytest.raises(StoreUnavailable, match="stopped before this write finished"):
        await waiting
    with pytest.raises(asyncio.CancelledError):
        await flusher
    assert await store.write(insert(4)) == 4  # the next write gets a flusher of its own
    rows = await store.fetchall("SELECT x FROM t ORDER BY x")
    assert [r[0] for r in rows] == [1, 2, 4]


async def test_a_write_cancelled_before_its_batch_is_left_out(store: Store) -> None:
    async with store.transaction():
        kept = asyncio.ensure_future(store.write(insert(10)))
        dropped = asyncio.ensure_future(store.write(insert(11)))
        await asyncio.sleep(0)
        dropped.cancel()
    assert await kept == 10
    with pytest.raises(asyncio.CancelledError):
        await dropped
    rows = await store.fetchall("SELECT x FROM t")
    assert [r[0] for r in rows] == [10]


async def test_a_write_waits_for_another_process_without_stopping_the_loop(
        store: Store, tmp_path: Path) -> None:
    """Writes run on the event loop's own connection, which never waits for a lock: while
    another process holds the database, the write goes to the database thread and waits
    there, and the loop goes on serving everything else."""
    other = sqlite3.connect(tmp_path / "parley.db", isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another process writing
    write = asyncio.ensure_future(store.write(insert(20)))
    ticks = 0
    for _ in range(20):  # the loop keeps turning while the write waits
        await asyncio.sleep(0)
        ticks += 1
    assert ticks == 20 and not write.done()
    assert await store.fetchall("SELECT x FROM t") == []  # reads do not wait either
    other.execute("COMMIT")
    other.close()
    assert await write == 20
    assert [r[0] for r in await store.fetchall("SELECT x FROM t")] == [20]


async def test_the_log_is_copied_into_the_database_file_off_the_loop(
        store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The loop's connection never checkpoints (that syncs the file); every so many commits
    the database thread copies the write-ahead log into the file."""
    import shutil

    from gateway.kernel import store_db

    monkeypatch.setattr(store_db, "CHECKPOINT_EVERY", 3)

    def main_file_rows() -> list[int]:  # the database file alone, as without its log
        copy = tmp_path / "copy"
        copy.mkdir(exist_ok=True)
        shutil.copy(tmp_path / "parley.db", copy / "parley.db")
        conn = sqlite3.connect(copy / "parley.db")
        try:
            if not conn.execute("SELECT 1 FROM sqlite_master WHERE name = 't'").fetchone():
                return []  # not even the table yet
            return [r[0] for r in conn.execute("SELECT x FROM t ORDER BY x")]
        finally:
            conn.close()
            shutil.rmtree(copy)

    if store._checkpoint is not None:  # opening the store wrote too
        await store._checkpoint
    store._commits_since_checkpoint = 0
    for x in (31, 32):
        await store.write(insert(x))
    assert store._checkpoint is None or store._checkpoint.done()
    assert 32 not in main_file_rows()  # still only in the log
    await store.write(insert(33))
    assert store._checkpoint is not None
    await store._checkpoint
    assert main_file_rows()[-3:] == [31, 32, 33]


async def test_a_long_write_runs_on_the_database_thread(store: Store) -> None:
    """A backfill or a retention pass (``slow``) would stop every chat while it ran on the
    loop's connection: it runs on the thread's, and the loop's sees none of it."""
    on_loop: list[str] = []
    on_thread: list[str] = []
    assert store._now is not None
    store._now.set_trace_callback(on_loop.append)
    await store._db.set_trace_callback(on_thread.append)
    assert await store._write(insert(40), slow=True) == 40
    assert await store.write(insert(41)) == 41
    assert [s for s in on_thread if "INSERT" in s] == ["INSERT INTO t (x) VALUES (40)"]
    assert [s for s in on_loop if "INSERT" in s] == ["INSERT INTO t (x) VALUES (41)"]


async def test_the_log_starts_over_though_a_write_landed_while_it_was_copied(
        store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """A busy gateway commits while the database thread copies the log. A second pass, with
    the writes held back, copies those commits too, so the next write starts the log over:
    with one pass the log never started over under steady load, and grew without end."""
    monkeypatch.setattr(store_db, "CHECKPOINT_EVERY", 10**9)  # the test runs it itself
    if store._checkpoint is not None:  # opening the store wrote too
        await store._checkpoint
    for x in range(1, 31):
        await store.write(insert(x))
    assert store._now is not None
    async with store._write_lock:  # a batch on the loop's connection, committed ...
        store._now.execute("BEGIN IMMEDIATE")
        store._now.execute("INSERT INTO t (x) VALUES (31)")
        checkpoint = asyncio.ensure_future(store._checkpoint_log())
        await asyncio.sleep(0)  # (its first pass queued on the database thread)
        await store._db.execute_fetchall("SELECT 1")  # ... once the first pass is done
        store._now.execute("COMMIT")
    await checkpoint
    await store.write(insert(32))
    log_frames = (await store._db.execute_fetchall("PRAGMA wal_checkpoint(PASSIVE)"))[0][1]
    assert 0 < log_frames <= 3  # the last write's pages alone: the log started over
    assert [r[0] for r in await store.fetchall("SELECT x FROM t")] == list(range(1, 33))


async def test_a_log_grown_past_its_limit_is_cut_back_when_it_starts_over(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store_db, "LOG_LIMIT_BYTES", 64 * 1024)
    monkeypatch.setattr(store_db, "CHECKPOINT_EVERY", 10**9)
    store = await Store.open(tmp_path / "parley.db")
    try:
        await store.ensure_schema("CREATE TABLE IF NOT EXISTS p (x INTEGER PRIMARY KEY, "
                                  "pad TEXT)")
        if store._checkpoint is not None:
            await store._checkpoint
        for x in range(100):  # a burst: ~100 pages in the log
            await store.write(lambda c, x=x: c.execute("INSERT INTO p VALUES (?, ?)",
                                                       (x, "p" * 3000)))
        log = tmp_path / "parley.db-wal"
        assert log.stat().st_size > 300 * 1024
        await store._checkpoint_log()
        await store.write(lambda c: c.execute("INSERT INTO p VALUES (100, 'last')"))
        assert log.stat().st_size <= 64 * 1024
        rows = await store.fetchall("SELECT count(*) FROM p")
        assert rows[0][0] == 101
    finally:
        await store.close()
