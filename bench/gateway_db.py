"""Read-only looks into a running gateway's database: how long the model call took as the
gateway itself measured it, so a turn's latency splits into the model call and the rest."""

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
            "per_turn_ms": [round(r[1], 3) for r in rows]}
