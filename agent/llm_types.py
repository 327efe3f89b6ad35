"""What a model call returns, whichever way it was made (litellm or ``agent/openai_http.py``)."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

from gateway.kernel.frozen import frozen

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


@frozen
class EncodedSpan:
    """Messages ``start`` to ``start + count`` of a request, already written as JSON (``raw``:
    each one's ``message_json``, joined by commas): the history a session's turns carry
    written once (``agent/history.HistoryRows``), so that a request body does not write it
    again every turn (``agent/openai_http.encode_body``). Whoever replaces a message in that
    span drops it (``Runner``)."""

    start: int
    count: int
    raw: bytes


@frozen
class ToolCall:
    id: str
    name: str
    arguments: str


@frozen
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

    def __init__(self, on_text: Callable[[str], None] | None = None) -> None:
        self.on_text = on_text
        """Called with each piece of content as it arrives (``agent/deltas.py``)."""
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
            if self.on_text is not None:
                self.on_text(content)
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


def from_response(raw: Any, model: str, started: float) -> LLMResponse:
    """A litellm answer (``ModelResponse``) as ours."""
    choice = raw.choices[0]
    message = choice.message
    calls = tuple(
        ToolCall(id=c.id or f"call_{i}", name=c.function.name or "",
                 arguments=c.function.arguments or "{}")
        for i, c in enumerate(message.tool_calls or ()))
    usage = getattr(raw, "usage", None)
    content = message.content
    if content and getattr(message, "reasoning_content", None):
        content = content.lstrip()  # litellm took the <think> block out, not what followed it
    return LLMResponse(
        content=without_reasoning(content) or None, tool_calls=calls,
        model=getattr(raw, "model", None) or model,
        finish_reason=choice.finish_reason,
        prompt_tokens=int(getattr(usage, "prompt_tokens", 0) or 0),
        completion_tokens=int(getattr(usage, "completion_tokens", 0) or 0),
        latency_ms=(time.perf_counter() - started) * 1000)


async def collect_stream(stream: Any, model: str, started: float,
                         on_text: Callable[[str], None] | None = None) -> LLMResponse | None:
    """A litellm stream joined into one answer, each piece of text handed to ``on_text``.

    None: the server counted tokens written, yet no text and no tool call came. That is a
    proxy answering the stream request with one JSON body, whose message litellm's stream
    parser drops (it reads only deltas); the caller asks again without streaming."""
    if not hasattr(stream, "__aiter__"):  # a server that answered the stream request whole
        answer = from_response(stream, model, started)
        if on_text is not None and answer.content and not answer.tool_calls:
            on_text(answer.content)
        return answer
    joined = StreamAssembler(on_text)
    async for chunk in stream:
        usage = getattr(chunk, "usage", None)
        if usage:
            joined.usage(getattr(usage, "prompt_tokens", 0), getattr(usage, "completion_tokens", 0))
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        delta = choice.delta
        calls = [(tc.index, tc.id, tc.function.name if tc.function else None,
                  tc.function.arguments if tc.function else None)
                 for tc in getattr(delta, "tool_calls", None) or ()]
        joined.delta(choice.finish_reason, getattr(delta, "content", None), calls)
    if not joined.text and not joined.calls and joined.completion_tokens > 0:
        return None
    return joined.result(model, (time.perf_counter() - started) * 1000)
