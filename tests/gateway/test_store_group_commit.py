"""Group commit (issue 24): writes that queue while a transaction runs share the next one;
each caller returns only after that COMMIT; one failing write does not fail the others; a
caller cancelled before its batch starts is left out."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from gateway.kernel.store import Store


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
    await store._db.set_trace_callback(statements.append)
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
