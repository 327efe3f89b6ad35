"""Replay that reproduces (issue 21): every model call of a turn, a subagent's calls, after
the workspace changed; old snapshots say they cannot."""

from __future__ import annotations

import json
from typing import Any

from agent.replay import OLD_SNAPSHOT, replay
from gateway.app import Gateway
from tests.conftest import MakeConfig
from tests.fakes.openai_server import ScriptedLLM


async def test_every_model_call_of_a_turn_replays_after_soul_md_changed(
        make_config: MakeConfig, llm: ScriptedLLM) -> None:
    config = make_config(agent={"context": {"max_context_tokens": 6000}})
    async with Gateway(config) as gw:
        (config.workspace_path / "notes.txt").write_text("umbrella\n" + "rain " * 300)
        llm.reply("hi there")
        await gw.local.ask("c1", "hello", timeout=10)
        llm.tool_call("read_file", {"path": "notes.txt"})
        llm.tool_call("list_dir", {"path": "."})
        llm.reply("done reading")
        assert await gw.local.ask("c1", "read my notes", timeout=10) == "done reading"
        sent = llm.requests[-3:]
        assert gw.store is not None
        session = await gw.store.active_session("local:c1")
        snap = (await gw.store.snapshots(session.id))[-1]
        assert len(snap["calls"]) == 3
        soul = config.workspace_path / "SOUL.md"
        soul.write_text(soul.read_text() + "\nAlways answer in French.")
        (config.workspace_path / "notes.txt").write_text("gone")
        rebuilt = await replay(gw.store, config, session.id, snap)
        assert rebuilt.matches and rebuilt.note is None
        assert [c.messages for c in rebuilt.calls] == [r["messages"] for r in sent]
        assert all(c.matches for c in rebuilt.calls)
        assert json.loads(rebuilt.calls[0].tools or "[]") == json.loads(
            json.dumps(sent[0]["tools"], sort_keys=True))
        # the same turn as an older Parley stored it (the fingerprints' first form) replays
        # to a match too, and a changed byte in it does not
        older = _first_form(snap, sent)
        assert (await replay(gw.store, config, session.id, older)).matches
        digest = older["calls"][2]["hash"]
        older["calls"][2]["hash"] = digest[:-1] + ("1" if digest.endswith("0") else "0")
        assert not (await replay(gw.store, config, session.id, older)).matches
        # the edited SOUL.md is what the next turn sends; one more row, not one per turn
        llm.reply("bonjour")
        await gw.local.ask("c1", "hello again", timeout=10)
        assert "Always answer in French." in llm.last_request["messages"][0]["content"]
        rows = await gw.store.fetchall("SELECT COUNT(*) FROM layer_texts WHERE text LIKE ?",
                                       ("%Always answer in French.%",))
        assert rows[0][0] == 1


def _first_form(snap: dict[str, Any], sent: list[dict[str, Any]]) -> dict[str, Any]:
    """``snap`` with the fingerprints an older Parley computed: SHA-256 of ``json.dumps(...,
    sort_keys=True, ensure_ascii=False)``, bare, and each later call chained to the first."""
    import copy
    import hashlib

    def first(data: Any) -> str:
        return hashlib.sha256(json.dumps(data, sort_keys=True, ensure_ascii=False).encode()
                              ).hexdigest()

    old = copy.deepcopy(snap)
    base = sent[0]["messages"]
    old["hash"] = first(base)
    for i, call in enumerate(old["calls"]):
        added = sent[i]["messages"][len(base):]
        assert not call.get("shortened")
        call["hash"] = old["hash"] if i == 0 else first(
            {"base": old["hash"], "added": added, "shortened": []})
    return old


async def test_a_subagent_run_is_snapshotted_and_replays(make_config: MakeConfig,
                                                         llm: ScriptedLLM) -> None:
    config = make_config()
    async with Gateway(config) as gw:
        llm.tool_call("spawn", {"task": "Count the files.", "background": False})
        llm.tool_call("list_dir", {"path": "."})  # the subagent's first call
        llm.reply("There are some files.")  # the subagent's answer
        llm.reply("The helper says: some files.")
        assert await gw.local.ask("c1", "count files via a helper", timeout=10) == \
            "The helper says: some files."
        sub_requests = llm.requests[1:3]
        assert gw.store is not None
        sessions = await gw.store.list_sessions()
        sub = next(s for s in sessions if s.key.startswith("subagent:"))
        snaps = await gw.store.snapshots(sub.id)
        assert len(snaps) == 1 and snaps[0]["kind"] == "subagent"
        rebuilt = await replay(gw.store, config, sub.id, snaps[0])
        assert rebuilt.matches
        assert [c.messages for c in rebuilt.calls] == [r["messages"] for r in sub_requests]


async def test_an_old_snapshot_shows_with_a_note_that_it_cannot_replay(
        make_config: MakeConfig, llm: ScriptedLLM) -> None:
    config = make_config()
    async with Gateway(config) as gw:
        llm.reply("hi")
        await gw.local.ask("c1", "hello", timeout=10)
        assert gw.store is not None
        session = await gw.store.active_session("local:c1")
        snap: dict[str, Any] = (await gw.store.snapshots(session.id))[-1]
        old = {k: v for k, v in snap.items() if k not in ("texts", "calls")}  # as stored before
        rebuilt = await replay(gw.store, config, session.id, old)
        assert rebuilt.note == OLD_SNAPSHOT and not rebuilt.matches
        assert rebuilt.messages[-1]["content"] == "hello"
