"""Rebuild a stored turn's model calls from the database alone.

A snapshot names the texts its request was made of by content hash (``agent/snapshots.py``):
the system prompt's layers and the runtime block come from ``layer_texts``, the summary and
the kept history from their tables, the turn's own messages (tool calls, results, steered
messages) from the messages it stored. So the same bytes come back, and the same hashes,
after SOUL.md or the config changed: for every model call of the turn, and for a subagent's
run too. Snapshots written before the texts were kept can only be rebuilt from today's
workspace; the replay says so (``Replay.note``) and never claims a match.
"""

from __future__ import annotations

from dataclasses import field
from typing import Any

from agent.budget import TokenCounter
from agent.context import LAYER_SEPARATOR, ContextBuilder, context_hash
from agent.runner import shortened_result
from agent.snapshots import call_hash
from gateway.kernel.config import Config
from gateway.kernel.events import InboundMessage
from gateway.kernel.frozen import frozen
from gateway.kernel.snapshot_frame import RUNTIME_TIME, join_time
from gateway.kernel.store import Store
from gateway.kernel.values import ChannelHints

OLD_SNAPSHOT = ("this snapshot was stored before the texts of a request were kept, so it "
                "cannot be replayed: the messages below are rebuilt from today's workspace")


@frozen
class CallReplay:
    messages: list[dict[str, Any]]
    hash: str
    matches: bool
    tools: str | None = None
    """The tool list offered (JSON), when stored."""


@frozen
class Replay:
    messages: list[dict[str, Any]]
    """The first model call's messages."""
    hash: str
    matches: bool
    calls: list[CallReplay] = field(default_factory=list)
    """Every model call of the turn, the first included."""
    note: str | None = None
    """Why this replay cannot reproduce (an old snapshot)."""


async def replay(store: Store, config: Config, session_id: int,
                 snapshot: dict[str, Any]) -> Replay:
    inputs = snapshot.get("inputs")
    texts = snapshot.get("texts")
    if not inputs and not texts:
        raise ValueError("this snapshot predates replay support (no inputs stored)")
    if not texts:
        return await _rebuild_from_workspace(store, config, session_id, snapshot)
    if "system" not in texts:  # the frame naming them is not stored
        raise ValueError("the texts this snapshot names are not stored")
    runtime = [texts["runtime"]] if texts.get("runtime") else []
    stored = await store.layer_texts([h for _, h in texts["system"]] + runtime
                                     + [c["tools"] for c in snapshot.get("calls", [])
                                        if c.get("tools")])
    missing = [h for _, h in texts["system"] if h not in stored] + [
        h for h in runtime if h not in stored]
    if missing:
        raise ValueError(f"{len(missing)} layer text(s) of this snapshot are not stored")
    system = {"role": "system",
              "content": LAYER_SEPARATOR.join(stored[h] for _, h in texts["system"])}
    turn = await store.turn_messages(session_id, snapshot["turn_id"])
    if snapshot.get("kind") == "subagent":
        base = [system, turn[0][1]] if turn else [system]
    else:
        base = await _turn_base(store, config, session_id, snapshot, system,
                                join_time(stored[texts["runtime"]],
                                          snapshot.get(RUNTIME_TIME)))
    digest = context_hash(base, like=snapshot["hash"])
    added = [body for _, body in turn[1:]]
    entries = snapshot.get("calls") or [{"added": 0, "shortened": [], "hash": snapshot["hash"]}]
    calls = [_call(base, digest, added, entry, stored) for entry in entries]
    return Replay(base, digest, digest == snapshot["hash"] and all(c.matches for c in calls),
                  calls)


def _call(base: list[dict[str, Any]], digest: str, added: list[dict[str, Any]],
          entry: dict[str, Any], stored: dict[str, str]) -> CallReplay:
    """One model call: the first request, the turn's messages so far, and the earlier
    messages the loop had shortened; hashed as it was when sent (chained to the rebuilt
    first request's hash, so a different base never matches)."""
    tools = entry.get("tools")
    tools_text = stored.get(tools) if tools else None
    if not entry["added"] and not entry.get("shortened"):
        return CallReplay(base, digest, digest == entry["hash"], tools_text)
    convo = base + added[:entry["added"]]
    shortened = {i: shortened_result(convo[i]) for i in entry.get("shortened", [])
                 if i < len(convo)}
    for i, message in shortened.items():
        convo[i] = message
    later = call_hash(digest, added[:entry["added"]], shortened)
    return CallReplay(convo, later, later == entry["hash"], tools_text)


async def _turn_base(store: Store, config: Config, session_id: int, snapshot: dict[str, Any],
                     system: dict[str, Any], runtime: str) -> list[dict[str, Any]]:
    """A turn's first request: system, summary, the kept history (old tool results capped as
    they were), the runtime block and the message."""
    inputs = snapshot["inputs"]
    builder = ContextBuilder(config, TokenCounter(snapshot.get("model") or config.agent.model),
                             window=snapshot["max_context_tokens"])
    summary: list[dict[str, Any]] = []
    if inputs.get("compaction_id") is not None:
        compaction = await store.compaction(session_id, inputs["compaction_id"])
        if compaction is None:
            raise ValueError(f"compaction {inputs['compaction_id']} is not stored")
        summary = [builder.summary_message(compaction)]
    kept: list[dict[str, Any]] = []
    if inputs.get("kept_ids"):
        first, last = inputs["kept_ids"]
        cap = inputs.get("snippet_cap") or config.agent.context.max_tool_snippet_tokens
        for m in await store.messages_between(session_id, first, last):
            body = m.body
            if m.role == "tool" and m.tokens > cap:
                body, _ = builder.shorten_tool(body, cap)
            kept.append(body)
    inbound = InboundMessage.from_dict(inputs["inbound"])
    user = {"role": "user",
            "content": builder.user_content(inbound, builder.stored_user_message(inbound))}
    return [system, *summary, *kept, {"role": "user", "content": runtime}, user]


async def _rebuild_from_workspace(store: Store, config: Config, session_id: int,
                                  snapshot: dict[str, Any]) -> Replay:
    """An old snapshot: rebuilt with today's workspace and config, said so, never a match."""
    inputs = snapshot["inputs"]
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
    return Replay(built.messages, digest, False,
                  [CallReplay(built.messages, digest, False)], note=OLD_SNAPSHOT)
