"""A snapshot as stored (issue 24): what repeats turn after turn is one frame text, stored
once; reading puts it back exactly."""

from __future__ import annotations

import copy
from typing import Any

from gateway.app import Gateway
from gateway.kernel.events import InboundMessage, event_to_dict
from gateway.kernel.snapshot_frame import FRAME, expand, fold
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
    assert len({r[0].split(f'"{FRAME}":')[1] for r in rows}) == 1  # one frame for all three


def test_the_layers_keep_the_prompts_order() -> None:
    original = snapshot(3)
    original["layers"] = {"z": 1, "history": 5, "a": 2, "user": 1}
    row, texts = fold(copy.deepcopy(original), {})
    assert list(expand(row, texts)["layers"]) == ["z", "history", "a", "user"]
