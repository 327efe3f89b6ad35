"""Token counting with tiktoken, offline.

tiktoken downloads its encodings on first use; litellm's package ships ``cl100k_base`` and
``o200k_base``, so we point ``TIKTOKEN_CACHE_DIR`` there without importing litellm itself.
A message is counted once, when it is stored; the count travels with it from then on.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
from functools import lru_cache
from pathlib import Path
from typing import Any

import tiktoken

from gateway.kernel.frozen import frozen

MESSAGE_OVERHEAD = 4
IMAGE_TOKENS = 765
_O200K = re.compile(r"(^|/)(gpt-4o|gpt-4\.1|gpt-4\.5|gpt-5|o\d|chatgpt-4o)", re.I)


def _point_tiktoken_at_litellm() -> None:
    if os.environ.get("TIKTOKEN_CACHE_DIR"):
        return
    spec = importlib.util.find_spec("litellm")
    if spec and spec.submodule_search_locations:
        folder = Path(next(iter(spec.submodule_search_locations)))
        tokenizers = folder / "litellm_core_utils" / "tokenizers"
        if tokenizers.is_dir():
            os.environ["TIKTOKEN_CACHE_DIR"] = str(tokenizers)


def encoding_name(model: str) -> str:
    return "o200k_base" if _O200K.search(model) else "cl100k_base"


@lru_cache(maxsize=4)
def _encoding(name: str) -> tiktoken.Encoding:
    _point_tiktoken_at_litellm()
    return tiktoken.get_encoding(name)


_BY_LINE = frozenset({"cl100k_base", "o200k_base"})
"""Encodings whose split never joins a line's end to the next line's start (a newline is
never the optional first character of a word; whitespace before a newline ends at it): a
text without blank (or all-space) lines or carriage returns counts the same as the sum of
its lines, each with its newline (``tests/agent/test_budget.py`` checks it against
whole-text counts)."""
KNOWN_MAX = 2048
"""Counts remembered, of texts (and lines) up to ``KNOWN_CHARS`` characters."""
KNOWN_CHARS = 2000
BY_LINE_CHARS = 8192
"""Longer texts (a tool's output, a document) are counted whole: once, and not line by line
into the memory of counts."""


class TokenCounter:
    """Counts are remembered by text: a turn counts its input two or three times (the
    request, the stored message) and a runtime block that differs from the last one by its
    time line; such a block is counted line by line, each line once."""

    def __init__(self, model: str) -> None:
        self.encoding = _encoding(encoding_name(model))
        self._by_line = self.encoding.name in _BY_LINE
        self._known: dict[str, int] = {}

    def count_text(self, text: str) -> int:
        if not text:
            return 0
        count = self._known.get(text)
        if count is not None:
            return count
        lines = text.split("\n") if self._by_line and len(text) <= BY_LINE_CHARS and \
            "\r" not in text else ()
        if len(lines) > 1 and all(line and not line.isspace() for line in lines):
            last = lines.pop()
            count = sum(self._count(f"{line}\n") for line in lines) + self._count(last)
            self._remember(text, count)
            return count
        return self._count(text)

    def _count(self, text: str) -> int:
        count = self._known.get(text)
        if count is None:
            count = len(self.encoding.encode_ordinary(text))  # = encode(disallowed_special=())
            self._remember(text, count)
        return count

    def _remember(self, text: str, count: int) -> None:
        if len(text) > KNOWN_CHARS:
            return
        if len(self._known) >= KNOWN_MAX:
            self._known.clear()
        self._known[text] = count

    def count_message(self, message: dict[str, Any]) -> int:
        tokens = MESSAGE_OVERHEAD
        content = message.get("content")
        if isinstance(content, str):
            tokens += self.count_text(content)
        elif isinstance(content, list):
            for part in content:
                if part.get("type") == "text":
                    tokens += self.count_text(part.get("text", ""))
                elif part.get("type") == "image_url":
                    tokens += IMAGE_TOKENS
        for call in message.get("tool_calls") or ():
            fn = call.get("function", {})
            tokens += self.count_text(fn.get("name", "")) + self.count_text(
                fn.get("arguments", "")) + 3
        if message.get("name"):
            tokens += self.count_text(message["name"])
        return tokens

    def count_tools(self, schemas: list[dict[str, Any]]) -> int:
        """What the tool list costs in the prompt (approximated by its JSON)."""
        if not schemas:
            return 0
        return self.count_text(json.dumps(schemas, separators=(",", ":")))


RESERVE_SHARE = 8
"""The reply reserve, unless configured: an eighth of the window ..."""
RESERVE_FLOOR = 256
"""... at least this many tokens, at most ``agent.max_tokens``."""
MIN_HISTORY_TOKENS = 512
"""A window must leave at least this much for history: the last exchange, word for word."""
TIGHT_HISTORY_TOKENS = 2000
"""Less room than this for history is named by ``parley status``: few turns stay whole."""
KEEP_FLOOR_TOKENS = 1500
"""A compaction keeps at least this much (or half the budget, whichever is less) word for
word: on a small window the share alone would keep no whole turn."""
SNIPPET_FLOOR = 200
SUMMARY_FLOOR = 100


def reply_reserve(window: int, configured: int | None, max_tokens: int) -> int:
    """Tokens kept free for the answer: the configured number, else scaled with the window."""
    if configured is not None:
        return configured
    return min(max_tokens, max(RESERVE_FLOOR, window // RESERVE_SHARE))


def keep_tokens(budget: int, share: float, cap: int) -> int:
    """What a compaction keeps word for word out of a history budget of ``budget``."""
    return int(min(max(budget * share, min(budget / 2, KEEP_FLOOR_TOKENS)), max(cap, 1)))


def snippet_cap(budget: int, configured: int) -> int:
    """An old tool result's cap in the history: the configured one, a quarter of a small
    history budget."""
    return min(configured, max(SNIPPET_FLOOR, budget // 4))


def summary_cap(budget: int, configured: int) -> int:
    """A summary's cap: the configured one, a fifth of a small history budget."""
    return min(configured, max(SUMMARY_FLOOR, budget // 5))


WINDOW_KEY = "agent.context.max_context_tokens"


class WindowTooSmall(ValueError):
    """The model's window, learned at the first turn, cannot hold a request."""


@frozen
class WindowPlan:
    """How a window is shared out for the largest audience (the owner's, every tool)."""

    window: int
    reserve: int
    system: int
    tools: int
    runtime: int
    model: str | None = None
    """Set when the window is the model's own (``max_context_tokens`` unset)."""

    @property
    def fixed(self) -> int:
        return self.reserve + self.system + self.tools + self.runtime

    @property
    def history(self) -> int:
        return self.window - self.fixed

    @property
    def _whose(self) -> str:
        return f"{self.model}'s window" if self.model else "the window"

    @property
    def warning(self) -> str | None:
        if self.history >= TIGHT_HISTORY_TOKENS:
            return None
        return (f"tight: {self._whose} of {self.window:,} tokens ({WINDOW_KEY}) leaves "
                f"{max(self.history, 0):,} for history; few turns stay word for word")

    def problem(self) -> str | None:
        """Why this window cannot work (the fixed part and the last exchange do not fit)."""
        if self.history >= MIN_HISTORY_TOKENS:
            return None
        return (f"{self._whose} of {self.window:,} tokens cannot hold the fixed part of a "
                f"request (system prompt {self.system:,}, tool schemas {self.tools:,}, "
                f"runtime block ~{self.runtime:,}, reply reserve {self.reserve:,}) and "
                f"{MIN_HISTORY_TOKENS:,} tokens of history: set {WINDOW_KEY} to at least "
                f"{self.fixed + MIN_HISTORY_TOKENS:,} if the model has that, else lower "
                "agent.context.reply_reserve_tokens or trim the workspace's bootstrap files")

    def describe(self) -> dict[str, Any]:
        return {"window": self.window, "reserve": self.reserve, "fixed": self.fixed,
                "history": self.history, "warning": self.warning}
