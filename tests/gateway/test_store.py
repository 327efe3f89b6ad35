from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from gateway.kernel.store import NewMessage, Store


@pytest.fixture
async def store(tmp_path: Path):  # type: ignore[no-untyped-def]
    s = await Store.open(tmp_path / "db" / "parley.db")
    yield s
    await s.close()


def user(text: str) -> NewMessage:
    return NewMessage({"role": "user", "content": text}, 5)


async def test_wal_and_sessions(store: Store) -> None:
    async with store._db.execute("PRAGMA journal_mode") as cur:
        assert (await cur.fetchone())[0] == "wal"
    a = await store.active_session("local:c1")
    assert (await store.active_session("local:c1")).id == a.id
    b = await store.new_session("local:c1")
    assert b.id != a.id
    rows = await store.list_sessions(include_inactive=True)
    assert {(r.id, r.active) for r in rows} == {(a.id, False), (b.id, True)}
    assert (await store.find_session("local:c1")).id == b.id  # type: ignore[union-attr]
    assert (await store.find_session(str(a.id))).id == a.id  # type: ignore[union-attr]


async def test_recent_messages_reads_only_the_tail(store: Store) -> None:
    s = await store.active_session("k")
    for i in range(30):
        await store.save_turn(session_id=s.id, turn_id=f"t{i}", inbound_id=None,
                              messages=[user(f"m{i}")])
    recent = await store.recent_messages(s.id, 3)
    assert [m.body["content"] for m in recent] == ["m27", "m28", "m29"]
    assert all(m.tokens == 5 for m in recent)
    assert (await store.active_session("k")).message_count == 30


async def test_a_turn_is_one_transaction(store: Store) -> None:
    s = await store.active_session("k")
    # a hash sqlite cannot store fails after the messages were inserted: all rolled back
    with pytest.raises(sqlite3.Error):
        await store.save_turn(session_id=s.id, turn_id="t1", inbound_id=None,
                              messages=[user("a"), user("b")],
                              snapshot={"hash": {"not": "storable"}, "total_tokens": 1})
    assert await store.recent_messages(s.id, 10) == []
    assert (await store.active_session("k")).message_count == 0


async def test_reopen_keeps_data(tmp_path: Path) -> None:
    path = tmp_path / "p.db"
    s = await Store.open(path)
    sess = await s.active_session("k")
    await s.save_turn(session_id=sess.id, turn_id="t", inbound_id="m1", messages=[user("a")],
                      snapshot={"hash": "h", "total_tokens": 42})
    await s.close()
    await s.close()
    s = await Store.open(path)
    assert (await s.latest_snapshot(sess.id)) == {"hash": "h", "total_tokens": 42}
    assert (await s.active_session("k")).last_context_tokens == 42
    await s.close()
