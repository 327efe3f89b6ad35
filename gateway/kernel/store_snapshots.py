"""Context snapshots and usage: what each turn sent the model and what it cost, for
``parley context`` and ``parley sessions``.

Separate from the sessions (``store_sessions``, whose ``save_turn`` writes the snapshot rows)
because only inspection reads them, never a turn.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from time import monotonic
from typing import Any

from gateway.kernel.secrets import SECRETS
from gateway.kernel.snapshot_frame import (
    TIME_MARK,
    expand,
    frames_of,
    join_time,
    unpack,
    with_columns,
)
from gateway.kernel.store_db import Database
from gateway.kernel.store_sql import twin

SNAPSHOT_COLUMNS = "detail, turn_id, context_hash, total_tokens"
_LATEST = twin(f"SELECT {SNAPSHOT_COLUMNS} FROM context_snapshots WHERE session_id = ? "
               "ORDER BY created_at DESC, rowid DESC LIMIT 1",
               f"SELECT {SNAPSHOT_COLUMNS} FROM context_snapshots WHERE session_id = %s "
               "ORDER BY created_at DESC, seq DESC LIMIT 1")
_ALL = twin(f"SELECT {SNAPSHOT_COLUMNS} FROM context_snapshots WHERE session_id = ? "
            "ORDER BY created_at, rowid",
            f"SELECT {SNAPSHOT_COLUMNS} FROM context_snapshots WHERE session_id = %s "
            "ORDER BY created_at, seq")

UPSERT_TEXT = ("INSERT INTO layer_texts (hash, text, touched_at) VALUES (?, ?, ?) "
               "ON CONFLICT (hash) DO UPDATE SET touched_at = excluded.touched_at")
KNOWN_TEXTS = 10_000
"""Hashes remembered as written (a turn's system layers are skipped without a statement)."""
TOUCH_EVERY = 3600.0
"""Seconds a text is remembered as written; after that the next snapshot naming it writes it
again, which renews its ``touched_at``. Retention removes only texts no kept snapshot names
and none touched for ``store_retention.TEXTS_GRACE`` (a day, far longer): a text a turn names
without writing it (remembered) was touched less than this long ago, so it is never among
them, in this process or any other."""


_POINTER = TIME_MARK
"""A stored text that starts with it is a runtime block's time and its template's hash: how
rows written between the runtime templates' first form and their move into the snapshot row
(``snapshot_frame.split_time``) held it; still read."""


class LayerTexts(Database):
    """The texts snapshots name by content hash: one row per distinct text (a system prompt
    layer, a runtime block, a tool list), whatever number of snapshots name it."""

    def __init__(self, db: Any, path: Path, now: Any = None) -> None:
        super().__init__(db, path, now)
        self._texts_known: dict[str, float] = {}

    def _new_texts(self, texts: dict[str, str] | None,
                   touched: str) -> tuple[list[tuple[str, str, str]], float]:
        """Rows (``UPSERT_TEXT``'s) for the texts not written, or not touched, within
        ``TOUCH_EVERY`` (secrets redacted, as in every snapshot), and when it was: what
        ``_wrote_texts`` remembers once they are stored."""
        at = monotonic()
        if not texts:
            return [], at
        known = self._texts_known
        if len(known) > KNOWN_TEXTS:
            known.clear()
        stale = at - TOUCH_EVERY
        return [(h, SECRETS.redact(t), touched) for h, t in texts.items()
                if known.get(h, stale) <= stale], at

    def _wrote_texts(self, rows: list[tuple[str, str, str]], at: float) -> None:
        for row in rows:
            self._texts_known[row[0]] = at

    def forget_texts(self, hashes: Iterable[str]) -> None:
        """Texts removed (``store_retention.sweep_texts``): written again when named."""
        for digest in hashes:
            self._texts_known.pop(digest, None)

    async def layer_texts(self, hashes: list[str]) -> dict[str, str]:
        """The stored texts of ``hashes`` (those found; a runtime block kept as a pointer to
        its template put back together)."""
        out = await self._texts(hashes)
        pointed = {h: t[1:].split(_POINTER, 1) for h, t in out.items() if t[:1] == _POINTER}
        if pointed:
            templates = await self._texts([shared for shared, _ in pointed.values()])
            for digest, (shared, when) in pointed.items():
                if shared in templates:
                    out[digest] = join_time(templates[shared], when)
                else:
                    del out[digest]
        return out

    async def _texts(self, hashes: list[str]) -> dict[str, str]:
        out: dict[str, str] = {}
        unique = list(dict.fromkeys(hashes))
        for start in range(0, len(unique), 500):
            part = unique[start:start + 500]
            rows = await self._fetchall(
                f"SELECT hash, text FROM layer_texts WHERE hash IN "
                f"({', '.join('?' * len(part))})", tuple(part))
            out.update((r[0], r[1]) for r in rows)
        return out

    async def turn_messages(self, session_id: int,
                            turn_id: str) -> list[tuple[int, dict[str, Any]]]:
        """(id, body) of the messages a turn stored, in order (its user message first)."""
        rows = await self._fetchall(
            "SELECT id, body FROM messages WHERE session_id = ? AND turn_id = ? ORDER BY id",
            (session_id, turn_id))
        return [(r[0], json.loads(r[1])) for r in rows]


class SnapshotTables(LayerTexts):
    """Reads over context snapshots, LLM calls and table counts."""

    async def _expanded(self, stored: list[Any]) -> list[dict[str, Any]]:
        """Stored snapshots (``SNAPSHOT_COLUMNS`` rows) with their columns and frames put
        back (``snapshot_frame``)."""
        rows = [with_columns(json.loads(unpack(r[0])), r[1], r[2], r[3]) for r in stored]
        frames = await self.layer_texts(frames_of(rows))
        return [expand(r, frames) for r in rows]

    async def latest_snapshot(self, session_id: int) -> dict[str, Any] | None:
        row = await self._fetchone(_LATEST, (session_id,))
        return (await self._expanded([row]))[0] if row else None

    async def snapshots(self, session_id: int) -> list[dict[str, Any]]:
        """Every turn's snapshot of a session, oldest first (turn N is index N - 1)."""
        rows = await self._fetchall_thread(_ALL, (session_id,))
        return await self._expanded(list(rows))

    async def usage(self, session_id: int) -> tuple[int, int, int]:
        """(calls, prompt tokens, completion tokens) over a session's turns."""
        row = await self._fetchone_thread(
            "SELECT COUNT(*), COALESCE(SUM(c.prompt_tokens), 0), "
            "COALESCE(SUM(c.completion_tokens), 0) FROM llm_calls c "
            "JOIN turns t ON t.id = c.turn_id WHERE t.session_id = ?", (session_id,))
        assert row is not None
        return int(row[0]), int(row[1]), int(row[2])

    async def counts(self) -> dict[str, int]:
        out = {}
        for table in ("sessions", "messages", "turns"):
            row = await self._fetchone_thread(f"SELECT COUNT(*) FROM {table}", ())
            out[table] = int(row[0]) if row else 0
        return out
