"""Turning one turn's outcome into stored messages, each counted once."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from agent.budget import TokenCounter
from agent.runner import RunResult
from gateway.store import LLMCallRecord, NewMessage, Store


@dataclass(slots=True)
class TurnRecord:
    session_id: int
    turn_id: str
    inbound_id: str | None
    started_at: datetime
    user_message: dict[str, Any]
    user_tokens: int
    snapshot: dict[str, Any] | None = None


class SessionRecorder:
    def __init__(self, store: Store, counter: TokenCounter) -> None:
        self.store = store
        self.counter = counter

    async def finish(self, turn: TurnRecord, result: RunResult | None, *,
                     status: str = "done", error: str | None = None) -> None:
        """Store the user's message (always: nothing a user sends is lost) and the answer."""
        messages = [NewMessage(turn.user_message, turn.user_tokens)]
        calls: list[LLMCallRecord] = []
        if result is not None:
            messages += [NewMessage(m, self.counter.count_message(m))
                         for m in result.new_messages]
            calls = [LLMCallRecord(r.model, r.prompt_tokens, r.completion_tokens, r.latency_ms,
                                   r.attempts) for r in result.responses]
        await self.store.save_turn(
            session_id=turn.session_id, turn_id=turn.turn_id, inbound_id=turn.inbound_id,
            messages=messages, status=status, error=error, calls=calls,
            snapshot=turn.snapshot, started_at=turn.started_at)
