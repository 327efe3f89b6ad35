"""The stored history a turn reads, kept per session between turns.

Messages are only ever appended (ids rise), so after the first turn of a session only the rows
written since are read and parsed; the cache holds the messages since the last compaction (at
most ``max_recent_messages``) of the most recently used sessions. Another process writing to
the same database (``parley chat`` beside the gateway) is seen too: the next read starts after
the last id held, whoever wrote the rows.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from gateway.kernel.store import Compaction, Store, StoredMessage

SESSIONS_KEPT = 128
"""Sessions whose history stays in memory (an idle one is read again when it speaks): more
than the chats a busy gateway answers at once, or every turn would read and parse its whole
history again (100 chats in turn evicted each other at 64; bench/)."""
TOKENS_KEPT = 2_000_000
"""And at most this many tokens of history held, all sessions together (~8 MB of text)."""


@dataclass(slots=True)
class _Held:
    start: int
    rows: list[StoredMessage]
    tokens: int


class HistoryCache:
    def __init__(self, store: Store, limit: int) -> None:
        self.store = store
        self.limit = limit
        self._held: OrderedDict[int, _Held] = OrderedDict()
        self._tokens = 0

    async def history(self, session_id: int,
                      compaction: Compaction | None) -> tuple[list[StoredMessage], bool]:
        """Messages since the last compaction, at most ``limit``; and whether there were
        more (then the session is due for compaction)."""
        start = compaction.first_kept_id if compaction else 0
        held = self._held.get(session_id)
        if held is None or held.start != start:
            rows = await self.store.recent_messages(session_id, self.limit + 1, from_id=start)
            tokens = sum(m.tokens for m in rows)
        else:
            after = held.rows[-1].id + 1 if held.rows else start
            new = await self.store.recent_messages(session_id, self.limit + 1, from_id=after)
            rows, tokens = held.rows, held.tokens
            if new:  # the held tokens go on: what came added, what left the window taken off
                rows = held.rows + new
                tokens += sum(m.tokens for m in new)
                cut = len(rows) - (self.limit + 1)
                if cut > 0:
                    tokens -= sum(m.tokens for m in rows[:cut])
                    rows = rows[cut:]
        if held is not None:
            self._tokens -= held.tokens
        self._held[session_id] = _Held(start, rows, tokens)
        self._held.move_to_end(session_id)
        self._tokens += tokens
        while len(self._held) > 1 and (len(self._held) > SESSIONS_KEPT
                                       or self._tokens > TOKENS_KEPT):
            self._tokens -= self._held.popitem(last=False)[1].tokens
        return (rows[1:], True) if len(rows) > self.limit else (rows, False)
