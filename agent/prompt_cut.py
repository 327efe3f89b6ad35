"""A model server that silently cuts the prompt, told to the owner (moved out of
``agent/turn_flow.py`` unchanged)."""

from __future__ import annotations

import logging
import time
from typing import Protocol

from agent.context import BuiltContext
from agent.runner import RunResult

_log = logging.getLogger(__name__)

PROMPT_CUT_MIN = 1000
PROMPT_CUT_SHARE = 0.6
"""A server that reports fewer prompt tokens than this share of what was sent is cutting the
prompt (tokenizers differ by ±20 %, not by 40 %)."""
PROMPT_CUT_EVERY = 600.0


class _Stats(Protocol):
    def error(self, text: str) -> None: ...


class PromptCutWarning:
    def __init__(self, stats: _Stats) -> None:
        self.stats = stats
        self._said = -PROMPT_CUT_EVERY

    def check(self, built: BuiltContext, result: RunResult) -> None:
        """Ollama keeps 4,096 prompt tokens (under 24 GiB of GPU memory) unless told otherwise
        and silently drops the rest from the start: the system prompt first. The usage it
        reports gives it away."""
        if not result.responses:
            return
        sent, seen = built.snapshot["total_tokens"], result.responses[0].prompt_tokens
        now = time.monotonic()
        if sent < PROMPT_CUT_MIN or not 0 < seen < PROMPT_CUT_SHARE * sent or \
                now - self._said < PROMPT_CUT_EVERY:
            return
        self._said = now
        text = (f"the model server counted {seen:,} prompt tokens where Parley sent about "
                f"{sent:,}: it is probably cutting the prompt, instructions first. Raise its "
                "context length (Ollama: OLLAMA_CONTEXT_LENGTH, often 4096 by default) or set "
                "agent.context.max_context_tokens to what it keeps")
        _log.warning("%s", text)
        self.stats.error(text)
