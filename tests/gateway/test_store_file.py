"""The store notices when its file is no longer the one it opened: a write fails loudly
(``StoreUnavailable``) instead of landing in an unlinked file that the next start never sees,
and the bus refuses the message (``NotStored``) so no channel acknowledges it."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import pytest

from gateway.kernel.bus import MessageBus, NotStored
from gateway.kernel.events import InboundMessage
from gateway.kernel.store import Store
from gateway.kernel.store_db import StoreUnavailable
from tests.gateway import test_store

store = test_store.store  # the fixture: a fresh database under tmp_path/db/


@pytest.fixture
def where(tmp_path: Path) -> Path:
    """These are SQLite's file's tests: that backend only (test_store runs both)."""
    return tmp_path / "db" / "parley.db"


def message(text: str) -> InboundMessage:
    return InboundMessage(channel="local", chat_id="c1", sender_id="u1", text=text)


async def test_a_deleted_database_refuses_writes_and_says_why(store: Store,
                                                             tmp_path: Path) -> None:
    assert await store.inbox_add(message("kept"))
    assert store.check_file() is None and store.problem is None
    shutil.rmtree(tmp_path / "db")
    with pytest.raises(StoreUnavailable, match="is gone"):
        await store.inbox_add(message("would be lost"))
    with pytest.raises(StoreUnavailable, match="is gone"):
        async with store.transaction() as db:
            await db.execute("DELETE FROM inbox")
    assert store.problem is not None and "is gone" in store.problem
    bus = MessageBus()
    bus.attach_store(store, lambda kind: 60.0)
    with pytest.raises(NotStored, match="could not be stored"):
        await bus.publish_inbound(message("refused"))
    assert bus.inbound_size == 0


async def test_a_replaced_database_is_refused_and_one_moved_back_works_again(
        store: Store, tmp_path: Path) -> None:
    path = tmp_path / "db" / "parley.db"
    os.link(path, tmp_path / "kept.db")  # the same file, under another name
    os.unlink(path)
    path.write_bytes(b"")  # something else now has its name
    with pytest.raises(StoreUnavailable, match="was replaced"):
        await store.inbox_add(message("refused"))
    os.unlink(path)
    os.link(tmp_path / "kept.db", path)  # the very file is back
    assert await store.inbox_add(message("stored again"))
    assert store.problem is None
    assert [m.text for m in await store.inbox_pending()] == ["stored again"]


async def test_a_cancelled_transaction_stays_cancelled_and_leaves_nothing(
        store: Store) -> None:
    started = asyncio.Event()

    async def write() -> None:
        async with store.transaction() as db:
            await db.execute("INSERT INTO limit_notices VALUES ('s', 'p', 'now')")
            started.set()
            await asyncio.Event().wait()  # cancelled here, mid-transaction

    task = asyncio.create_task(write())
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await store.fetchall("SELECT * FROM limit_notices") == []
    async with store.transaction() as db:  # the connection is usable: no transaction left
        await db.execute("INSERT INTO limit_notices VALUES ('s', 'p', 'now')")
    assert len(await store.fetchall("SELECT * FROM limit_notices")) == 1


async def test_a_database_made_read_only_is_refused_and_works_again_when_writable(
        store: Store, where: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # CI runs as root, for whom every file is writable: ``access`` answers as a user would
    monkeypatch.setattr(os, "access", lambda path, mode: bool(os.stat(path).st_mode & 0o200))
    assert await store.inbox_add(message("kept"))  # writable: remembered, not asked again
    where.chmod(0o444)
    with pytest.raises(StoreUnavailable, match="is not writable"):
        await store.inbox_add(message("refused"))
    where.chmod(0o644)
    assert await store.inbox_add(message("stored again"))
    assert [m.text for m in await store.inbox_pending()] == ["kept", "stored again"]
