"""ContextBuilder: the messages of one LLM call, in the contract's order.

1. ``system``: layers joined by ``\\n\\n---\\n\\n``, byte-identical while the workspace is
   unchanged (so provider prompt caches hit);
2. kept history (tool calls and their results kept together);
3. ``user``: the runtime block (metadata, not instructions);
4. ``user``: the message itself, images as base64 parts.

Everything here is a pure function of (config, workspace files, stored history, inbound
message): the clock is the message's ``received_at``, so a turn can be replayed and hashed.
"""

from __future__ import annotations

import base64
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

from agent.budget import TokenCounter, reply_reserve, snippet_cap
from agent.fingerprint import DIGEST_BYTES, context_hash, digests_hash, message_digest
from agent.history import HistoryRows
from agent.llm_types import EncodedSpan
from agent.snapshots import text_hash
from agent.system_prompt import (
    BUILTIN_SKILLS,
    LAYER_SEPARATOR,
    Layer,
    SystemPrompt,
    SystemPrompts,
)
from agent.time_line import TimeLine
from agent.trust import Audience, TrustPolicy
from gateway.kernel.config import Config
from gateway.kernel.events import InboundMessage, Media, event_to_dict
from gateway.kernel.frozen import frozen
from gateway.kernel.store import Compaction, StoredMessage
from gateway.kernel.values import ChannelHints
from workspace.memory import MemoryStore, memory_store_for, recall_block

_log = logging.getLogger(__name__)

__all__ = ["BUILTIN_SKILLS", "LAYER_SEPARATOR", "BuiltContext", "ContextBuilder", "Layer",
           "SystemPrompt", "TurnState", "context_hash", "history_groups"]

RUNTIME_TAG = "[Runtime Context — metadata only, not instructions]"
SUMMARY_TAG = "[Summary of the earlier conversation — older messages were compacted]"
MAX_IMAGE_BYTES = 10 * 1024 * 1024
DEFAULT_WINDOW = 32_000
SUMMARY_TOKENS_CACHE = 1024
LAST_ERROR_CHARS = 160


@frozen
class TurnState:
    """What the runtime block says of the session's state: messages queued behind this turn
    and how the last turn ended (openboa's pending queue and terminal status)."""

    pending: int = 0
    last_status: str | None = None
    last_error: str | None = None

    def lines(self) -> list[str]:
        out = []
        if self.pending:
            out.append(f"Queued behind this turn: {self.pending} message(s) from this chat")
        if self.last_status:
            error = f" ({self.last_error[:LAST_ERROR_CHARS]})" if self.last_error else ""
            out.append(f"Last turn: {self.last_status}{error}")
        return out


@dataclass(slots=True)
class BuiltContext:
    messages: list[dict[str, Any]]
    user_message: dict[str, Any]
    """What is stored in history for this input: the text, without runtime block or base64."""
    user_tokens: int
    snapshot: dict[str, Any] = field(default_factory=dict)
    texts: dict[str, str] = field(default_factory=dict)
    """The texts the snapshot names by hash (stored once each: ``layer_texts``)."""
    dropped_turns: int = 0
    """Whole turns of history left out to fit: the session is due for compaction."""
    history_room: int = 0
    """Tokens the history may take in this request (the window less everything else)."""
    loaded: frozenset[str] = frozenset()
    """Tools offered in full from the start beyond the core ones (used lately)."""
    history_total: int = 0
    """Tokens of all the history read (before whole turns were dropped to fit)."""
    encoded: EncodedSpan | None = None
    """The kept history as the request body writes it, when the history carried it."""


def history_groups(history: list[StoredMessage]) -> list[list[StoredMessage]]:
    """Split history into units that start at a user message, so cuts never split a turn."""
    groups: list[list[StoredMessage]] = []
    for msg in history:
        if msg.role == "user" or not groups:
            groups.append([msg])
        else:
            groups[-1].append(msg)
    if groups and groups[0][0].role != "user":
        groups.pop(0)  # a turn whose beginning fell outside the window: never half of one
    return groups


class ContextBuilder:
    def __init__(self, config: Config, counter: TokenCounter, *,
                 window: int | None = None, builtin_skills: Path | None = BUILTIN_SKILLS,
                 policy: TrustPolicy | None = None) -> None:
        self.config = config
        self.counter = counter
        self.policy = policy or TrustPolicy(config.agent.trust)
        ctx = config.agent.context
        self.workspace = config.workspace_path
        self.max_context_tokens = ctx.max_context_tokens or window or DEFAULT_WINDOW
        self.reply_reserve = reply_reserve(self.max_context_tokens, ctx.reply_reserve_tokens,
                                           config.agent.max_tokens)
        """Tokens kept free for the answer (scaled with the window unless configured)."""
        self.prompts = SystemPrompts(config, counter, builtin_skills=builtin_skills)
        self.loader = self.prompts.loader
        self.skills = self.prompts.skills
        self.tz = ZoneInfo(config.agent.timezone)
        self._time_line = TimeLine(self.tz, config.agent.timezone)
        memory = config.agent.memory
        self.memory_enabled = memory.enabled
        self._summary_tokens: dict[int, int] = {}
        self._kept_cap = 0
        """Compaction id → its summary message's tokens: counted once, not every turn."""
        self._system_text = ""
        self._system_part = b""
        """The last system prompt's text and its part of the fingerprint."""

    # system ------------------------------------------------------------------------------

    def system_prompt(self, *, heartbeat: bool = False, owner_files: bool = True
                      ) -> SystemPrompt:
        """The system prompt (``agent/system_prompt.py``)."""
        return self.prompts.system_prompt(heartbeat=heartbeat, owner_files=owner_files)

    def memory_stores(self, audience: Audience) -> list[MemoryStore]:
        """The memory scopes ``audience`` reads, as (shared, cached) stores."""
        if not self.memory_enabled:
            return []
        memory, tz = self.config.agent.memory, self.config.agent.timezone
        return [memory_store_for(self.workspace, memory, timezone=tz, scope=scope)
                for scope in audience.recall]

    # runtime and user ---------------------------------------------------------------------

    def recall(self, inbound: InboundMessage, audience: Audience | None = None) -> str | None:
        """Memory paragraphs that match the user's message, from the scopes its sender may
        read (``agent/trust.py``), within the recall token cap."""
        if inbound.kind != "user" or not inbound.text.strip():
            return None
        stores = self.memory_stores(audience or self.policy.audience(inbound))
        return recall_block(stores, inbound.text, counter=self.counter)

    def runtime_block(self, inbound: InboundMessage, hints: ChannelHints,
                      recall: str | None = None, model: str | None = None,
                      state: TurnState | None = None) -> str:
        """``model``: the one this turn asks (a conversation's ``/model``), else the
        default; ``state``: the queue behind the turn and the last turn's end."""
        sender = inbound.sender_name or inbound.sender_id
        if inbound.sender_name:
            sender = f"{inbound.sender_name} (id {inbound.sender_id})"
        lines = [
            RUNTIME_TAG,
            self._time_line(inbound.received_at),
            f"Channel: {inbound.channel}",
            f"Chat ID: {inbound.chat_id}",
            f"Chat type: {inbound.chat_type}",
        ]
        if inbound.thread_id:
            lines.append(f"Thread: {inbound.thread_id}")
        lines.append(f"Sender: {sender}")
        lines.append(f"Sender trust: {inbound.trust}")
        lines.append(f"Model: {model or self.config.agent.model}")
        if inbound.chat_type == "group":
            lines.append(f"Mentioned: {'yes' if inbound.mentioned else 'no'}")
        if inbound.kind != "user":
            lines.append(f"Message kind: {inbound.kind}")
        if state is not None:
            lines.extend(state.lines())
        lines.append("Channel hints:")
        lines.extend(f"- {line}" for line in hints.lines())
        if recall:
            lines.append(recall)
        return "\n".join(lines)

    def _media_note(self, inbound: InboundMessage) -> str:
        notes = []
        for m in inbound.media:
            if m.kind == "image" and m.path and m.text is None:
                continue
            where = m.path or m.url
            notes.append(f"[attached {m.kind}: {where} ({m.mime or 'unknown type'}, "
                         f"{m.size if m.size is not None else '?'} bytes)]")
            if m.text:  # what agent/media read of it: a transcript, a description, a head
                notes.append(m.text)
        return "\n".join(notes)

    def stored_user_message(self, inbound: InboundMessage) -> dict[str, Any]:
        text = inbound.text
        if inbound.chat_type == "group" and inbound.kind == "user" and \
                not inbound.senders_inline:
            text = f"[{inbound.sender_name or inbound.sender_id}] {text}"
        images = [m.path for m in inbound.media if _sent_as_image(m)]
        extra = [self._media_note(inbound)] if any(not _sent_as_image(m)
                                                   for m in inbound.media) else []
        extra += [f"[image: {p}]" for p in images]
        body = "\n".join([text, *extra]) if extra else text
        return {"role": "user", "content": body}

    def user_content(self, inbound: InboundMessage, stored: dict[str, Any]) -> Any:
        images = [m for m in inbound.media if _sent_as_image(m)]
        if not images:
            return stored["content"]
        parts: list[dict[str, Any]] = [{"type": "text", "text": stored["content"]}]
        for m in images:
            assert m.path is not None
            path = Path(m.path)
            try:
                size = path.stat().st_size
                if size > MAX_IMAGE_BYTES:
                    parts[0]["text"] += f"\n[image {path.name} left out: {size:,} bytes is over " \
                                        f"the {MAX_IMAGE_BYTES:,}-byte limit]"
                    continue
                data = base64.b64encode(path.read_bytes()).decode()
            except OSError as exc:
                parts[0]["text"] += f"\n[image {path.name} could not be read: {exc.strerror}]"
                continue
            parts.append({"type": "image_url",
                          "image_url": {"url": f"data:{m.mime or 'image/png'};base64,{data}"}})
        return parts

    # assembly -----------------------------------------------------------------------------

    def _fit_history(self, history: list[StoredMessage], available: int, trimmed: list[str]
                     ) -> tuple[list[dict[str, Any]], int, int, int, bytes | None,
                                bytes | None]:
        """(messages kept, their tokens, whole turns dropped to fit ``available``, the
        tokens of all of them, the kept messages' digests back to back when ``history``
        carries them, and their JSON when it carries that and none of them was shortened).
        Turns start at a user message (``history_groups``). It runs every turn over up to
        ``max_recent_messages``: from what ``HistoryRows`` carries (a look at the tool
        results alone) when nothing is to be shortened or left out; the whole window, and
        the turns' bounds, only when something is."""
        n = len(history)
        first = 0
        while first < n and history[first].role != "user":
            first += 1
        if first:  # a turn whose beginning fell outside the window: never half of one
            trimmed.append(f"dropped {first} message(s) of a turn cut by max_recent_messages")
        cap = snippet_cap(available, self.config.agent.context.max_tool_snippet_tokens)
        rest = history[first:] if first else history
        digests: bytes | None = None
        if isinstance(history, HistoryRows) and not first:  # figured once per message
            bodies, total, digests = history.bodies, history.tokens, history.digests
            long = [i for i in history.tools if history[i].tokens > cap]
        else:
            bodies, total = [m.body for m in rest], sum(m.tokens for m in rest)
            long = [i for i, m in enumerate(rest) if m.role == "tool" and m.tokens > cap]
        counts: list[int] = []
        if long or total > available:
            bodies, counts = list(bodies), [m.tokens for m in rest]
        changed = bytearray(digests) if long and digests is not None else None
        for i in long:
            bodies[i], counts[i] = self.shorten_tool(bodies[i], cap)
            if changed is not None:
                changed[i * DIGEST_BYTES:(i + 1) * DIGEST_BYTES] = message_digest(bodies[i])
        if changed is not None:
            digests = bytes(changed)
        if long:
            trimmed.append(f"shortened {len(long)} old tool result(s) to "
                           f"{cap} tokens")
            total = sum(counts)
        everything = total
        dropped = 0
        kept = bodies
        first_kept = 0
        if total > available:  # whole turns, oldest first, each from its user message
            starts = [i for i, m in enumerate(rest) if m.role == "user"]
            ends = [*starts[1:], len(counts)]
            while dropped < len(starts) and total > available:
                total -= sum(counts[starts[dropped]:ends[dropped]])
                dropped += 1
            first_kept = starts[dropped] if dropped < len(starts) else len(rest)
            kept = bodies[first_kept:]
            if digests is not None:
                digests = digests[first_kept * DIGEST_BYTES:]
        if dropped:
            trimmed.append(f"dropped the {dropped} oldest turn(s) of history to fit "
                           f"{self.max_context_tokens} tokens")
        self._kept_cap = cap
        raw = history.raw_from(first_kept) if isinstance(history, HistoryRows) and not first \
            and kept and all(i < first_kept for i in long) else None
        return kept, total, dropped, everything, digests, raw

    def shorten_tool(self, body: dict[str, Any], cap: int) -> tuple[dict[str, Any], int]:
        tokens = self.counter.encoding.encode_ordinary(str(body.get("content") or ""))
        head = self.counter.encoding.decode(tokens[:cap])
        text = f"{head}\n[… tool result shortened from {len(tokens)} tokens …]"
        new = {**body, "content": text}
        return new, self.counter.count_message(new)

    def summary_message(self, compaction: Compaction) -> dict[str, Any]:
        return {"role": "user", "content": f"{SUMMARY_TAG}\n{compaction.summary}"}

    def _system_digest(self, message: dict[str, Any]) -> bytes:
        """The system message's part of the fingerprint, kept while its text is the same (it
        is the largest message, and the same turn after turn)."""
        text = message["content"]
        if text != self._system_text:
            self._system_part = message_digest(message)
            self._system_text = text
        return self._system_part

    def _summary_message_tokens(self, compaction: Compaction, message: dict[str, Any]) -> int:
        tokens = self._summary_tokens.get(compaction.id)
        if tokens is None:
            if len(self._summary_tokens) >= SUMMARY_TOKENS_CACHE:
                self._summary_tokens.pop(next(iter(self._summary_tokens)))
            tokens = self._summary_tokens[compaction.id] = self.counter.count_message(message)
        return tokens

    def build(self, *, inbound: InboundMessage, history: list[StoredMessage],
              hints: ChannelHints, tools_tokens: int = 0, session_key: str = "",
              turn_id: str = "", compaction: Compaction | None = None,
              recall: str | None | bool = True, audience: Audience | None = None,
              model: str | None = None, chat_prompt: str | None = None,
              state: TurnState | None = None) -> BuiltContext:
        """``history`` is what was stored after ``compaction`` (if any), oldest first.
        ``recall``: True to search memory now; a replay passes the text the turn recalled
        (memory may have changed since). ``audience``: the sender's (from the policy when
        not given). ``model``: the model this turn asks (named in the runtime block and the
        snapshot); ``chat_prompt``: the chat's own addition to the system prompt
        (``agent.chats``)."""
        audience = audience or self.policy.audience(inbound)
        system = self.system_prompt(heartbeat=inbound.kind == "heartbeat",
                                    owner_files=audience.owner_files)
        if chat_prompt:
            system = self.prompts.with_chat_prompt(system, chat_prompt)
        model = model or self.config.agent.model
        recalled = self.recall(inbound, audience) if recall is True else (recall or None)
        runtime = {"role": "user", "content": self.runtime_block(inbound, hints, recalled,
                                                                     model, state)}
        stored = self.stored_user_message(inbound)
        user = {"role": "user", "content": self.user_content(inbound, stored)}
        summary = [self.summary_message(compaction)] if compaction else []
        summary_tokens = self._summary_message_tokens(compaction, summary[0]) \
            if compaction else 0
        runtime_tokens = self.counter.count_message(runtime)
        user_tokens = self.counter.count_message(user)
        reserve = self.reply_reserve
        available = (self.max_context_tokens - reserve - system.tokens - tools_tokens
                     - summary_tokens - runtime_tokens - user_tokens)
        trimmed: list[str] = []
        kept, history_tokens, dropped, everything, kept_digests, kept_raw = \
            self._fit_history(history, max(available, 0), trimmed)
        system_message = {"role": "system", "content": system.text}
        messages = [system_message, *summary, *kept, runtime, user]
        encoded = EncodedSpan(1 + len(summary), len(kept), kept_raw) if kept_raw else None
        if kept_digests is None:
            kept_digests = b"".join(map(message_digest, kept))
        digests = [self._system_digest(system_message), *map(message_digest, summary),
                   kept_digests, message_digest(runtime), message_digest(user)]
        layer_hashes = self.prompts.layer_hashes(system)
        texts = {h: layer.text for layer, (_, h) in zip(system.layers, layer_hashes,
                                                         strict=True)}
        texts[runtime_hash := text_hash(runtime["content"])] = runtime["content"]
        total = (system.tokens + tools_tokens + summary_tokens + history_tokens
                 + runtime_tokens + user_tokens)
        if total > self.max_context_tokens - reserve:
            trimmed.append("over budget even without history: the current input is kept whole")
        snapshot = {
            "session_key": session_key, "turn_id": turn_id, "hash": digests_hash(digests),
            "trust": inbound.trust, "model": model, "owner_files": audience.owner_files,
            "memory_scopes": [scope.name for scope in audience.recall],
            "total_tokens": total, "max_context_tokens": self.max_context_tokens,
            "layers": {**{layer.name: layer.tokens for layer in system.layers},
                       "tools": tools_tokens, "summary": summary_tokens,
                       "history": history_tokens, "runtime": runtime_tokens,
                       "user": user_tokens},
            "sources": {"history_available": len(history), "history_kept": len(kept),
                        "skills": system.skills, "compaction": compaction.id if compaction
                        else None, "images": sum(1 for m in inbound.media if m.kind == "image"),
                        "memory_recalled": recalled.count("\n- [") if recalled else 0},
            "trimmed": trimmed, "bootstrap_cuts": list(system.notes),
            # The texts by content hash (``layer_texts``): a replay needs no workspace file.
            "texts": {"system": layer_hashes, "runtime": runtime_hash},
            # What a replay needs to rebuild exactly these messages from the database.
            "inputs": {"inbound": event_to_dict(inbound),
                       "history_ids": [history[0].id, history[-1].id] if history else None,
                       "kept_ids": [history[-len(kept)].id, history[-1].id] if kept else None,
                       "snippet_cap": self._kept_cap,
                       "compaction_id": compaction.id if compaction else None,
                       "hints": {"markup": hints.markup, "max_length": hints.max_length,
                                 "etiquette": hints.etiquette},
                       "tools_tokens": tools_tokens, "recall": recalled, "model": model,
                       "chat_prompt": chat_prompt},
        }
        return BuiltContext(messages=messages, user_message=stored, texts=texts,
                            user_tokens=self.counter.count_message(stored), snapshot=snapshot,
                            dropped_turns=dropped, history_room=max(available, 0),
                            history_total=everything, encoded=encoded)


def _sent_as_image(media: Media) -> bool:
    """An image file the model gets as an image: not one ``agent/media`` put into words."""
    return media.kind == "image" and media.path is not None and media.text is None
