"""The OpenAI chat-completions protocol as ``channels/openai_api.py`` speaks it: a request read
into what Parley takes from it, and the answers in the shapes the official client parses
(``chat.completion``, ``chat.completion.chunk``, ``model``, ``{"error": {...}}``). Pure: no
I/O, so every shape is checked on its own.

Parley keeps each session's history itself. A client that resends the whole conversation with
every request (what the protocol asks of it) has only the *last* message taken, which must be
the user's: the earlier ones are already in the session, and a system message is the client's
own (Parley's system prompt comes from the workspace).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from typing import Any

from aiohttp import web

from channels.http_api import ApiError
from gateway.kernel.frozen import frozen

DEFAULT_MODEL = "parley"
"""The model name that means "the conversation's model" (the default, or what /model chose)."""
SESSION_HEADER = "X-Parley-Session"
SESSION_ID = re.compile(r"[A-Za-z0-9_.:@+-]{1,128}")
DEFAULT_SESSION = "default"
CHUNK_CHARS = 48
"""How much text one streamed chunk carries when the answer arrives whole."""
NO_RETRY = {"x-should-retry": "false"}
"""The official client retries a 5xx by itself; a retry would be a second turn."""


@frozen
class ChatRequest:
    session: str
    text: str
    model: str
    stream: bool


def _field(body: Mapping[str, Any], name: str, kind: type | tuple[type, ...],
           default: Any = None) -> Any:
    value = body.get(name, default)
    if value is not default and not isinstance(value, kind):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise ApiError(f"{name}: expected {names}")
    return value


def content_text(content: Any, where: str) -> str:
    """A message's ``content``: a string, or a list of ``{"type": "text"}`` parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for i, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" \
                    or not isinstance(part.get("text"), str):
                raise ApiError(f"{where}.content[{i}]: only text parts are taken "
                               "(type \"text\" with a string \"text\")")
            out.append(part["text"])
        return "".join(out)
    raise ApiError(f"{where}.content: expected a string or a list of text parts")


def parse_chat_request(raw: bytes, headers: Mapping[str, str], *, models: frozenset[str],
                       max_text_chars: int) -> ChatRequest:
    """The body of ``POST /v1/chat/completions``: the session, the new user text, the model
    and whether to stream. Raises ``ApiError`` naming the field at fault."""
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise ApiError("body: not valid JSON") from None
    if not isinstance(body, dict):
        raise ApiError("body: expected a JSON object")
    model = _field(body, "model", str)
    if not model:
        raise ApiError("model: required (GET /v1/models lists them)")
    if model not in models:
        raise ApiError(f"model: {model!r} does not exist; GET /v1/models lists the models",
                       404)
    messages = _field(body, "messages", list)
    if not messages:
        raise ApiError("messages: required, a non-empty list")
    last = messages[-1]
    where = f"messages[{len(messages) - 1}]"
    if not isinstance(last, dict) or last.get("role") != "user":
        raise ApiError(f"{where}.role: the last message must be the user's (Parley keeps the "
                       "conversation itself and takes only the newest user message)")
    text = content_text(last.get("content"), where)
    if not text.strip():
        raise ApiError(f"{where}.content: empty")
    if len(text) > max_text_chars:
        raise ApiError(f"{where}.content: longer than {max_text_chars} characters", 413)
    for name in ("tools", "functions"):
        if body.get(name):
            raise ApiError(f"{name}: not taken: Parley's agent runs its own tools (the "
                           "client's cannot be called)")
    if body.get("n", 1) != 1:
        raise ApiError("n: only 1 answer per request")
    stream = _field(body, "stream", bool, False)
    user = _field(body, "user", str)
    session = headers.get(SESSION_HEADER) or user or DEFAULT_SESSION
    if not SESSION_ID.fullmatch(session):
        what = SESSION_HEADER if headers.get(SESSION_HEADER) else "user"
        raise ApiError(f"{what}: a session id is 1-128 characters A-Z, a-z, 0-9 and _.:@+-")
    return ChatRequest(session=session, text=text, model=model, stream=bool(stream))


# --- answers -------------------------------------------------------------------------------------

def completion(completion_id: str, created: int, model: str, text: str) -> dict[str, Any]:
    return {"id": completion_id, "object": "chat.completion", "created": created,
            "model": model, "system_fingerprint": None,
            "choices": [{"index": 0, "finish_reason": "stop", "logprobs": None,
                         "message": {"role": "assistant", "content": text, "refusal": None}}]}


def chunk(completion_id: str, created: int, model: str, delta: dict[str, Any],
          finish_reason: str | None = None) -> dict[str, Any]:
    return {"id": completion_id, "object": "chat.completion.chunk", "created": created,
            "model": model, "system_fingerprint": None,
            "choices": [{"index": 0, "delta": delta, "logprobs": None,
                         "finish_reason": finish_reason}]}


def sse(data: dict[str, Any] | str) -> bytes:
    text = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {text}\n\n".encode()


DONE = sse("[DONE]")


def pieces(text: str, size: int = CHUNK_CHARS) -> Iterator[str]:
    """``text`` in consecutive pieces that concatenate back to it exactly."""
    for start in range(0, len(text), size):
        yield text[start:start + size]


def models_list(names: list[str], created: int) -> dict[str, Any]:
    return {"object": "list", "data": [{"id": name, "object": "model", "created": created,
                                        "owned_by": "parley"} for name in names]}


_TYPES = {400: "invalid_request_error", 401: "invalid_request_error",
          404: "invalid_request_error", 405: "invalid_request_error",
          413: "invalid_request_error", 429: "rate_limit_error"}
_CODES = {401: "invalid_api_key", 404: "model_not_found"}


def error_body(status: int, message: str) -> dict[str, Any]:
    param = message.split(":", 1)[0] if ":" in message and status in (400, 413) else None
    return {"error": {"message": message, "type": _TYPES.get(status, "server_error"),
                      "param": param, "code": _CODES.get(status)}}


def error_response(status: int, message: str,
                   headers: Mapping[str, str] | None = None) -> web.Response:
    extra = dict(headers or {})
    if status == 401:
        extra["WWW-Authenticate"] = "Bearer"
    if status >= 500:
        extra.update(NO_RETRY)
    return web.json_response(error_body(status, message), status=status, headers=extra)
