"""What a model call returns, whichever way it was made (litellm or ``agent/openai_http.py``)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

_THINK_OPEN = re.compile(r"\A\s*<think>", re.IGNORECASE)
_THINK_CLOSE = re.compile(r"</think>\s*", re.IGNORECASE)


def without_reasoning(content: str | None) -> str | None:
    """The answer without the reasoning local models (DeepSeek-R1 and its distills, Qwen3,
    QwQ, served by Ollama, llama.cpp or LM Studio) write into it as ``<think>…</think>``:
    it is not for the chat, and sent back as history it only costs tokens. A reply that
    starts with ``<think>`` and never closes it was all reasoning (cut off by the length
    limit); one with a lone ``</think>`` had its opening tag in the prompt template."""
    if not content:
        return content
    opened = _THINK_OPEN.match(content)
    closed = _THINK_CLOSE.search(content)
    if closed is None:
        return None if opened else content
    if opened is None and "<think>" in content[:closed.start()].lower():
        return content  # a tag in the middle of the answer: talk about tags, not reasoning
    return content[closed.end():] or None


@dataclass(frozen=True, slots=True)
class ToolCall:
    id: str
    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class LLMResponse:
    content: str | None
    tool_calls: tuple[ToolCall, ...]
    model: str
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    latency_ms: float
    attempts: int = 1
    target: str = ""
    """The configured model name that was called (``model`` is the server's name for it):
    what the call is priced by."""

    def assistant_message(self) -> dict[str, Any]:
        msg: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            msg["tool_calls"] = [
                {"id": c.id, "type": "function",
                 "function": {"name": c.name, "arguments": c.arguments}}
                for c in self.tool_calls]
        return msg


class StreamAssembler:
    """Joins streamed chunk deltas (OpenAI shape, as dicts) into one answer."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self.calls: dict[int, dict[str, str]] = {}
        self.finish: str | None = None
        self.prompt_tokens = 0
        self.completion_tokens = 0

    def usage(self, prompt_tokens: Any, completion_tokens: Any) -> None:
        self.prompt_tokens = int(prompt_tokens or 0)
        self.completion_tokens = int(completion_tokens or 0)

    def delta(self, finish_reason: str | None, content: Any,
              tool_calls: list[tuple[int | None, str | None, str | None, Any]]) -> None:
        """``tool_calls``: (index, id, name piece, arguments piece) per streamed call delta."""
        self.finish = finish_reason or self.finish
        if content:
            self.text.append(content)
        for index, call_id, name, arguments in tool_calls:
            slot = self.calls.setdefault(index or 0, {"id": "", "name": "", "arguments": ""})
            if call_id:
                slot["id"] = call_id
            if name:
                slot["name"] += name
            if arguments:
                slot["arguments"] += arguments if isinstance(arguments, str) else str(arguments)

    def result(self, model: str, latency_ms: float) -> LLMResponse:
        tool_calls = tuple(ToolCall(id=c["id"] or f"call_{i}", name=c["name"],
                                    arguments=c["arguments"] or "{}")
                           for i, c in sorted(self.calls.items()))
        return LLMResponse(content=without_reasoning("".join(self.text)) or None,
                           tool_calls=tool_calls,
                           model=model, finish_reason=self.finish,
                           prompt_tokens=self.prompt_tokens,
                           completion_tokens=self.completion_tokens, latency_ms=latency_ms)
