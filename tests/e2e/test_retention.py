"""Bounded storage (issue 24): retention removes what a turn no longer needs, in the
background and by ``parley db vacuum``; every turn kept still replays, and the chat goes on.

Ages are read against the sweep's ``now``: the test sweeps as if days had passed (no waiting).
Every test runs on both stores (SQLite, and PostgreSQL on the session's throwaway cluster).
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest
import yaml

from agent.replay import replay
from gateway.app import Gateway
from gateway.kernel.events import utcnow
from gateway.kernel.store_db import iso
from tests.conftest import MakeConfig
from tests.e2e.test_cli import parley, write_config
from tests.e2e.test_context_engine import chat_model, is_flush_call, is_summary_call, talk
from tests.e2e.test_durability import database, make_config  # noqa: F401  (both stores)
from tests.e2e.waiting import until
from tests.fakes.openai_server import ScriptedLLM


async def count(gw: Gateway, sql: str, *params: object) -> int:
    assert gw.store is not None
    row = await gw.store.fetchone(sql, tuple(params))
    return int(row[0])


async def run(gw: Gateway, sql: str, *params: object) -> None:
    assert gw.store is not None
    async with gw.store.transaction() as db:
        await db.execute(sql, tuple(params))


async def test_retention_removes_old_rows_and_keeps_what_turns_need(
        make_config: MakeConfig, llm: ScriptedLLM) -> None:  # noqa: F811
    chat_model(llm)
    config = make_config(agent={"context": {"max_recent_messages": 6}}, retention={
        "turns_max_age": "1d", "snapshots_max_age": "1d", "outbox_delivered_max_age": "1h",
        "inbox_done_max_age": "1h", "batch": 3})
    async with Gateway(config) as gw:
        assert gw.agent is not None and gw.retention is not None and gw.store is not None
        await talk(gw, [f"number {i}" for i in range(1, 16)])
        await until(lambda: gw.agent is not None and gw.agent.background.idle, "summaries")
        session = await gw.store.active_session("local:c1")
        entry = await gw.store.compaction(session.id)
        assert entry is not None
        # nothing is old yet: a sweep now removes nothing
        assert await gw.retention.sweep_once() == {}
        assert await count(gw, "SELECT COUNT(*) FROM messages") == 30
        # a cap of one byte per session removes nothing a kept snapshot reads: every turn
        # still replays as it was sent
        gw.retention.policy.turns_max_per_session = 1
        assert await gw.retention.sweep_once() == {}
        snaps = await gw.store.snapshots(session.id)
        assert len(snaps) == 15
        for snap in snaps[-3:]:
            assert (await replay(gw.store, config, session.id, snap)).matches
        gw.retention.policy.turns_max_per_session = 0
        gw.retention.now = lambda: utcnow() + timedelta(days=2)
        removed = await gw.retention.sweep_once()  # batches of 3 until nothing is due
        assert removed["outbox"] == 15 and removed["inbox"] == 15
        assert removed["context_snapshots"] == 15
        # the snapshots gone, the summarised turns go whole; what the last summary left
        # (what the next turn reads) stays
        assert removed["turns"] * 2 == removed["messages"]
        assert await count(gw, "SELECT COUNT(*) FROM messages WHERE id < ?",
                           entry.first_kept_id) == 0
        assert await count(gw, "SELECT COUNT(*) FROM messages") == 30 - removed["messages"] > 0
        assert await count(gw, "SELECT COUNT(*) FROM outbox WHERE status = 'delivered'") == 0
        assert await count(gw, "SELECT COUNT(*) FROM llm_calls") >= 15  # the ledger stays
        # and the chat goes on, on its summary and the turns kept
        await talk(gw, ["number 16"])
        sent = [r for r in llm.requests
                if not is_summary_call(r) and not is_flush_call(r)][-1]["messages"]
        assert sent[-1]["content"] == "number 16"
        assert "SUMMARY" in json.dumps(sent[1])
        # no snapshot left named the texts, so they went too; the next turn wrote again those
        # this process remembered as written, and replays
        assert removed["layer_texts"] >= 3
        [last] = await gw.store.snapshots(session.id)
        assert (await replay(gw.store, config, session.id, last)).matches


async def test_parley_db_stats_and_vacuum(tmp_path: Path, llm: ScriptedLLM,
                                          database: str | None) -> None:  # noqa: F811
    path = write_config(tmp_path, llm)
    if database is not None:
        path.write_text(yaml.safe_dump({**yaml.safe_load(path.read_text()),
                                        "database": database}))
    llm.echo()
    from gateway.kernel.config import load_config

    config = load_config(path)
    async with Gateway(config) as gw:
        for i in range(5):
            assert await gw.local.ask("c1", f"hello {i}", timeout=10) == f"echo: hello {i}"
    code, out, err = await parley("db", "stats", "--config", str(path))
    assert code == 0, err
    assert "messages" in out and "bytes over 5 turns; mostly the pages every table" in out
    assert ("postgresql://" in out) == (database is not None)
    code, out, err = await parley("db", "stats", "--json", "--config", str(path))
    found = json.loads(out)
    assert found["rows"]["turns"] == 5 and found["rows"]["messages"] == 10
    assert found["delivered_outbox"] == 5
    code, out, err = await parley("db", "vacuum", "--config", str(path))
    assert code == 0, err
    assert "retention removed nothing" in out  # nothing is a day old
    assert "KB →" in out
    code, out, err = await parley("db", "stats", "--config", str(tmp_path / "missing.yaml"))
    assert code != 0


async def test_layer_texts_no_kept_snapshot_names_go_and_the_rest_replays(
        make_config: MakeConfig, llm: ScriptedLLM,  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Snapshots name the system layers, frames and runtime templates by hash; once the
    snapshots naming a text are gone and the text was not written for a day, retention removes
    it. A text a kept snapshot names stays, and so does one written within the day."""
    llm.echo()
    config = make_config(retention={"snapshots_max_age": "1d", "batch": 2})
    long_ago = "2000-01-01T00:00:00+00:00"
    async with Gateway(config) as gw:
        assert gw.retention is not None and gw.store is not None
        soul = config.workspace_path / "SOUL.md"
        soul.write_text(soul.read_text() + "\nSpeak like a sailor.")
        for i in range(3):
            await gw.local.ask("c1", f"old {i}", timeout=10)
        soul.write_text(soul.read_text().replace("like a sailor", "like a poet"))
        for i in range(2):
            await gw.local.ask("c1", f"new {i}", timeout=10)
        sailor = "SELECT COUNT(*) FROM layer_texts WHERE text LIKE '%like a sailor%'"
        poet = "SELECT COUNT(*) FROM layer_texts WHERE text LIKE '%like a poet%'"
        assert await count(gw, sailor) == 1 and await count(gw, poet) == 1
        session = await gw.store.active_session("local:c1")
        # the first three turns' snapshots are old; every text was last written long ago,
        # but for one stray text written just now
        await run(gw, "UPDATE context_snapshots SET created_at = ? WHERE turn_id IN "
              "(SELECT turn_id FROM context_snapshots ORDER BY created_at "
              "LIMIT 3)", long_ago)
        await run(gw, "UPDATE layer_texts SET touched_at = ?", long_ago)
        await run(gw, "INSERT INTO layer_texts (hash, text, touched_at) VALUES "
              "(?, ?, ?)", "f" * 64, "written a moment ago", iso())
        before = await count(gw, "SELECT COUNT(*) FROM layer_texts")
        removed = await gw.retention.sweep_once()
        assert removed["context_snapshots"] == 3
        assert 0 < removed["layer_texts"] < before - 1
        assert await count(gw, sailor) == 0 and await count(gw, poet) == 1
        assert await count(gw, "SELECT COUNT(*) FROM layer_texts WHERE hash = ?", "f" * 64) == 1
        kept = await gw.store.snapshots(session.id)
        assert len(kept) == 2
        for snap in kept:  # every text they name is still there
            assert (await replay(gw.store, config, session.id, snap)).matches
        # a second sweep finds nothing more to remove
        assert "layer_texts" not in await gw.retention.sweep_once()

        # a turn names the texts it remembers as written without writing them again, for
        # an hour; then it writes them again, which renews their time
        await run(gw, "UPDATE layer_texts SET touched_at = ?", long_ago)
        await gw.local.ask("c1", "within the hour", timeout=10)
        fresh = "SELECT COUNT(*) FROM layer_texts WHERE touched_at > ?"
        assert await count(gw, poet + " AND touched_at > ?", long_ago) == 0
        import gateway.kernel.store_snapshots as texts

        later = texts.monotonic() + texts.TOUCH_EVERY + 1
        monkeypatch.setattr(texts, "monotonic", lambda: later)
        await gw.local.ask("c1", "an hour later", timeout=10)
        assert await count(gw, poet + " AND touched_at > ?", long_ago) == 1
        assert await count(gw, fresh, long_ago) >= 3  # the frame and the tool list too
