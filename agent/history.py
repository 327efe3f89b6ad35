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

SESSIONS_KEPT = 64
"""Sessions whose history stays in memory (an idle one is read again when it speaks)."""


@dataclass(slots=True)
class _Held:
    start: int
    rows: list[StoredMessage]


class HistoryCache:
    def __init__(self, store: Store, limit: int) -> None:
        self.store = store
        self.limit = limit
        self._held: OrderedDict[int, _Held] = OrderedDict()

    async def history(self, session_id: int,
                      compaction: Compaction | None) -> tuple[list[StoredMessage], bool]:
        """Messages since the last compaction, at most ``limit``; and whether there were
        more (then the session is due for compaction)."""
        start = compaction.first_kept_id if compaction else 0
        held = self._held.get(session_id)
        if held is None or held.start != start:
            rows = await self.store.recent_messages(session_id, self.limit + 1, from_id=start)
        else:
            after = held.rows[-1].id + 1 if held.rows else start
            new = await self.store.recent_messages(session_id, self.limit + 1, from_id=after)
            rows = (held.rows + new)[-(self.limit + 1):] if new else held.rows
        self._held[session_id] = _Held(start, rows)
        self._held.move_to_end(session_id)
        if len(self._held) > SESSIONS_KEPT:
            self._held.popitem(last=False)
        return (rows[1:], True) if len(rows) > self.limit else (rows, False)
