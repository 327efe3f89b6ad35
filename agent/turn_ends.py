"""How a session's turns end: the turn's one write, remembered for the next turn's runtime
block (the last turn's status, the messages queued behind this one)."""

from __future__ import annotations

from datetime import datetime

from agent.context import TurnState
from agent.lanes import Lane
from agent.runner import RunResult
from agent.sessions import SessionRecorder, TurnRecord
from gateway.kernel.events import OutboundMessage
from gateway.kernel.store import Store
from gateway.kernel.values import TurnSend

LAST_KEPT = 4096
"""Sessions whose last status is kept in memory (the oldest is forgotten first, and read
from the database again when it comes back)."""


class TurnEnds:
    def __init__(self, recorder: SessionRecorder, store: Store) -> None:
        self.recorder = recorder
        self.store = store
        self._last: dict[int, tuple[str, str | None]] = {}
        """Session → how its last turn ended (status, error)."""

    async def finish(self, record: TurnRecord, result: RunResult | None, *, status: str,
                     error: str | None = None,
                     outbound: list[tuple[OutboundMessage, datetime]] | None = None,
                     sent: TurnSend | None = None) -> None:
        """The turn's one write; its end is what the next turn's runtime block says."""
        await self.recorder.finish(record, result, status=status, error=error,
                                   outbound=outbound, sent=sent)
        if len(self._last) >= LAST_KEPT:
            self._last.pop(next(iter(self._last)))
        self._last[record.session_id] = (status, error)

    async def state(self, session_id: int, lane: Lane | None) -> TurnState:
        """The messages queued behind this turn and how the session's last turn ended
        (from memory; from the database once per session after a start)."""
        last = self._last.get(session_id)
        if last is None:
            last = await self.store.last_turn(session_id) or ("none", None)
            self._last[session_id] = last
        pending = sum(len(w.sources) for w in lane.waiting) if lane is not None else 0
        status, error = last
        return TurnState(pending=pending, last_status=None if status == "none" else status,
                         last_error=error)
