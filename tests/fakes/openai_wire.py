"""OpenAI Chat Completions on the wire, for the scripted server (``openai_server.py``).

Pure functions and values: what one scripted answer is, how a request body is read, and the
JSON objects and server-sent events OpenAI sends back for an answer, an error or a stream.
Nothing here knows about scripts, gates or the running server.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web

JSON = dict[str, Any]

# litellm maps errors by searching the body text before it looks at the status: any body saying
# "invalid_request_error" becomes BadRequestError. OpenAI's real 401 escapes that only through its
# "Incorrect API key provided" wording, so a scripted 401 says "authentication_error" instead.
ERROR_KINDS: dict[int, tuple[str, str | None]] = {
    400: ("invalid_request_error", None),
    401: ("authentication_error", "invalid_api_key"),
    403: ("permission_error", None),
    404: ("invalid_request_error", "model_not_found"),
    429: ("requests", "rate_limit_exceeded"),
    500: ("server_error", None),
    503: ("server_error", "service_unavailable"),
}
STREAM_PIECES = 3
SSE_DONE = b"data: [DONE]\n\n"


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCall:
    id: str
    name: str
    arguments: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Answer:
    """One answer; `status` other than 200 makes it an error answer."""

    content: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    usage: Mapping[str, int] | None = None
    status: int = 200
    error_message: str = ""
    retry_after: float | None = None
    pieces: tuple[str, ...] | None = None
    """The content's pieces when streamed (default: a few equal fragments)."""
    whole: bool = False
    """Answer with one JSON body even when the request asked for a stream (some proxies)."""

    @property
    def finish_reason(self) -> str:
        return "tool_calls" if self.tool_calls else "stop"


MakeCall = Callable[[str, Any, "str | None"], ToolCall]
"""Builds a tool call from `(name, arguments, id or None)`; the server numbers missing ids."""


class Gate:
    """Holds the answers scripted with it until `release()`; unreleased, they never come.

    One gate may hold several answers (and a default responder's every answer); one
    `release()` lets them all go, and answers taken after it are not held.
    """

    def __init__(self) -> None:
        self._open = asyncio.Event()

    def release(self) -> None:
        self._open.set()

    @property
    def released(self) -> bool:
        return self._open.is_set()

    async def wait(self) -> None:
        await self._open.wait()


# -- requests -------------------------------------------------------------------------------------


def parse_request(raw: bytes) -> JSON:
    """The request body as a JSON object; ValueError when it is not one."""
    body = json.loads(raw)
    if not isinstance(body, dict):
        raise ValueError("body is not a JSON object")
    return body


def last_user_text(messages: object) -> str:
    """Text of the last user message; content may be a string or a list of parts."""
    if not isinstance(messages, list):
        return ""
    for message in reversed(messages):
        if not isinstance(message, dict) or message.get("role") != "user":
            continue
        content = message.get("content")
        if isinstance(content, str):
            return content
        if isinstance(content, list):
            return "".join(
                str(part.get("text", ""))
                for part in content
                if isinstance(part, dict) and part.get("type") == "text"
            )
        return ""
    return ""


def echo(body: JSON) -> str:
    """The `echo` responder: "echo: <last user text>"."""
    return f"echo: {last_user_text(body.get('messages'))}"


def answer_from(result: JSON | str, make_call: MakeCall) -> Answer:
    """A responder's result as an answer: a str is a text reply; a dict is an assistant message
    (`content` and/or OpenAI-shaped `tool_calls`, whose `arguments` may be a dict), optionally
    with `usage`."""
    if isinstance(result, str):
        return Answer(content=result)
    calls = tuple(
        make_call(c["function"]["name"], c["function"].get("arguments", {}), c.get("id"))
        for c in result.get("tool_calls") or ()
    )
    return Answer(content=result.get("content"), tool_calls=calls, usage=result.get("usage"))


# -- answers --------------------------------------------------------------------------------------


def usage_of(answer: Answer, *, prompt_bytes: int) -> JSON:
    """Given usage, else rough counts (~4 bytes a token) so cost/usage code sees numbers."""
    given = dict(answer.usage or {})
    if answer.tool_calls:
        reply_len = sum(len(c.name) + len(c.arguments) for c in answer.tool_calls)
    else:
        reply_len = len(answer.content or "")
    prompt = int(given.get("prompt_tokens", max(1, prompt_bytes // 4)))
    completion = int(given.get("completion_tokens", max(1, reply_len // 4)))
    total = int(given.get("total_tokens", prompt + completion))
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": total}


def _message(answer: Answer) -> JSON:
    message: JSON = {"role": "assistant", "content": answer.content, "refusal": None}
    if answer.tool_calls:
        message["content"] = answer.content or None  # words the model wrote before its calls
        message["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments},
            }
            for c in answer.tool_calls
        ]
    return message


def completion(answer: Answer, model: str, completion_id: str, usage: JSON) -> JSON:
    """The whole (non-streamed) `chat.completion` object."""
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": "fp_scripted",
        "choices": [
            {
                "index": 0,
                "message": _message(answer),
                "logprobs": None,
                "finish_reason": answer.finish_reason,
            }
        ],
        "usage": usage,
    }


def _split(text: str, pieces: int = STREAM_PIECES) -> list[str]:
    """Split text into a few fragments so clients must really reassemble a stream."""
    if not text:
        return []
    size = max(1, -(-len(text) // pieces))
    return [text[i : i + size] for i in range(0, len(text), size)]


def stream_deltas(answer: Answer) -> list[JSON]:
    """The `delta` objects OpenAI sends for this answer, before the finishing chunk."""
    if not answer.tool_calls:
        first: JSON = {"role": "assistant", "content": "", "refusal": None}
        pieces = answer.pieces if answer.pieces is not None else _split(answer.content or "")
        return [first, *({"content": piece} for piece in pieces)]
    deltas: list[JSON] = []
    if answer.content:  # written before the calls, as models do ("Let me look.")
        deltas.append({"role": "assistant", "content": answer.content, "refusal": None})
    for index, call in enumerate(answer.tool_calls):
        opening: JSON = {
            "tool_calls": [
                {
                    "index": index,
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": ""},
                }
            ]
        }
        if index == 0:
            opening = {"role": "assistant", "content": None, **opening}
        deltas.append(opening)
        deltas.extend(
            {"tool_calls": [{"index": index, "function": {"arguments": piece}}]}
            for piece in _split(call.arguments)
        )
    return deltas


def stream_events(
    answer: Answer, model: str, completion_id: str, usage: JSON, *, include_usage: bool
) -> list[bytes]:
    """The server-sent events of a streamed answer, `data: [DONE]` last."""
    base: JSON = {
        "id": completion_id,
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": "fp_scripted",
    }
    extra: JSON = {"usage": None} if include_usage else {}

    def event(choices: list[JSON], **more: Any) -> bytes:
        chunk = {**base, "choices": choices, **extra, **more}
        return b"data: " + json.dumps(chunk).encode() + b"\n\n"

    events = [
        event([{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}])
        for delta in stream_deltas(answer)
    ]
    final = {"index": 0, "delta": {}, "logprobs": None, "finish_reason": answer.finish_reason}
    events.append(event([final]))
    if include_usage:
        events.append(event([], usage=usage))
    events.append(SSE_DONE)
    return events


async def send_stream(request: web.Request, events: list[bytes], *,
                      pause: Callable[[int], Awaitable[None]] | None = None,
                      ) -> web.StreamResponse:
    """Send `events` as a `text/event-stream` response, one write each; `pause(i)` is awaited
    before event `i` is written (a test holds the stream between pieces)."""
    response = web.StreamResponse(
        status=200,
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"},
    )
    await response.prepare(request)
    for i, data in enumerate(events):
        if pause is not None:
            await pause(i)
        await response.write(data)
    await response.write_eof()
    return response


def json_response(
    payload: JSON, status: int = 200, headers: Mapping[str, str] | None = None
) -> web.Response:
    return web.Response(
        body=json.dumps(payload).encode(),
        status=status,
        content_type="application/json",
        headers=headers,
    )


def error_response(status: int, message: str, retry_after: float | None = None) -> web.Response:
    """OpenAI's error body (and `Retry-After` when given)."""
    kind, code = ERROR_KINDS.get(status, ("server_error" if status >= 500 else "api_error", None))
    payload = {"error": {"message": message, "type": kind, "param": None, "code": code}}
    headers = {"Retry-After": f"{retry_after:g}"} if retry_after is not None else None
    return json_response(payload, status=status, headers=headers)


def models_list(models: tuple[str, ...]) -> JSON:
    """The `GET /models` answer."""
    created = int(time.time())
    data = [
        {"id": m, "object": "model", "created": created, "owned_by": "parley-tests"}
        for m in models
    ]
    return {"object": "list", "data": data}
