"""Compaction: the oldest part of a session is summarised by the model into one entry.

Later turns send that summary plus the messages kept after it; the full history stays in the
database. Splits fall between turns, never inside one (a tool call stays with its result).
The summary call has a time limit, so a session is never held for long; when it fails the
caller falls back to deterministic trimming and says so in one line.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from agent.budget import TokenCounter
from agent.context import history_groups
from agent.errors import ProviderError
from agent.llm_types import LLMResponse
from agent.provider import Provider
from gateway.kernel.config import CompactionConfig
from gateway.kernel.frozen import frozen
from gateway.kernel.store import Compaction, Store, StoredMessage, content_text

_log = logging.getLogger(__name__)

MESSAGE_CHARS = 2000
TOOL_CHARS = 400

SUMMARY_PROMPT = """You compact a chat between a user and an AI assistant so it can go on \
without the full transcript. Write a summary that keeps everything needed to continue: who \
the user is and what they want, decisions and facts established, names, numbers, file paths, \
commitments and open tasks, and the state of any work in progress. Leave out small talk. \
Write plain prose and short lists, at most {max_words} words. Do not address the user."""

FLUSH_PROMPT = """[Memory check before older messages are compacted] The oldest part of this \
conversation is about to be replaced by a summary. If it contains lasting facts about the \
user or decisions worth remembering beyond this conversation that are not in memory yet, save \
them now with the memory tool: kind=log for details of this conversation, kind=fact only for \
lasting facts about the user. Then answer with NO_REPLY only."""


class CompactionFailed(Exception):
    """Summarising did not work; the caller keeps the transcript and trims instead."""


@frozen
class Split:
    old: list[StoredMessage]
    kept: list[StoredMessage]

    @property
    def first_kept_id(self) -> int | None:
        return self.kept[0].id if self.kept else None


def split_history(history: list[StoredMessage], *, keep_tokens: int,
                  keep_messages: int) -> Split:
    """Keep the newest whole turns within both limits; everything older is to summarise."""
    groups = history_groups(history)
    lead = len(history) - sum(len(g) for g in groups)  # a turn cut by the read limit
    kept: list[list[StoredMessage]] = []
    tokens = count = 0
    for group in reversed(groups):
        size = sum(m.tokens for m in group)
        if tokens + size > keep_tokens or count + len(group) > keep_messages:
            break
        kept.insert(0, group)
        tokens += size
        count += len(group)
    n_old = len(history) - sum(len(g) for g in kept)
    return Split(old=history[:max(n_old, lead)], kept=[m for g in kept for m in g])


def transcript(previous: Compaction | None, old: list[StoredMessage]) -> str:
    """The part to summarise as plain text, long messages and tool output shortened."""
    lines: list[str] = []
    if previous is not None:
        lines.append(f"Summary of what came before:\n{previous.summary}\n")
    for m in old:
        body = m.body
        text = content_text(body.get("content"))
        if m.role == "tool":
            short = text if len(text) <= TOOL_CHARS else text[:TOOL_CHARS] + " […]"
            lines.append(f"Tool result ({body.get('name', 'tool')}): {short}")
            continue
        if len(text) > MESSAGE_CHARS:
            text = text[:MESSAGE_CHARS] + " […]"
        calls = body.get("tool_calls") or []
        if calls:
            names = ", ".join(f"{c['function']['name']}({c['function']['arguments'][:200]})"
                              for c in calls)
            text = f"{text} [called {names}]".strip()
        who = "User" if m.role == "user" else "Assistant"
        lines.append(f"{who}: {text}")
    return "\n".join(lines)


class Compactor:
    def __init__(self, provider: Provider, store: Store, counter: TokenCounter,
                 config: CompactionConfig) -> None:
        self.provider = provider
        self.store = store
        self.counter = counter
        self.config = config

    async def summarise(self, previous: Compaction | None, old: list[StoredMessage],
                        focus: str | None = None, spent: list[LLMResponse] | None = None,
                        max_tokens: int | None = None) -> str:
        """``spent`` gets the model's answer (for the usage ledger); ``max_tokens``: the
        summary's cap (``summary_max_tokens`` unless a small window wants less)."""
        cap = max_tokens or self.config.summary_max_tokens
        system = SUMMARY_PROMPT.format(max_words=int(cap * 0.7))
        if focus:
            system += f"\nPay particular attention to: {focus}"
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": system},
            {"role": "user", "content": transcript(previous, old)}]
        try:
            response = await asyncio.wait_for(
                self.provider.complete(messages, max_tokens=cap),
                self.config.timeout)
        except TimeoutError as exc:
            raise CompactionFailed(f"the summary took over {self.config.timeout:.0f}s") from exc
        except ProviderError as exc:
            raise CompactionFailed(str(exc)) from exc
        if spent is not None:
            spent.append(response)
        summary = (response.content or "").strip()
        if not summary:
            raise CompactionFailed("the model returned an empty summary")
        return self._cap(summary, cap)

    def _cap(self, summary: str, cap: int) -> str:
        """A summary never outgrows its cap, whatever the model returned: it is carried into
        every later summary (and so compacted again with it), so an overlong one would grow
        without bound."""
        tokens = self.counter.encoding.encode_ordinary(summary)
        if len(tokens) <= cap:
            return summary
        return self.counter.encoding.decode(tokens[:cap]).rstrip() + " […]"

    async def compact(self, session_id: int, split: Split, previous: Compaction | None,
                      focus: str | None = None, spent: list[LLMResponse] | None = None,
                      max_tokens: int | None = None) -> Compaction:
        """Summarise ``split.old`` (with the previous summary) and store the entry."""
        if not split.old:
            raise CompactionFailed("nothing to compact")
        summary = await self.summarise(previous, split.old, focus, spent, max_tokens)
        first_kept = split.first_kept_id if split.first_kept_id is not None \
            else split.old[-1].id + 1
        tokens_before = sum(m.tokens for m in split.old) + (
            previous.summary_tokens if previous else 0)
        entry = await self.store.add_compaction(
            session_id, summary=summary, summary_tokens=self.counter.count_text(summary),
            first_kept_id=first_kept, tokens_before=tokens_before,
            messages_summarised=len(split.old) + (previous.messages_summarised if previous
                                                  else 0))
        _log.info("compacted %d message(s) (%d tokens) of session %d into %d tokens",
                  len(split.old), tokens_before, session_id, entry.summary_tokens)
        return entry
