"""The search index under ``session_search`` (``gateway/kernel/store_search.py``)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from gateway.kernel.store import NewMessage, SessionRow, Store
from gateway.kernel.store_db import Database
from gateway.kernel.store_search import INDEX_BATCH, LOOP_INDEX_LIMIT, index_some


async def test_messages_from_before_the_index_are_indexed_once(tmp_path: Path) -> None:
    path = tmp_path / "parley.db"
    store = await Store.open(path)
    try:
        dm = await store.active_session("telegram:42")
        sub = await store.active_session("subagent:telegram:42:ab12")
        for session, text in ((dm, "the heron nests by the mill"),
                              (sub, "a subagent saw the heron too")):
            await store.save_turn(session_id=session.id, turn_id=f"t{session.id}",
                                  inbound_id=None, messages=[  # as written before the index
                                      NewMessage({"role": "user", "content": text}, 9),
                                      NewMessage({"role": "tool", "tool_call_id": "c",
                                                  "content": "heron in a tool result"}, 9)])
        assert await store.search_messages("heron", chat=None) == []
        # a database from before the index: no backfill done yet
        await store._write(lambda db: db.execute("DELETE FROM search_backfill"))
    finally:
        await store.close()
    store = await Store.open(path)
    try:
        hits = await store.search_messages("heron", chat="telegram:42")
        assert [(h.text, h.person) for h in hits] == [("the heron nests by the mill", None)]
        assert await store.search_messages("heron", chat="telegram:42", person="telegram:7") \
            == []
        assert await store.backfill_search() == 0  # once
    finally:
        await store.close()


def _index_terms(path: Path) -> dict[str, int]:
    """Every term the FTS5 index holds, with how many messages hold it (``fts5vocab``): what
    is left in the index itself, whatever the messages table says."""
    con = sqlite3.connect(path)
    try:
        con.execute("CREATE VIRTUAL TABLE temp.terms USING fts5vocab(main, message_text, row)")
        return {term: docs for term, docs in con.execute("SELECT term, doc FROM temp.terms")}
    finally:
        con.close()


async def _turn(store: Store, session_id: int, turn_id: str, texts: list[str], *,
                index: tuple[str, str | None] | None) -> None:
    roles = ("user", "assistant")
    await store.save_turn(session_id=session_id, turn_id=turn_id, inbound_id=None,
                          messages=[NewMessage({"role": roles[i % 2], "content": t}, 5)
                                    for i, t in enumerate(texts)], index=index)


async def test_the_index_keeps_no_copy_and_finds_by_the_turns_tags(tmp_path: Path) -> None:
    path = tmp_path / "parley.db"
    store = await Store.open(path)
    try:
        dm = await store.active_session("telegram:42")
        group = await store.active_session("telegram:-100")
        await _turn(store, dm.id, "t1", ["where is the heron", "by the mill pond"],
                    index=("telegram:42", "telegram:42"))
        await _turn(store, group.id, "t2", ["a heron in the group", "seen"],
                    index=("telegram:-100", "telegram:7"))
        # a turn written again without tags (a later save of the same turn) keeps them
        await store.save_turn(session_id=dm.id, turn_id="t1", inbound_id=None, index=None,
                              messages=[NewMessage({"role": "tool", "tool_call_id": "c",
                                                    "content": "heron by tool"}, 5)])
        hits = await store.search_messages("heron", chat="telegram:42")
        assert [(h.text, h.person, h.role, h.session_key) for h in hits] == [
            ("where is the heron", "telegram:42", "user", "telegram:42")]
        assert [h.text for h in await store.search_messages(
            "heron", chat="telegram:-100", person="telegram:7")] == ["a heron in the group"]
        assert await store.search_messages("heron", chat="telegram:-100",
                                           person="telegram:42") == []
        assert [h.text for h in await store.search_messages("mill", chat=None)] == [
            "by the mill pond"]
        # words under three characters: no trigram, the chat's texts are read instead
        assert [h.text for h in await store.search_messages("by", chat="telegram:42")] == [
            "by the mill pond"]
        assert await store.search_messages("by", chat="telegram:-100") == []
        tables = {r[0] for r in await store._fetchall(
            "SELECT name FROM sqlite_schema WHERE name LIKE 'message_%'", ())}
        assert "message_search_content" not in tables and "message_text_content" not in tables
    finally:
        await store.close()


async def test_removed_turns_leave_nothing_in_the_index(tmp_path: Path) -> None:
    path = tmp_path / "parley.db"
    store = await Store.open(path)
    try:
        dm = await store.active_session("local:a")
        sub = await store.active_session("subagent:local:a:x1")
        await _turn(store, dm.id, "keep", ["kingfisher stays", "fine"],
                    index=("local:a", "local:me"))
        await _turn(store, dm.id, "gone", ["wagtail leaves", "[image] ok"],
                    index=("local:a", "local:me"))
        await _turn(store, sub.id, "sub", ["wagtail in a subagent", "x"], index=None)
        await _turn(store, dm.id, "new", ["wagtail returns", "ok"], index=("local:a", "local:me"))
        await store._write(lambda db: _remove(db, ["new"]), slow=True)  # before its batch
        assert await store.index_messages() == 4
        assert _index_terms(path).get("wag") == 1
        await store._write(lambda db: _remove(db, ["gone", "sub"]), slow=True)
        terms = _index_terms(path)
        assert "wag" not in terms and "fis" in terms
        _check_index(path)
        assert await store.search_messages("wagtail", chat=None) == []
        assert [h.text for h in await store.search_messages("kingfisher", chat="local:a")] \
            == ["kingfisher stays"]
    finally:
        await store.close()


def _check_index(path: Path) -> None:
    """FTS5's own check that the index is consistent in itself (not against ``messages``: it
    holds ``indexed_text``, not the JSON bodies)."""
    con = sqlite3.connect(path)
    try:
        con.execute("INSERT INTO message_text(message_text) VALUES ('integrity-check')")
    finally:
        con.close()


TAGS = ("local:a", "local:me")
"""The chat and person the batch tests' messages are found under."""


async def _store_with_an_osprey(path: Path) -> tuple[Store, SessionRow]:
    """A store with one turn in chat ``local:a`` ("the osprey dives"), not yet indexed."""
    store = await Store.open(path)
    try:
        dm = await store.active_session("local:a")
        await _turn(store, dm.id, "t0", ["the osprey dives", "splash"], index=TAGS)
    except BaseException:
        await store.close()
        raise
    return store, dm


async def test_the_index_takes_messages_in_batches_and_misses_none(tmp_path: Path) -> None:
    """A turn's write leaves its messages to the next batch: at ``INDEX_BATCH`` waiting, at a
    search (which finds what was said a moment ago), at close, at the open after a crash."""
    path = tmp_path / "parley.db"
    store, dm = await _store_with_an_osprey(path)
    try:
        assert _index_terms(path) == {}  # its own transaction indexed nothing
        assert [h.text for h in await store.search_messages("osprey", chat="local:a")] == [
            "the osprey dives"]
        assert _index_terms(path).get("osp") == 1
        for i in range(INDEX_BATCH // 2 - 1):
            await _turn(store, dm.id, f"b{i}", [f"plover {i}", "ok"], index=TAGS)
        assert "plo" not in _index_terms(path)
        await _turn(store, dm.id, "last", ["plover last", "ok"], index=TAGS)  # the 64th
        assert store._indexing is not None
        assert await store._indexing == INDEX_BATCH
        assert _index_terms(path)["plo"] == INDEX_BATCH // 2
        await _turn(store, dm.id, "t1", ["a curlew calls", "ok"], index=TAGS)
    finally:
        await store.close()
    assert _index_terms(path).get("cur") == 1  # at close
    store = await Store.open(path)
    try:
        await _turn(store, dm.id, "t2", ["a dunlin runs", "ok"], index=TAGS)
    finally:
        await Database.close(store)  # as a crash leaves it: not indexed
    assert "dun" not in _index_terms(path)
    store = await Store.open(path)
    await store.close()
    assert _index_terms(path).get("dun") == 1
    _check_index(path)


async def test_a_search_when_the_index_cannot_be_brought_up_to_date(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A store that takes no writes (``check_file`` says why) still answers a search with
    what the index holds; the messages that wait go in once it can write again."""
    path = tmp_path / "parley.db"
    store, dm = await _store_with_an_osprey(path)
    try:
        assert await store.index_messages() == 2
        await _turn(store, dm.id, "t1", ["a second osprey", "ok"], index=TAGS)
        monkeypatch.setattr(store, "check_file", lambda: "the folder is read-only")
        hits = await store.search_messages("osprey", chat="local:a")
        assert [h.text for h in hits] == ["the osprey dives"]
        monkeypatch.undo()
        hits = await store.search_messages("osprey", chat="local:a")
        assert sorted(h.text for h in hits) == ["a second osprey", "the osprey dives"]
    finally:
        await store.close()


def _remove(conn: sqlite3.Connection, turns: list[str]) -> None:
    from gateway.kernel.store_retention import Pass, _remove_turns

    _remove_turns(conn, turns, Pass())


async def test_a_database_with_the_earlier_index_is_converted_once(tmp_path: Path) -> None:
    path = tmp_path / "parley.db"
    store = await Store.open(path)
    try:
        dm = await store.active_session("telegram:42")
        await _turn(store, dm.id, "t1", ["the heron nests", "by the mill"],
                    index=("telegram:42", "telegram:42"))
    finally:
        await store.close()
    # as the earlier version left it: its own index with copies, no tags on the turns
    con = sqlite3.connect(path)
    con.executescript(
        "DROP TABLE message_text; UPDATE turns SET chat = NULL, person = NULL;"
        "CREATE VIRTUAL TABLE message_search USING fts5(text, chat UNINDEXED, "
        "person UNINDEXED, role UNINDEXED, tokenize='trigram', columnsize=0);")
    ids = [r[0] for r in con.execute("SELECT id FROM messages ORDER BY id")]
    con.executemany("INSERT INTO message_search (rowid, text, chat, person, role) "
                    "VALUES (?, ?, ?, ?, ?)",
                    [(ids[0], "the heron nests", "telegram:42", "telegram:42", "user"),
                     (ids[1], "by the mill", "telegram:42", "telegram:42", "assistant")])
    con.commit()
    con.close()
    for _ in range(2):
        store = await Store.open(path)
        try:
            hits = await store.search_messages("heron", chat="telegram:42",
                                               person="telegram:42")
            assert [h.text for h in hits] == ["the heron nests"]
            assert not await store.columns("message_search")
        finally:
            await store.close()
    assert _index_terms(path)["her"] == 1
    store = await Store.open(path)
    try:  # retention removes a converted turn: told the texts the earlier index had
        await store._write(lambda db: _remove(db, ["t1"]), slow=True)
    finally:
        await store.close()
    assert _index_terms(path) == {}


def _backlog(path: Path, session_id: int, texts: list[str]) -> None:
    """Turns of another process, not indexed yet: one turn, ``texts`` as its messages."""
    with sqlite3.connect(path) as other:
        other.execute("INSERT INTO turns (id, session_id, status, started_at, chat, person) "
                      "VALUES ('far', ?, 'done', '2026-01-01', 'local:a', 'local:me')",
                      (session_id,))
        other.executemany(
            "INSERT INTO messages (session_id, turn_id, role, body, tokens, created_at) "
            "VALUES (?, 'far', ?, ?, 5, '2026-01-01')",
            [(session_id, ("user", "assistant")[i % 2],
              json.dumps({"role": ("user", "assistant")[i % 2], "content": text}))
             for i, text in enumerate(texts)])


async def test_a_backlog_past_the_loops_share_is_indexed_whole(tmp_path: Path) -> None:
    """Another process's turns (or a crash's) left more than the event loop indexes at once:
    the loop takes ``LOOP_INDEX_LIMIT``, the database thread the rest, and the mark ends at
    the newest message."""
    path = tmp_path / "parley.db"
    store = await Store.open(path)
    try:
        session = await store.active_session("local:a")
        n = LOOP_INDEX_LIMIT + 44
        _backlog(path, session.id, [f"marker{i:04d} said" for i in range(n)])
        assert await store.index_messages() == n
        newest = (await store._fetchall("SELECT max(id) FROM messages", ()))[0][0]
        assert (await store._fetchall("SELECT indexed_upto FROM search_state", ()))[0][0] \
            == newest
        for i in (0, LOOP_INDEX_LIMIT - 1, LOOP_INDEX_LIMIT, n - 1):
            hits = await store.search_messages(f"marker{i:04d}", chat="local:a")
            assert [h.text for h in hits] == [f"marker{i:04d} said"]
        _check_index(path)
    finally:
        await store.close()


async def test_the_loops_share_stops_at_its_count_or_its_text(tmp_path: Path) -> None:
    path = tmp_path / "parley.db"
    store = await Store.open(path)
    session = await store.active_session("local:a")
    await store.close()
    _backlog(path, session.id, [f"long{i:02d} " + "x" * 1000 for i in range(20)])
    with sqlite3.connect(path, isolation_level=None) as conn:
        first = conn.execute("SELECT min(id) FROM messages").fetchone()[0]

        def mark() -> int:
            return int(conn.execute("SELECT indexed_upto FROM search_state").fetchone()[0])
        assert index_some(conn, 5, None) == (5, True) and mark() == first + 4
        # past 3,000 characters with the third message (1,007 each): three go in
        assert index_some(conn, 100, 3000) == (3, True) and mark() == first + 7
        assert index_some(conn, 1, 1) == (1, True) and mark() == first + 8  # one at least
        assert index_some(conn, None, None) == (11, False) and mark() == first + 19
        assert index_some(conn, 5, 10) == (0, False)
