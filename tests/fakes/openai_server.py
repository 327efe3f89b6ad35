"""A scripted OpenAI-compatible Chat Completions server on loopback.

Why: our agent talks to models through litellm, and mocking litellm would test our mocks rather
than the real request building, streaming assembly and error mapping. This server speaks the
wire protocol instead, so the real litellm (and the real openai SDK under it) runs end to end.

Tests push answers in advance (`reply`, `tool_call`, `error`, ...); each request takes the next
one in FIFO order. A request with nothing scripted and no default responder is an *unexpected*
call: it gets HTTP 500 and is recorded, so `assert_all_used()` fails the test.

    async with ScriptedLLM() as llm:
        llm.tool_call("read_file", {"path": "a.txt"}).reply("done")
        await run_turn(api_base=llm.base_url)
        llm.assert_all_used()
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import itertools
import json
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Self

from aiohttp import web

_log = logging.getLogger(__name__)

__all__ = ["Responder", "ScriptedLLM"]

JSON = dict[str, Any]
ToolArgs = Mapping[str, Any] | str
"""Tool arguments: a mapping is sent as JSON; a str is sent verbatim (to script malformed JSON)."""

Responder = Callable[[JSON], "JSON | str | Awaitable[JSON | str]"]
"""Default answer for an empty script: a str is a text reply; a dict is an assistant message
(`content` and/or OpenAI-shaped `tool_calls`, whose `arguments` may be a dict), optionally with
`usage`. May be async, to simulate work."""

# litellm maps errors by searching the body text before it looks at the status: any body saying
# "invalid_request_error" becomes BadRequestError. OpenAI's real 401 escapes that only through its
# "Incorrect API key provided" wording, so a scripted 401 says "authentication_error" instead.
_ERROR_KINDS: dict[int, tuple[str, str | None]] = {
    400: ("invalid_request_error", None),
    401: ("authentication_error", "invalid_api_key"),
    403: ("permission_error", None),
    404: ("invalid_request_error", "model_not_found"),
    429: ("requests", "rate_limit_exceeded"),
    500: ("server_error", None),
    503: ("server_error", "service_unavailable"),
}
_STREAM_PIECES = 3
_SSE_DONE = b"data: [DONE]\n\n"


@dataclass(frozen=True, slots=True, kw_only=True)
class _ToolCall:
    id: str
    name: str
    arguments: str


@dataclass(frozen=True, slots=True, kw_only=True)
class _Answer:
    """One scripted answer; `status` other than 200 makes it an error answer."""

    content: str | None = None
    tool_calls: tuple[_ToolCall, ...] = ()
    usage: Mapping[str, int] | None = None
    status: int = 200
    error_message: str = ""
    retry_after: float | None = None
    delay: float = 0.0

    @property
    def finish_reason(self) -> str:
        return "tool_calls" if self.tool_calls else "stop"


@dataclass(slots=True)
class _Default:
    responder: Responder
    delay: float = 0.0


@dataclass(slots=True)
class _Counters:
    call_ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    completions: itertools.count[int] = field(default_factory=lambda: itertools.count(1))


class ScriptedLLM:
    """Loopback OpenAI-compatible server answering from a FIFO script.

    Pass `base_url` to litellm as `api_base` with a model like `openai/test-model`.
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        models: Sequence[str] = ("test-model",),
    ) -> None:
        self._host = host
        self._requested_port = port
        self._models = tuple(models)
        self._script: deque[_Answer] = deque()
        self._pending_delay: float | None = None
        self._default: _Default | None = None
        self._counters = _Counters()
        self._received = asyncio.Condition()
        self._stopping = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self._port: int | None = None
        self.requests: list[JSON] = []
        """Parsed JSON bodies of every chat request, in arrival order."""
        self.request_headers: list[dict[str, str]] = []
        """Headers (lower-cased names) of every chat request, parallel to `requests`."""
        self.unexpected: list[JSON] = []
        """Bodies of requests that found nothing scripted and no default responder."""
        self.responder_errors: list[Exception] = []
        """Exceptions raised by the `respond_with` callable (each answered with HTTP 500)."""

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> Self:
        if self._runner is not None:
            return self
        app = web.Application(client_max_size=64 * 1024 * 1024)
        for prefix in ("/v1", ""):
            app.router.add_post(f"{prefix}/chat/completions", self._handle_chat)
            app.router.add_get(f"{prefix}/models", self._handle_models)
        # No access log: benchmarks send thousands of requests. Handler cancellation lets a
        # client that timed out free its delayed handler at once instead of at shutdown.
        runner = web.AppRunner(
            app,
            access_log=None,
            handle_signals=False,
            handler_cancellation=True,
            shutdown_timeout=1.0,
        )
        await runner.setup()
        site = web.TCPSite(runner, self._host, self._requested_port, backlog=1024)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._stopping.clear()
        self._runner = runner
        self._port = int(runner.addresses[0][1])
        return self

    async def stop(self) -> None:
        """Stop serving; safe to call twice. Wakes delayed answers so shutdown is prompt."""
        runner, self._runner = self._runner, None
        if runner is None:
            return
        self._stopping.set()
        await runner.cleanup()

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("ScriptedLLM is not started")
        return self._port

    @property
    def base_url(self) -> str:
        """What litellm takes as `api_base`, e.g. `http://127.0.0.1:PORT/v1`."""
        return f"http://{self._host}:{self.port}/v1"

    # -- scripting ------------------------------------------------------------------------------

    def delay(self, seconds: float) -> Self:
        """Delay the next scripted answer: `llm.delay(1.0).reply("late")`."""
        self._pending_delay = seconds
        return self

    def reply(
        self, text: str, *, usage: Mapping[str, int] | None = None, delay: float = 0.0
    ) -> Self:
        """Script an assistant text answer."""
        return self._push(_Answer(content=text, usage=usage, delay=delay))

    def tool_call(
        self,
        name: str,
        arguments: ToolArgs,
        *,
        call_id: str | None = None,
        usage: Mapping[str, int] | None = None,
        delay: float = 0.0,
    ) -> Self:
        """Script an assistant message asking for one tool call."""
        call = self._make_call(name, arguments, call_id)
        return self._push(_Answer(tool_calls=(call,), usage=usage, delay=delay))

    def tool_calls(
        self,
        calls: Sequence[tuple[str, ToolArgs] | tuple[str, ToolArgs, str]],
        *,
        usage: Mapping[str, int] | None = None,
        delay: float = 0.0,
    ) -> Self:
        """Script one assistant message asking for several tool calls: `(name, args[, id])`."""
        made = tuple(self._make_call(c[0], c[1], c[2] if len(c) == 3 else None) for c in calls)
        if not made:
            raise ValueError("tool_calls() needs at least one call")
        return self._push(_Answer(tool_calls=made, usage=usage, delay=delay))

    def error(
        self,
        status: int,
        message: str = "scripted error",
        *,
        retry_after: float | None = None,
        delay: float = 0.0,
    ) -> Self:
        """Script an HTTP error with OpenAI's error body (and `Retry-After` when given)."""
        if status < 400:
            raise ValueError(f"error status must be >= 400, got {status}")
        return self._push(
            _Answer(status=status, error_message=message, retry_after=retry_after, delay=delay)
        )

    def respond_with(self, responder: Responder, *, delay: float = 0.0) -> Self:
        """Answer with `responder(request_json)` whenever the script is empty."""
        self._default = _Default(responder, delay)
        return self

    def echo(self, *, delay: float = 0.0) -> Self:
        """Reply "echo: <last user text>" whenever the script is empty (benchmarks, smoke tests)."""
        return self.respond_with(_echo, delay=delay)

    @property
    def pending(self) -> int:
        """Scripted answers not yet used."""
        return len(self._script)

    def _push(self, answer: _Answer) -> Self:
        if self._pending_delay is not None:
            answer = dataclasses.replace(answer, delay=self._pending_delay)
            self._pending_delay = None
        self._script.append(answer)
        return self

    def _make_call(self, name: str, arguments: ToolArgs, call_id: str | None) -> _ToolCall:
        args = arguments if isinstance(arguments, str) else json.dumps(dict(arguments))
        return _ToolCall(id=call_id or self._next_call_id(), name=name, arguments=args)

    def _next_call_id(self) -> str:
        return f"call_{next(self._counters.call_ids):04d}"

    # -- inspection -----------------------------------------------------------------------------

    @property
    def calls(self) -> int:
        """Number of chat requests received (expected or not)."""
        return len(self.requests)

    @property
    def last_request(self) -> JSON:
        if not self.requests:
            raise AssertionError("ScriptedLLM received no request")
        return self.requests[-1]

    async def wait_for_requests(self, n: int, timeout: float = 5.0) -> None:  # noqa: ASYNC109
        """Wait until at least `n` chat requests arrived; TimeoutError says how many did.

        Takes `timeout` (unlike ASYNC109 advises) so a forgotten request fails fast with a count.
        """
        try:
            async with asyncio.timeout(timeout):
                async with self._received:
                    await self._received.wait_for(lambda: len(self.requests) >= n)
        except TimeoutError:
            raise TimeoutError(
                f"expected {n} request(s) within {timeout}s, got {len(self.requests)}"
            ) from None

    def assert_all_used(self) -> None:
        """Fail when script items are left over, a request was unexpected or a responder raised."""
        problems = []
        if self._script:
            problems.append(f"{len(self._script)} scripted answer(s) never requested")
        if self.unexpected:
            last = _last_user_text(self.unexpected[-1].get("messages"))
            problems.append(
                f"{len(self.unexpected)} unexpected request(s); last user text: {last!r}"
            )
        if self.responder_errors:
            problems.append(f"responder raised {self.responder_errors[-1]!r}")
        if problems:
            raise AssertionError("ScriptedLLM: " + "; ".join(problems))

    # -- HTTP -----------------------------------------------------------------------------------

    async def _handle_models(self, request: web.Request) -> web.Response:
        created = int(time.time())
        data = [
            {"id": m, "object": "model", "created": created, "owned_by": "parley-tests"}
            for m in self._models
        ]
        return _json_response({"object": "list", "data": data})

    async def _handle_chat(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        try:
            body = json.loads(raw)
            if not isinstance(body, dict):
                raise ValueError("body is not a JSON object")
        except ValueError as exc:
            body = {"_invalid_body": raw.decode("utf-8", "replace")}
            self._record(body, request, unexpected=True)
            async with self._received:
                self._received.notify_all()
            return _error_response(400, f"invalid JSON body: {exc}", None)

        answer = self._script.popleft() if self._script else None
        default = self._default if answer is None else None
        self._record(body, request, unexpected=answer is None and default is None)
        async with self._received:
            self._received.notify_all()

        if answer is None and default is None:
            _log.warning("ScriptedLLM: unexpected request #%d", len(self.requests))
            return _error_response(500, "ScriptedLLM: unexpected request (script empty)", None)
        if answer is None:
            assert default is not None
            try:
                answer = await self._from_responder(default, body)
            except Exception as exc:  # a test's bug: report it in assert_all_used, keep serving
                _log.exception("ScriptedLLM: responder failed")
                self.responder_errors.append(exc)
                return _error_response(500, f"ScriptedLLM: responder failed: {exc!r}", None)

        if answer.delay > 0 and await self._sleep_or_stop(answer.delay):
            return _error_response(503, "ScriptedLLM: server stopping", None)
        if answer.status != 200:
            return _error_response(answer.status, answer.error_message, answer.retry_after)

        model = str(body.get("model", "unknown"))
        usage = _usage(answer, prompt_bytes=len(raw))
        completion_id = f"chatcmpl-scripted-{next(self._counters.completions)}"
        if body.get("stream"):
            options = body.get("stream_options") or {}
            include_usage = bool(options.get("include_usage"))
            return await _stream(request, answer, model, completion_id, usage, include_usage)
        return _json_response(_completion(answer, model, completion_id, usage))

    def _record(self, body: JSON, request: web.Request, *, unexpected: bool) -> None:
        """Record synchronously, so `requests` order matches the order script items were taken."""
        self.requests.append(body)
        self.request_headers.append({k.lower(): v for k, v in request.headers.items()})
        if unexpected:
            self.unexpected.append(body)

    async def _from_responder(self, default: _Default, body: JSON) -> _Answer:
        result = default.responder(body)
        if inspect.isawaitable(result):
            result = await result
        if isinstance(result, str):
            return _Answer(content=result, delay=default.delay)
        message: Mapping[str, Any] = result
        calls = tuple(
            self._make_call(c["function"]["name"], c["function"].get("arguments", {}), c.get("id"))
            for c in message.get("tool_calls") or ()
        )
        return _Answer(
            content=message.get("content"),
            tool_calls=calls,
            usage=message.get("usage"),
            delay=default.delay,
        )

    async def _sleep_or_stop(self, seconds: float) -> bool:
        """Sleep, but wake early when the server stops; True means it is stopping."""
        try:
            async with asyncio.timeout(seconds):
                await self._stopping.wait()
        except TimeoutError:
            return False
        return True


# -- pure helpers: build OpenAI wire objects ------------------------------------------------------


def _last_user_text(messages: object) -> str:
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


def _echo(body: JSON) -> str:
    return f"echo: {_last_user_text(body.get('messages'))}"


def _usage(answer: _Answer, *, prompt_bytes: int) -> JSON:
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


def _message(answer: _Answer) -> JSON:
    message: JSON = {"role": "assistant", "content": answer.content, "refusal": None}
    if answer.tool_calls:
        message["content"] = None
        message["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments},
            }
            for c in answer.tool_calls
        ]
    return message


def _completion(answer: _Answer, model: str, completion_id: str, usage: JSON) -> JSON:
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


def _split(text: str, pieces: int = _STREAM_PIECES) -> list[str]:
    """Split text into a few fragments so clients must really reassemble a stream."""
    if not text:
        return []
    size = max(1, -(-len(text) // pieces))
    return [text[i : i + size] for i in range(0, len(text), size)]


def _stream_deltas(answer: _Answer) -> list[JSON]:
    """The `delta` objects OpenAI sends for this answer, before the finishing chunk."""
    if not answer.tool_calls:
        first: JSON = {"role": "assistant", "content": "", "refusal": None}
        return [first, *({"content": piece} for piece in _split(answer.content or ""))]
    deltas: list[JSON] = []
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


async def _stream(
    request: web.Request,
    answer: _Answer,
    model: str,
    completion_id: str,
    usage: JSON,
    include_usage: bool,
) -> web.StreamResponse:
    response = web.StreamResponse(
        status=200,
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"},
    )
    await response.prepare(request)
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

    for delta in _stream_deltas(answer):
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}
        await response.write(event([choice]))
    final = {"index": 0, "delta": {}, "logprobs": None, "finish_reason": answer.finish_reason}
    await response.write(event([final]))
    if include_usage:
        await response.write(event([], usage=usage))
    await response.write(_SSE_DONE)
    await response.write_eof()
    return response


def _json_response(
    payload: JSON, status: int = 200, headers: Mapping[str, str] | None = None
) -> web.Response:
    return web.Response(
        body=json.dumps(payload).encode(),
        status=status,
        content_type="application/json",
        headers=headers,
    )


def _error_response(status: int, message: str, retry_after: float | None) -> web.Response:
    kind, code = _ERROR_KINDS.get(status, ("server_error" if status >= 500 else "api_error", None))
    payload = {"error": {"message": message, "type": kind, "param": None, "code": code}}
    headers = {"Retry-After": f"{retry_after:g}"} if retry_after is not None else None
    return _json_response(payload, status=status, headers=headers)
