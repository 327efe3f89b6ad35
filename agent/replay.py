"""Rebuild a stored turn's context from the database and the workspace.

Each snapshot keeps the inputs of its turn (the inbound message, which stored messages were
read, the compaction used, the channel hints); building again from those gives the exact
messages the model was sent, and the same hash while the workspace and config are unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agent.budget import TokenCounter
from agent.context import ContextBuilder
from gateway.kernel.config import Config
from gateway.kernel.events import InboundMessage
from gateway.kernel.store import Store
from gateway.kernel.values import ChannelHints


@dataclass(frozen=True, slots=True)
class Replay:
    messages: list[dict[str, Any]]
    hash: str
    matches: bool


async def replay(store: Store, config: Config, session_id: int,
                 snapshot: dict[str, Any]) -> Replay:
    inputs = snapshot.get("inputs")
    if not inputs:
        raise ValueError("this snapshot predates replay support (no inputs stored)")
    ids = inputs.get("history_ids")
    history = await store.messages_between(session_id, ids[0], ids[1]) if ids else []
    compaction = None
    if inputs.get("compaction_id") is not None:
        compaction = await store.compaction(session_id, inputs["compaction_id"])
    builder = ContextBuilder(config, TokenCounter(config.agent.model),
                             window=snapshot["max_context_tokens"])
    built = builder.build(
        inbound=InboundMessage.from_dict(inputs["inbound"]), history=history,
        hints=ChannelHints(**inputs["hints"]), tools_tokens=inputs["tools_tokens"],
        session_key=snapshot["session_key"], turn_id=snapshot["turn_id"],
        compaction=compaction, recall=inputs.get("recall"), model=inputs.get("model"),
        chat_prompt=inputs.get("chat_prompt"))
    digest = built.snapshot["hash"]
    return Replay(built.messages, digest, digest == snapshot["hash"])
