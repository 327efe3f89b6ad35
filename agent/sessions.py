"""Turning one turn's outcome into stored messages, each counted once."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from agent.budget import TokenCounter
from agent.runner import RunResult
from agent.usage import Ledger
from gateway.kernel.events import InboundMessage, OutboundMessage
from gateway.kernel.snapshot_frame import fold
from gateway.kernel.store import LLMCallRecord, NewMessage, Store, UsageTags
from gateway.kernel.values import TurnSend


@dataclass(slots=True)
class TurnRecord:
    session_id: int
    turn_id: str
    inbound_id: str | None
    started_at: datetime
    user_message: dict[str, Any]
    user_tokens: int
    sources: list[InboundMessage]
    """The stored inbound messages this turn answers (marked done with it)."""
    snapshot: dict[str, Any] | None = None
    texts: dict[str, str] | None = None
    """The texts the snapshot names by content hash (stored once per distinct text)."""
    usage: UsageTags | None = None
    """Whose the turn's model calls are (the usage ledger); None: untagged."""
    index: tuple[str, str | None] | None = None
    """(chat, person) its messages are found under by ``session_search``; None: not
    indexed."""


class SessionRecorder:
    def __init__(self, store: Store, counter: TokenCounter, ledger: Ledger | None = None
                 ) -> None:
        self.store = store
        self.counter = counter
        self.ledger = ledger

    async def finish(self, turn: TurnRecord, result: RunResult | None, *,
                     status: str = "done", error: str | None = None,
                     outbound: list[tuple[OutboundMessage, datetime]] | None = None,
                     sent: TurnSend | None = None) -> None:
        """One transaction: the user's message (always: nothing a user sends is lost), what
        the model did (complete tool rounds only), the inbox entries answered, the reply
        (``sent``: sent by its channel in that same transaction)."""
        messages = [NewMessage(turn.user_message, turn.user_tokens)]
        calls: list[LLMCallRecord] = []
        if result is not None:
            messages += [NewMessage(m, self.counter.count_message(m))
                         for m in result.complete_messages()]
            calls = self.ledger.calls(result.responses) if self.ledger is not None else [
                LLMCallRecord(r.model, r.prompt_tokens, r.completion_tokens, r.latency_ms,
                              r.attempts) for r in result.responses]
        snapshot, texts = fold(turn.snapshot, turn.texts) if turn.snapshot is not None \
            else (None, turn.texts)
        await self.store.save_turn(
            session_id=turn.session_id, turn_id=turn.turn_id, inbound_id=turn.inbound_id,
            messages=messages, status=status, error=error, calls=calls,
            snapshot=snapshot, texts=texts, started_at=turn.started_at,
            done=turn.sources,
            outbound=outbound, usage=turn.usage, index=turn.index, sent=sent)
        if self.ledger is not None and turn.usage is not None:
            self.ledger.recorded(turn.usage, calls)
