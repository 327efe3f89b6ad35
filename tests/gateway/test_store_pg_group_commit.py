"""Group commit on PostgreSQL (issue 19, the cost of a turn): writes that queue while a
transaction runs share the next one; each caller returns only after that COMMIT; one failing
write does not fail the others; a batch whose connection was lost fails whole and is not run
again (whether its COMMIT landed is unknown). A write's statements are pipelined (sent without
waiting for each answer, issue 24): a statement that fails with nothing read after it still
fails its write, a write sees its own rows, and one that raises leaves nothing behind."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import psycopg
import pytest

from gateway.kernel.store import Store


@pytest.fixture
async def store(postgres_url: str) -> AsyncIterator[Any]:
    opened = await Store.open(postgres_url)
    await opened.ensure_schema("CREATE TABLE IF NOT EXISTS t (x INTEGER PRIMARY KEY)")
    yield opened
    await opened.close()


def insert(x: int) -> Callable[[Any], int]:
    """Stores ``x``; answers the id of the transaction it ran in."""
    def fn(db: Any) -> int:
        db.execute("INSERT INTO t (x) VALUES (?)", (x,))
        return int(db.execute("SELECT txid_current()").fetchone()[0])
    return fn


async def stored(store: Any) -> list[int]:
    return [r[0] for r in await store.fetchall("SELECT x FROM t ORDER BY x")]


async def test_queued_writes_share_one_transaction_and_a_failing_one_fails_alone(
        store: Any) -> None:
    await store.write(insert(1))
    async with store.transaction():  # holds the writer: the next writes queue behind it
        writes = [asyncio.ensure_future(store.write(insert(x))) for x in (2, 3, 1, 4)]
        await asyncio.sleep(0)
        assert not any(w.done() for w in writes)
    results = await asyncio.gather(*writes, return_exceptions=True)
    assert isinstance(results[2], psycopg.errors.UniqueViolation)  # x=1 is there already
    assert await stored(store) == [1, 2, 3, 4]
    # the batch was rolled back for the duplicate, then each ran alone
    assert len({results[0], results[1], results[3]}) == 3

    async with store.transaction():
        writes = [asyncio.ensure_future(store.write(insert(x))) for x in (5, 6, 7)]
        await asyncio.sleep(0)
    transactions = await asyncio.gather(*writes)
    assert len(set(transactions)) == 1  # one transaction for the three
    assert await stored(store) == [1, 2, 3, 4, 5, 6, 7]


async def test_a_batch_whose_connection_was_lost_fails_whole_and_is_not_run_again(
        store: Any) -> None:
    def cut(db: Any) -> None:
        db.execute("SELECT pg_terminate_backend(pg_backend_pid())")

    async with store.transaction():
        writes = [asyncio.ensure_future(store.write(fn)) for fn in (insert(1), cut, insert(2))]
        await asyncio.sleep(0)
    results = await asyncio.gather(*writes, return_exceptions=True)
    assert all(isinstance(r, psycopg.OperationalError) for r in results), results
    assert await stored(store) == []  # nothing half-stored, nothing run a second time
    await store.write(insert(3))  # the store connects again for the next write
    assert await stored(store) == [3]


def insert_only(*xs: int) -> Callable[[Any], None]:
    """Stores each of ``xs`` and reads nothing back: no answer is waited for until the end."""
    def fn(db: Any) -> None:
        for x in xs:
            db.execute("INSERT INTO t (x) VALUES (?)", (x,))
    return fn


async def test_a_statement_that_fails_with_nothing_read_after_it_fails_its_write(
        store: Any) -> None:
    await store.write(insert_only(1))
    with pytest.raises(psycopg.errors.UniqueViolation):
        await store.write(insert_only(2, 1))  # the duplicate is the last statement sent
    assert await stored(store) == [1]  # its first row went with it: one transaction
    async with store.transaction():  # the same in a batch: the others are stored
        writes = [asyncio.ensure_future(store.write(fn))
                  for fn in (insert_only(3), insert_only(4, 1), insert_only(5))]
        await asyncio.sleep(0)
    results = await asyncio.gather(*writes, return_exceptions=True)
    assert results[0] is None and results[2] is None
    assert isinstance(results[1], psycopg.errors.UniqueViolation)
    assert await stored(store) == [1, 3, 5]


async def test_a_pipelined_write_reads_its_own_rows_and_one_that_raises_leaves_nothing(
        store: Any) -> None:
    def counted(db: Any) -> list[int]:
        db.execute("INSERT INTO t (x) VALUES (?)", (10,))
        db.execute("INSERT INTO t (x) VALUES (?)", (11,))
        first = db.execute("SELECT COUNT(*) FROM t").fetchone()[0]
        db.execute("INSERT INTO t (x) VALUES (?)", (12,))
        return [first, db.execute("SELECT COUNT(*) FROM t").fetchone()[0]]

    assert await store.write(counted) == [2, 3]

    def broken(db: Any) -> None:
        db.execute("INSERT INTO t (x) VALUES (?)", (20,))
        raise RuntimeError("the write's own code failed")

    with pytest.raises(RuntimeError):
        await store.write(broken)
    await store.write(insert_only(21))  # no transaction was left open: this one commits
    assert await stored(store) == [10, 11, 12, 21]
