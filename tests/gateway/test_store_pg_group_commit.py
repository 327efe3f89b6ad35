"""Group commit on PostgreSQL (issue 19, the cost of a turn): writes that queue while a
transaction runs share the next one; each caller returns only after that COMMIT; one failing
write does not fail the others; a batch whose connection was lost fails whole and is not run
again (whether its COMMIT landed is unknown)."""

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
