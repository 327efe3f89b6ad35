"""A snapshot as stored (issue 24): what repeats turn after turn is one frame text, stored
once; reading puts it back exactly."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from gateway.app import Gateway
from gateway.kernel.events import InboundMessage, event_to_dict
from gateway.kernel.snapshot_frame import (
    FRAME,
    RUNTIME_TIME,
    TIME_MARK,
    expand,
    fold,
    join_time,
    pack,
    unpack,
)
from tests.conftest import MakeConfig
from tests.fakes.openai_server import ScriptedLLM


def snapshot(turn: int) -> dict[str, Any]:
    return {"turn_id": f"t{turn}", "hash": f"h{turn}", "session_key": "local:c1",
            "trust": "owner", "model": "openai/m", "owner_files": True,
            "memory_scopes": ["owner"], "max_context_tokens": 32000, "total_tokens": 100 + turn,
            "layers": {"identity": 70, "SOUL.md": 46, "tools": 834, "summary": 0,
                       "history": 10 * turn, "runtime": 106, "user": 11},
            "texts": {"system": [["identity", "a" * 64], ["SOUL.md", "b" * 64]],
                      "runtime": "c" * 64},
            "inputs": {"inbound": event_to_dict(InboundMessage(
                           channel="local", chat_id="c1", sender_id="u1", text=f"n{turn}",
                           trust="owner")),
                       "history_ids": [1, turn], "snippet_cap": 2000,
                       "hints": {"markup": "Markdown"}, "tools_tokens": 834, "model": "m",
                       "chat_prompt": None, "recall": None},
            "calls": [{"added": 0, "hash": f"h{turn}"}]}


def test_fold_and_expand_give_back_the_snapshot_and_share_one_frame() -> None:
    rows: list[dict[str, Any]] = []
    texts: dict[str, str] = {}
    for turn in (1, 2):
        original = snapshot(turn)
        row, texts = fold(copy.deepcopy(original), texts)
        rows.append(row)
        assert "session_key" not in row and "system" not in row["texts"]
        assert "thread_id" not in row["inputs"]["inbound"]  # its default: left out
        assert expand(copy.deepcopy(row), texts) == original
    assert rows[0][FRAME] == rows[1][FRAME] and len(texts) == 1


async def test_snapshots_read_back_whole_and_the_frame_is_stored_once(
        make_config: MakeConfig, llm: ScriptedLLM) -> None:
    llm.echo()
    async with Gateway(make_config()) as gw:
        for i in range(3):
            await gw.local.ask("c1", f"hello {i}", timeout=10)
        assert gw.store is not None
        session = await gw.store.active_session("local:c1")
        snaps = await gw.store.snapshots(session.id)
        rows = await gw.store.fetchall("SELECT detail FROM context_snapshots")
    assert len(snaps) == 3 and all(s["session_key"] == "local:c1" for s in snaps)
    assert all(s["texts"]["system"] and s["inputs"]["inbound"]["thread_id"] is None
               for s in snaps)
    details = [unpack(r[0]) for r in rows]  # packed (SQLite): ~40 % of the JSON's size
    assert all(isinstance(r[0], bytes) and len(r[0]) < len(d) / 2
               for r, d in zip(rows, details, strict=True))
    assert len({d.split(f'"{FRAME}":')[1] for d in details}) == 1  # one frame for all three


def test_the_layers_keep_the_prompts_order() -> None:
    original = snapshot(3)
    original["layers"] = {"z": 1, "history": 5, "a": 2, "user": 1}
    row, texts = fold(copy.deepcopy(original), {})
    assert list(expand(row, texts)["layers"]) == ["z", "history", "a", "user"]


def test_a_row_keeps_no_copy_of_its_columns_and_reads_back_whole() -> None:
    from gateway.kernel.snapshot_frame import with_columns, without_columns

    original = {**snapshot(3), "calls": [{"added": 0, "hash": "h3"},
                                         {"added": 2, "hash": "later"}]}
    row = without_columns(copy.deepcopy(original), "t3")
    assert "hash" not in row and "turn_id" not in row and "total_tokens" not in row
    assert row["calls"] == [{"added": 0}, {"added": 2, "hash": "later"}]
    assert with_columns(row, "t3", "h3", 103) == original
    # a snapshot of another turn than its row keeps its own id; a row stored whole (before
    # this) is read as it is
    other = without_columns(copy.deepcopy(original), "t9")
    assert with_columns(other, "t9", "h3", 103) == original
    assert with_columns(copy.deepcopy(original), "t3", "h3", 103) == original


def test_what_most_turns_have_is_left_out_of_the_row() -> None:
    """The usual values (no trims, no compaction, a call with nothing added or shortened, the
    frame's tool list) are not stored per turn; the others are, and all read back whole."""
    usual = {**snapshot(4), "trimmed": [], "bootstrap_cuts": [],
             "sources": {"history_available": 6, "compaction": None, "images": 0,
                         "memory_recalled": 0},
             "calls": [{"added": 0, "shortened": [], "tools": "T", "hash": "h4"},
                       {"added": 2, "shortened": [1], "tools": "U", "hash": "x"}]}
    kept = copy.deepcopy(usual)
    row, texts = fold(usual, {})
    assert usual == kept  # folding leaves the snapshot itself alone
    assert "trimmed" not in row and row["sources"] == {"history_available": 6}
    assert row["calls"] == [{"hash": "h4"}, {"added": 2, "shortened": [1], "tools": "U",
                                             "hash": "x"}]
    assert expand(copy.deepcopy(row), texts) == kept
    unusual = {**copy.deepcopy(kept), "trimmed": ["dropped 2 turns"],
               "sources": {**kept["sources"], "compaction": 7}}
    row, texts = fold(copy.deepcopy(unusual), texts)
    assert row["trimmed"] == ["dropped 2 turns"] and row["sources"]["compaction"] == 7
    assert expand(row, texts) == unusual


def test_a_packed_row_reads_back_as_its_text_and_text_rows_as_they_are() -> None:
    detail = ('{"layers":{"summary":0,"history":5174,"runtime":106,"user":12},"inputs":'
              '{"inbound":{"text":"héllo","message_id":"f6ba"},"history_ids":[1,398]},'
              '"calls":[{}],"frame":"eafde071"}')
    packed = pack(detail)
    assert packed[0] == 3 and len(packed) < len(detail) / 2
    assert unpack(packed) == detail and unpack(detail) == detail  # older rows: text
    import zlib

    from gateway.kernel import snapshot_frame

    for version in (1, 2):  # rows packed with an earlier dictionary
        earlier = zlib.compressobj(6, zlib.DEFLATED, -11, 4, zlib.Z_DEFAULT_STRATEGY,
                                   snapshot_frame._DICTIONARIES[version])
        row = bytes((version,)) + earlier.compress(detail.encode()) + earlier.flush()
        assert unpack(row) == detail


def _runtime(when: str) -> str:
    return ("[Runtime Context — metadata only, not instructions]\n"
            f"Time: {when} UTC (UTC+0000), Wednesday\nChannel: local\nChat ID: c1\n"
            "Sender: bench\nSender trust: owner\nModel: openai/test\nLast turn: done\n")


def test_runtime_blocks_differing_in_their_time_share_one_template() -> None:
    """The runtime block names the time to the second: every turn's is new. Its template is
    stored once (by its hash); each turn's row keeps only its time, and joins back exactly."""
    rows, stored = [], {}
    for second in (1, 2):
        text = _runtime(f"2026-11-25 15:22:0{second}")
        snapshot = {"texts": {"system": [["SOUL.md", "s1"]], "runtime": f"h{second}"},
                    "layers": {}}
        row, texts = fold(snapshot, {f"h{second}": text, "s1": "be kind"})
        rows.append(row)
        stored.update(texts)
        assert f"h{second}" not in texts  # the whole text is not stored
        assert join_time(texts[row["texts"]["runtime"]], row[RUNTIME_TIME]) == text
    assert rows[0]["texts"]["runtime"] == rows[1]["texts"]["runtime"]  # one template
    assert [r[RUNTIME_TIME] for r in rows] == ["15:22:01", "15:22:02"]  # the date: template
    assert join_time("no time here", None) == "no time here"


async def test_runtime_pointers_of_the_first_form_still_read_back(tmp_path: Path) -> None:
    """Rows written while a runtime block's time was kept in ``layer_texts`` as a pointer to
    its template read back as the whole text."""
    from gateway.kernel.store import Store

    text = _runtime("2026-11-25 15:22:01")  # the first form kept the Time line's whole value
    at = text.index("2026-11-25 15:22:01")
    end = text.index("\n", at)
    template, when = text[:at] + TIME_MARK + text[end:], text[at:end]
    store = await Store.open(tmp_path / "parley.db")
    try:
        await store.write(lambda db: db.executemany(
            "INSERT INTO layer_texts (hash, text) VALUES (?, ?)",
            [("t", template), ("h1", f"{TIME_MARK}t{TIME_MARK}{when}"),
             ("h2", f"{TIME_MARK}gone{TIME_MARK}{when}")]))
        assert await store.layer_texts(["h1", "h2"]) == {
            "h1": _runtime("2026-11-25 15:22:01")}  # h2's template is missing: not found
    finally:
        await store.close()
