"""Context snapshots and usage: what each turn sent the model and what it cost, for
``parley context`` and ``parley sessions``.

Separate from the sessions (``store_sessions``, whose ``save_turn`` writes the snapshot rows)
because only inspection reads them, never a turn.
"""

from __future__ import annotations

import json
from typing import Any

from gateway.kernel.store_db import Database
from gateway.kernel.store_sql import twin

_LATEST = twin("SELECT detail FROM context_snapshots WHERE session_id = ? "
               "ORDER BY created_at DESC, rowid DESC LIMIT 1",
               "SELECT detail FROM context_snapshots WHERE session_id = %s "
               "ORDER BY created_at DESC, seq DESC LIMIT 1")
_ALL = twin("SELECT detail FROM context_snapshots WHERE session_id = ? "
            "ORDER BY created_at, rowid",
            "SELECT detail FROM context_snapshots WHERE session_id = %s "
            "ORDER BY created_at, seq")


class SnapshotTables(Database):
    """Reads over context snapshots, LLM calls and table counts."""

    async def latest_snapshot(self, session_id: int) -> dict[str, Any] | None:
        row = await self._fetchone(_LATEST, (session_id,))
        return json.loads(row[0]) if row else None

    async def snapshots(self, session_id: int) -> list[dict[str, Any]]:
        """Every turn's snapshot of a session, oldest first (turn N is index N - 1)."""
        rows = await self._fetchall(_ALL, (session_id,))
        return [json.loads(r[0]) for r in rows]

    async def usage(self, session_id: int) -> tuple[int, int, int]:
        """(calls, prompt tokens, completion tokens) over a session's turns."""
        row = await self._fetchone(
            "SELECT COUNT(*), COALESCE(SUM(c.prompt_tokens), 0), "
            "COALESCE(SUM(c.completion_tokens), 0) FROM llm_calls c "
            "JOIN turns t ON t.id = c.turn_id WHERE t.session_id = ?", (session_id,))
        assert row is not None
        return int(row[0]), int(row[1]), int(row[2])

    async def counts(self) -> dict[str, int]:
        out = {}
        for table in ("sessions", "messages", "turns"):
            row = await self._fetchone(f"SELECT COUNT(*) FROM {table}", ())
            out[table] = int(row[0]) if row else 0
        return out
