from __future__ import annotations

import sqlite3
from pathlib import Path

import psycopg
import pytest

from gateway.kernel.store import NewMessage, Store


@pytest.fixture(params=["sqlite", "postgresql"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> Path | str:
    """Each test runs on both backends: an SQLite file, and a fresh PostgreSQL database."""
    if request.param == "postgresql":
        return str(request.getfixturevalue("postgres_url"))
    return tmp_path / "db" / "parley.db"


@pytest.fixture
async def store(where: Path | str):  # type: ignore[no-untyped-def]
    s = await Store.open(where)
    yield s
    await s.close()


def user(text: str) -> NewMessage:
    return NewMessage({"role": "user", "content": text}, 5)


async def test_wal_and_sessions(store: Store) -> None:
    if store.dialect == "sqlite":
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
    with pytest.raises((sqlite3.Error, psycopg.Error)):
        await store.save_turn(session_id=s.id, turn_id="t1", inbound_id=None,
                              messages=[user("a"), user("b")],
                              snapshot={"hash": {"not": "storable"}, "total_tokens": 1})
    assert await store.recent_messages(s.id, 10) == []
    assert (await store.active_session("k")).message_count == 0


async def test_reopen_keeps_data(where: Path | str) -> None:
    path = where
    s = await Store.open(path)
    sess = await s.active_session("k")
    await s.save_turn(session_id=sess.id, turn_id="t", inbound_id="m1", messages=[user("a")],
                      snapshot={"hash": "h", "total_tokens": 42})
    await s.close()
    await s.close()
    s = await Store.open(path)
    try:  # the row's turn comes back with it (its column)
        assert (await s.latest_snapshot(sess.id)) == {"turn_id": "t", "hash": "h",
                                                      "total_tokens": 42}
        assert (await s.active_session("k")).last_context_tokens == 42
    finally:
        await s.close()


def old_ledger(path: Path, more_columns: str = "") -> Path:
    """A database whose ``llm_calls`` has the first ledger's columns (and ``more_columns``),
    with one row."""
    db = sqlite3.connect(path)
    db.executescript(
        "CREATE TABLE llm_calls (id INTEGER PRIMARY KEY AUTOINCREMENT, turn_id TEXT NOT NULL, "
        "model TEXT NOT NULL, prompt_tokens INTEGER NOT NULL, completion_tokens INTEGER NOT "
        f"NULL, latency_ms REAL NOT NULL, attempts INTEGER NOT NULL, created_at TEXT NOT NULL"
        f"{more_columns});"
        "INSERT INTO llm_calls (turn_id, model, prompt_tokens, completion_tokens, latency_ms, "
        "attempts, created_at) VALUES ('t0', 'old-model', 10, 2, 5.0, 1, '2024-01-01');")
    db.commit()
    db.close()
    return path


async def test_an_older_database_gains_the_ledger_columns(tmp_path: Path) -> None:
    """A database from before the usage ledger: its llm_calls rows stay, the new columns
    are added, and a turn with usage tags writes them."""
    from datetime import UTC, datetime

    from gateway.kernel.store import LLMCallRecord, UsageTags

    store = await Store.open(old_ledger(tmp_path / "old.db"))
    try:
        session = await store.active_session("local:c1")
        at = datetime(2025, 1, 6, 8, 0, tzinfo=UTC)
        await store.save_turn(
            session_id=session.id, turn_id="t1", inbound_id=None,
            messages=[NewMessage({"role": "user", "content": "hi"}, 1)],
            calls=[LLMCallRecord("m", 100, 20, 3.0, 1, cost=0.5)],
            usage=UsageTags(person="local:ada", chat="local:c1", trust="member", at=at,
                            day="2025-01-06"))
        total = await store.usage_total()
        assert (total.calls, total.prompt_tokens, total.cost) == (2, 110, 0.5)
        ada = await store.usage_total(person="local:ada", day="2025-01-06")
        assert (ada.calls, ada.completion_tokens, ada.cost) == (1, 20, 0.5)
        assert [r.key for r in await store.usage_by("person")] == ["local:ada", "(unknown)"]
    finally:
        await store.close()


async def test_media_steps_are_kept_in_the_ledger_by_kind(tmp_path: Path) -> None:
    """A database from before the media steps gains ``kind`` (its rows are ``chat`` calls)
    and ``audio_seconds``; a transcription is kept beside the model calls."""
    from gateway.kernel.store import LLMCallRecord

    store = await Store.open(old_ledger(tmp_path / "ledger.db", ", session_id INTEGER, "
                                        "person TEXT, chat TEXT, trust TEXT, cost REAL NOT "
                                        "NULL DEFAULT 0, day TEXT"))
    try:
        session = await store.active_session("local:c1")
        await store.save_calls(session_id=session.id, turn_id="t1", calls=[
            LLMCallRecord("whisper-1", 0, 0, 80.0, 1, cost=0.0002, kind="transcription",
                          audio_seconds=2.5)], usage=None)
        by_kind = {r.key: (r.calls, r.cost) for r in await store.usage_by("kind")}
        assert by_kind == {"chat": (1, 0.0), "transcription": (1, 0.0002)}
        row = await store._fetchone("SELECT audio_seconds FROM llm_calls WHERE turn_id = 't1'",
                                    ())
        assert row[0] == 2.5
    finally:
        await store.close()


async def test_layer_texts_of_a_version_2_database_count_as_written_at_the_upgrade(
        where: Path | str) -> None:
    """Schema version 3 adds ``layer_texts.touched_at`` (retention's grace): the texts a
    version 2 database holds get the upgrade's time, and turns write it from then on."""
    store = await Store.open(where)
    try:
        async with store.transaction() as db:
            await db.execute("ALTER TABLE layer_texts DROP COLUMN touched_at")
            await db.execute("UPDATE schema_versions SET version = 2 WHERE component = 'core'")
            await db.execute("INSERT INTO layer_texts (hash, text) VALUES (?, ?)",
                             ("a" * 64, "an older text"))
    finally:
        await store.close()
    store = await Store.open(where)
    try:
        [(touched,)] = await store.fetchall("SELECT touched_at FROM layer_texts")
        assert touched is not None and touched > "2026-"
        session = await store.active_session("local:c1")
        await store.save_turn(session_id=session.id, turn_id="t1", inbound_id=None,
                              messages=[user("hi")], texts={"b" * 64: "a newer text"})
        rows = await store.fetchall("SELECT hash, touched_at FROM layer_texts ORDER BY hash")
        assert [r[0][0] for r in rows] == ["a", "b"] and all(r[1] for r in rows)
    finally:
        await store.close()
