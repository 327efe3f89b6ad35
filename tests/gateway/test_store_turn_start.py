"""``Store.turn_start``: a turn's session id and latest compaction, held in memory on SQLite
while no other connection writes. Whatever starts a session or adds a compaction — this
process's ``/new`` or compaction, another process — is seen by the next turn."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import psycopg
import pytest

from gateway.kernel.store import Store


@pytest.fixture(params=["sqlite", "postgresql"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> Path | str:
    if request.param == "postgresql":
        return str(request.getfixturevalue("postgres_url"))
    return tmp_path / "parley.db"


def _elsewhere(where: Path | str, sql: str, params: tuple[object, ...]) -> None:
    """``sql`` committed by another process's connection."""
    if isinstance(where, Path):
        with sqlite3.connect(where) as db:
            db.execute(sql, params)
    else:
        with psycopg.connect(where, autocommit=True) as db:
            db.execute(sql.replace("?", "%s"), params)


async def _compact(store: Store, session_id: int, summary: str) -> int:
    made = await store.add_compaction(session_id, summary=summary, summary_tokens=3,
                                      first_kept_id=0, tokens_before=10,
                                      messages_summarised=2)
    return made.id


async def test_a_turn_sees_every_new_session_and_compaction(where: Path | str) -> None:
    store = await Store.open(where)
    try:
        first, none = await store.turn_start("local:a")
        assert none is None and first == (await store.active_session("local:a")).id
        assert await store.turn_start("local:a") == (first, None)
        # this process: /new, then a compaction (both through transaction())
        second = (await store.new_session("local:a")).id
        assert second != first and (await store.turn_start("local:a"))[0] == second
        made = await _compact(store, second, "one")
        session_id, latest = await store.turn_start("local:a")
        assert session_id == second and latest is not None and latest.id == made
        # another process: a compaction, then a session of its own for the key
        _elsewhere(where, "INSERT INTO compactions (session_id, summary, summary_tokens, "
                          "first_kept_id, tokens_before, messages_summarised, created_at) "
                          "VALUES (?, 'two', 3, 0, 10, 2, '2026-01-01')", (second,))
        _, latest = await store.turn_start("local:a")
        assert latest is not None and latest.summary == "two"
        _elsewhere(where, "UPDATE sessions SET active = 0 WHERE key = ?", ("local:a",))
        _elsewhere(where, "INSERT INTO sessions (key, active, created_at, updated_at) "
                          "VALUES (?, 1, '2026-01-01', '2026-01-01')", ("local:a",))
        third, latest = await store.turn_start("local:a")
        assert third not in (first, second) and latest is None
        assert third == (await store.active_session("local:a")).id
    finally:
        await store.close()


async def test_sqlite_reads_a_held_session_with_one_pragma(tmp_path: Path) -> None:
    store = await Store.open(tmp_path / "parley.db")
    try:
        await store.turn_start("local:a")
        await store.save_turn(session_id=(await store.turn_start("local:a"))[0],
                              turn_id="t1", inbound_id=None, messages=[])  # the loop's write
        assert store._now is not None
        said: list[str] = []
        store._now.set_trace_callback(said.append)
        await store.turn_start("local:a")
        store._now.set_trace_callback(None)
        assert said == ["PRAGMA data_version"]
    finally:
        await store.close()
