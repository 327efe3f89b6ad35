"""The search index under ``session_search`` (``gateway/kernel/store_search.py``)."""

from __future__ import annotations

from pathlib import Path

from gateway.kernel.store import NewMessage, Store


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
