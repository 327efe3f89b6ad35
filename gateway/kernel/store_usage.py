"""The usage ledger's reads (``llm_calls``: tokens and cost of every model call, whose, which
chat, which day), the limit notices already sent, and each conversation's chosen model.

A turn writes its ledger rows in its own transaction (``store_sessions.save_turn``); these
reads serve ``/usage``, ``parley usage`` and, once per scope after a start, the limits.
"""

from __future__ import annotations

from typing import Literal

from gateway.kernel.frozen import frozen
from gateway.kernel.store_db import Database, iso

UsageBy = Literal["person", "chat", "model", "day", "session", "turn", "kind"]
_GROUP = {"person": "person", "chat": "chat", "model": "model", "day": "day",
          "session": "CAST(session_id AS TEXT)", "turn": "turn_id", "kind": "kind"}
Scope = Literal["person", "chat"]


@frozen
class UsageRow:
    key: str
    calls: int
    prompt_tokens: int
    completion_tokens: int
    cost: float

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


_SUMS = ("COUNT(*), COALESCE(SUM(prompt_tokens), 0), COALESCE(SUM(completion_tokens), 0), "
         "COALESCE(SUM(cost), 0)")


def _where(person: str | None, chat: str | None, since_day: str | None,
           day: str | None, session_id: int | None = None
           ) -> tuple[str, tuple[str | int, ...]]:
    parts: list[str] = []
    params: list[str | int] = []
    for column, value, op in (("person", person, "="), ("chat", chat, "="),
                              ("day", since_day, ">="), ("day", day, "="),
                              ("session_id", session_id, "=")):
        if value is not None:
            parts.append(f"{column} {op} ?")
            params.append(value)
    return (" WHERE " + " AND ".join(parts) if parts else ""), tuple(params)


class UsageTables(Database):
    async def usage_total(self, *, person: str | None = None, chat: str | None = None,
                          since_day: str | None = None, day: str | None = None,
                          session_id: int | None = None) -> UsageRow:
        where, params = _where(person, chat, since_day, day, session_id)
        row = await self._fetchone_thread(f"SELECT {_SUMS} FROM llm_calls{where}", params)
        return UsageRow("total", int(row[0]), int(row[1]), int(row[2]), float(row[3]))

    async def usage_by(self, by: UsageBy, *, person: str | None = None,
                       chat: str | None = None, since_day: str | None = None) -> list[UsageRow]:
        """Totals grouped by ``by``, the largest cost (then tokens) first; a day by date."""
        where, params = _where(person, chat, since_day, None)
        order = "MIN(id)" if by == "turn" else "key" if by == "day" else \
            "SUM(cost) DESC, SUM(prompt_tokens + completion_tokens) DESC, key"
        rows = await self._fetchall_thread(
            f"SELECT COALESCE({_GROUP[by]}, '(unknown)') AS key, {_SUMS} FROM llm_calls{where} "
            f"GROUP BY key ORDER BY {order}", params)
        return [UsageRow(str(r[0]), int(r[1]), int(r[2]), int(r[3]), float(r[4]))
                for r in rows]

    async def usage_tally(self, scope: Scope | None, value: str | None, *, day: str,
                          minute_from: str) -> tuple[int, int, float]:
        """What a limit counts for one scope (a person, a chat, or everyone: None): turns
        recorded since ``minute_from`` (ISO), and tokens and cost on ``day``."""
        where = f" AND {scope} = ?" if scope else ""
        params: tuple[str, ...] = (value,) if scope and value is not None else ()
        turns = await self._fetchone(
            f"SELECT COUNT(DISTINCT turn_id) FROM llm_calls WHERE created_at >= ?{where}",
            (minute_from, *params))
        spent = await self._fetchone(
            "SELECT COALESCE(SUM(prompt_tokens + completion_tokens), 0), "
            f"COALESCE(SUM(cost), 0) FROM llm_calls WHERE day = ?{where}", (day, *params))
        return int(turns[0]), int(spent[0]), float(spent[1])

    # limit notices ------------------------------------------------------------------------

    async def add_notice(self, scope: str, period: str) -> bool:
        """Record a limit notice; False when it was already recorded (then it was sent)."""
        async with self.transaction() as db:
            cursor = await db.execute(
                "INSERT OR IGNORE INTO limit_notices (scope, period, created_at) "
                "VALUES (?, ?, ?)", (scope, period, iso()))
            return cursor.rowcount == 1

    # a conversation's model ---------------------------------------------------------------

    async def conversation_models(self) -> dict[str, str]:
        """Every conversation's chosen alias (few rows: read once at start)."""
        rows = await self._fetchall("SELECT session_key, alias FROM conversation_models", ())
        return {r[0]: r[1] for r in rows}

    async def set_conversation_model(self, session_key: str, alias: str | None) -> None:
        """``alias`` for the conversation ``session_key``; None: back to its default."""
        async with self.transaction() as db:
            if alias is None:
                await db.execute("DELETE FROM conversation_models WHERE session_key = ?",
                                 (session_key,))
            else:
                await db.execute(
                    "INSERT INTO conversation_models (session_key, alias, updated_at) "
                    "VALUES (?, ?, ?) ON CONFLICT(session_key) DO UPDATE SET "
                    "alias = excluded.alias, updated_at = excluded.updated_at",
                    (session_key, alias, iso()))
