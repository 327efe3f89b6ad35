"""Read-only looks into a running gateway's database: how long the model call took as the
gateway itself measured it, so a turn's latency splits into the model call and the rest; which
turns made a summary call inside the turn; how many bytes the turns stored."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from bench.stats import summary_ms


def llm_latencies(db_path: Path, session_key: str) -> dict[str, Any] | None:
    """Per-turn sum of the recorded model-call latencies of the active session ``key``, and
    the sums in turn order (``per_turn_ms``)."""
    try:
        con = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=5)
    except sqlite3.Error:
        return None
    try:
        rows = con.execute(
            "SELECT t.id, SUM(c.latency_ms), COUNT(*) FROM llm_calls c "
            "JOIN turns t ON t.id = c.turn_id JOIN sessions s ON s.id = t.session_id "
            "WHERE s.key = ? GROUP BY t.id ORDER BY MIN(t.started_at), MIN(t.rowid)",
            (session_key,)).fetchall()
    except sqlite3.Error:
        return None
    finally:
        con.close()
    if not rows:
        return None
    return {**summary_ms([r[1] / 1000 for r in rows]),
            "calls_per_turn": round(sum(r[2] for r in rows) / len(rows), 2),
            "per_turn_ms": [round(r[1], 3) for r in rows],
            "per_turn_calls": [int(r[2]) for r in rows]}


def stored_bytes(db_path: Path) -> int | None:
    """Bytes the database's pages hold (free pages left out), as a reader sees it: committed
    rows still in the WAL count, so growth over a series is what the turns stored."""
    try:
        con = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=5)
    except sqlite3.Error:
        return None
    try:
        pages = con.execute("PRAGMA page_count").fetchone()[0]
        free = con.execute("PRAGMA freelist_count").fetchone()[0]
        size = con.execute("PRAGMA page_size").fetchone()[0]
    except sqlite3.Error:
        return None
    finally:
        con.close()
    return int((pages - free) * size)


TRANSIENT = ("inbox", "outbox", "local_replies")
"""Tables whose rows retention removes within hours (delivered, answered) or that are
bounded by count (the local channel's reply log): not what a turn keeps for long."""


def table_bytes(db_path: Path) -> dict[str, int] | None:
    """Bytes per table, its indexes included (SQLite's ``dbstat``), as a reader sees them."""
    from gateway.kernel.store_retention import table_sizes

    try:
        con = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=5)
    except sqlite3.Error:
        return None
    try:
        return table_sizes(con) or None
    finally:
        con.close()


def split_by_compaction(samples_ms: list[float], calls: list[int] | None,
                        plain_calls: int = 1) -> dict[str, Any] | None:
    """Turn latency of the turns that made a summary call inside the turn (more model calls
    than a plain turn makes) against the others."""
    if not calls or len(calls) != len(samples_ms):
        return None
    waited = [s / 1000 for s, c in zip(samples_ms, calls, strict=True) if c > plain_calls]
    others = [s / 1000 for s, c in zip(samples_ms, calls, strict=True) if c <= plain_calls]
    return {"compacting_turns": len(waited), "other_turns": len(others),
            "compacting": summary_ms(waited) if waited else None,
            "others": summary_ms(others) if others else None}
