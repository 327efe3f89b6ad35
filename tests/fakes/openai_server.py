"""A scripted OpenAI-compatible Chat Completions server on loopback.

Why: our agent talks to models through litellm, and mocking litellm would test our mocks rather
than the real request building, streaming assembly and error mapping. This server speaks the
wire protocol (``openai_wire.py``) instead, so the real litellm (and the real openai SDK under
it) runs end to end.

Tests push answers in advance (`reply`, `tool_call`, `error`, ...); each request takes the next
one in FIFO order. A request with nothing scripted and no default responder is an *unexpected*
call: it gets HTTP 500 and is recorded, so `assert_all_used()` fails the test.

    async with ScriptedLLM() as llm:
        llm.tool_call("read_file", {"path": "a.txt"}).reply("done")
        await run_turn(api_base=llm.base_url)
        llm.assert_all_used()

No answer waits on the wall clock. To keep a request busy, hold its answer behind a `Gate`:
it is sent when the test calls `release()`, and never if it does not (a model that does not
answer, for timeouts and `/stop`; stopping the server still ends the held request at once).
`wait_for_requests(n)` and `wait_in_flight(n)` are the events a test waits for meanwhile.

    gate = llm.hold()                   # holds the next answer scripted
    llm.reply("first").reply("second")  # "first" is held, "second" is not
    ...
    await llm.wait_in_flight(1)
    gate.release()
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import json
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Self

from aiohttp import web

from tests.fakes.openai_wire import (
    JSON,
    Answer,
    Gate,
    ToolCall,
    answer_from,
    completion,
    echo,
    error_response,
    json_response,
    last_user_text,
    models_list,
    parse_request,
    send_stream,
    stream_events,
    usage_of,
)

_log = logging.getLogger(__name__)

__all__ = ["Gate", "Responder", "ScriptedLLM"]

ToolArgs = Mapping[str, Any] | str
"""Tool arguments: a mapping is sent as JSON; a str is sent verbatim (to script malformed JSON)."""

Responder = Callable[[JSON], "JSON | str | Awaitable[JSON | str]"]
"""Default answer for an empty script: a str is a text reply; a dict is an assistant message
(`content` and/or OpenAI-shaped `tool_calls`, whose `arguments` may be a dict), optionally with
`usage`. May be async."""


@dataclass(frozen=True, slots=True)
class _Scripted:
    answer: Answer
    gate: Gate | None = None
    pauses: Mapping[int, Gate] | None = None
    """Streamed: piece i (1-based) is written only once ``pauses[i]`` is released."""


@dataclass(frozen=True, slots=True)
class _Default:
    responder: Responder
    gate: Gate | None = None


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
        self._script: deque[_Scripted] = deque()
        self._pending_gate: Gate | None = None
        self._default: _Default | None = None
        self._counters = _Counters()
        self._changed = asyncio.Event()
        self._stopping = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self._port: int | None = None
        self._in_flight = 0
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
        # client that gave up free its held handler at once instead of at shutdown.
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
        """Stop serving; safe to call twice. Held answers end at once with HTTP 503."""
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

    def hold(self) -> Gate:
        """A new gate holding the next answer scripted (or the next `respond_with`/`echo`).

        Pass the same gate as `gate=` to hold more answers behind it.
        """
        self._pending_gate = Gate()
        return self._pending_gate

    def reply(
        self, text: str, *, usage: Mapping[str, int] | None = None, gate: Gate | None = None,
        pieces: Sequence[str] | None = None, pauses: Mapping[int, Gate] | None = None,
        whole: bool = False,
    ) -> Self:
        """Script an assistant text answer. Streamed, it comes as ``pieces`` (they must join
        to ``text``), piece i only after ``pauses[i]`` is released (the model writing);
        ``whole``: one JSON body even when a stream was asked for."""
        if pieces is not None and "".join(pieces) != text:
            raise ValueError("pieces must join to the text")
        answer = Answer(content=text, usage=usage, whole=whole,
                        pieces=tuple(pieces) if pieces is not None else None)
        self._script.append(_Scripted(answer, self._gate(gate), pauses))
        return self

    def tool_call(
        self,
        name: str,
        arguments: ToolArgs,
        *,
        call_id: str | None = None,
        usage: Mapping[str, int] | None = None,
        gate: Gate | None = None,
        text: str | None = None,
        pauses: Mapping[int, Gate] | None = None,
    ) -> Self:
        """Script an assistant message asking for one tool call (``text``: words written
        before it, as models often do; streamed, ``pauses[1]`` holds the call after them)."""
        call = self._make_call(name, arguments, call_id)
        answer = Answer(content=text, tool_calls=(call,), usage=usage)
        self._script.append(_Scripted(answer, self._gate(gate), pauses))
        return self

    def tool_calls(
        self,
        calls: Sequence[tuple[str, ToolArgs] | tuple[str, ToolArgs, str]],
        *,
        usage: Mapping[str, int] | None = None,
        gate: Gate | None = None,
    ) -> Self:
        """Script one assistant message asking for several tool calls: `(name, args[, id])`."""
        made = tuple(self._make_call(c[0], c[1], c[2] if len(c) == 3 else None) for c in calls)
        if not made:
            raise ValueError("tool_calls() needs at least one call")
        return self._push(Answer(tool_calls=made, usage=usage), gate)

    def error(
        self,
        status: int,
        message: str = "scripted error",
        *,
        retry_after: float | None = None,
        gate: Gate | None = None,
    ) -> Self:
        """Script an HTTP error with OpenAI's error body (and `Retry-After` when given)."""
        if status < 400:
            raise ValueError(f"error status must be >= 400, got {status}")
        answer = Answer(status=status, error_message=message, retry_after=retry_after)
        return self._push(answer, gate)

    def respond_with(self, responder: Responder, *, gate: Gate | None = None) -> Self:
        """Answer with `responder(request_json)` whenever the script is empty."""
        self._default = _Default(responder, self._gate(gate))
        return self

    def echo(self, *, gate: Gate | None = None) -> Self:
        """Reply "echo: <last user text>" whenever the script is empty (benchmarks, smoke tests)."""
        return self.respond_with(echo, gate=gate)

    @property
    def pending(self) -> int:
        """Scripted answers not yet used."""
        return len(self._script)

    def _gate(self, gate: Gate | None) -> Gate | None:
        """The gate of the answer being scripted: the given one, else the one `hold()` made."""
        pending, self._pending_gate = self._pending_gate, None
        return gate or pending

    def _push(self, answer: Answer, gate: Gate | None) -> Self:
        self._script.append(_Scripted(answer, self._gate(gate)))
        return self

    def _make_call(self, name: str, arguments: ToolArgs, call_id: str | None) -> ToolCall:
        args = arguments if isinstance(arguments, str) else json.dumps(dict(arguments))
        return ToolCall(id=call_id or self._next_call_id(), name=name, arguments=args)

    def _next_call_id(self) -> str:
        return f"call_{next(self._counters.call_ids):04d}"

    # -- inspection -----------------------------------------------------------------------------

    @property
    def calls(self) -> int:
        """Number of chat requests received (expected or not)."""
        return len(self.requests)

    @property
    def in_flight(self) -> int:
        """Chat requests received and not yet fully answered (a held one stays in flight)."""
        return self._in_flight

    @property
    def last_request(self) -> JSON:
        if not self.requests:
            raise AssertionError("ScriptedLLM received no request")
        return self.requests[-1]

    async def wait_for_requests(self, n: int, timeout: float = 10.0) -> None:  # noqa: ASYNC109
        """Wait until at least `n` chat requests arrived; TimeoutError says how many did.

        Takes `timeout` (unlike ASYNC109 advises) so a forgotten request fails with a count;
        it is a safety cap, never what decides an outcome.
        """
        await self._wait(lambda: len(self.requests) >= n, timeout,
                         lambda: f"expected {n} request(s) within {timeout}s, "
                                 f"got {len(self.requests)}")

    async def wait_in_flight(self, n: int, timeout: float = 10.0) -> None:  # noqa: ASYNC109
        """Wait until at least `n` chat requests are in flight at once.

        With their answers held, this proves the client sends them concurrently.
        """
        await self._wait(lambda: self._in_flight >= n, timeout,
                         lambda: f"expected {n} request(s) in flight within {timeout}s, "
                                 f"got {self._in_flight} (of {len(self.requests)} received)")

    async def _wait(self, done: Callable[[], bool], timeout: float,
                    describe: Callable[[], str]) -> None:
        try:
            async with asyncio.timeout(timeout):
                while not done():
                    self._changed.clear()
                    await self._changed.wait()
        except TimeoutError:
            raise TimeoutError(describe()) from None

    def assert_all_used(self) -> None:
        """Fail when script items are left over, a request was unexpected or a responder raised."""
        problems = []
        if self._script:
            problems.append(f"{len(self._script)} scripted answer(s) never requested")
        if self.unexpected:
            last = last_user_text(self.unexpected[-1].get("messages"))
            problems.append(
                f"{len(self.unexpected)} unexpected request(s); last user text: {last!r}"
            )
        if self.responder_errors:
            problems.append(f"responder raised {self.responder_errors[-1]!r}")
        if problems:
            raise AssertionError("ScriptedLLM: " + "; ".join(problems))

    # -- HTTP -----------------------------------------------------------------------------------

    async def _handle_models(self, request: web.Request) -> web.Response:
        return json_response(models_list(self._models))

    async def _handle_chat(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        try:
            body = parse_request(raw)
        except ValueError as exc:
            self._record({"_invalid_body": raw.decode("utf-8", "replace")}, request,
                         unexpected=True)
            return error_response(400, f"invalid JSON body: {exc}")

        source = self._script.popleft() if self._script else self._default
        self._record(body, request, unexpected=source is None)
        if source is None:
            _log.warning("ScriptedLLM: unexpected request #%d", len(self.requests))
            return error_response(500, "ScriptedLLM: unexpected request (script empty)")

        self._in_flight += 1
        self._changed.set()
        try:
            return await self._answer(request, source, body, prompt_bytes=len(raw))
        finally:
            self._in_flight -= 1
            self._changed.set()

    async def _answer(self, request: web.Request, source: _Scripted | _Default, body: JSON, *,
                      prompt_bytes: int) -> web.StreamResponse:
        """Wait at the answer's gate, then send it (a default responder runs after the gate)."""
        if source.gate is not None and await self._held(source.gate):
            return error_response(503, "ScriptedLLM: server stopping")
        pauses = None
        if isinstance(source, _Scripted):
            answer = source.answer
            pauses = source.pauses
        else:
            try:
                answer = await self._from_responder(source.responder, body)
            except Exception as exc:  # a test's bug: report it in assert_all_used
                _log.exception("ScriptedLLM: responder failed")
                self.responder_errors.append(exc)
                return error_response(500, f"ScriptedLLM: responder failed: {exc!r}")
        return await self._send(request, answer, body, prompt_bytes=prompt_bytes,
                                pauses=pauses)

    async def _send(self, request: web.Request, answer: Answer, body: JSON, *,
                    prompt_bytes: int,
                    pauses: Mapping[int, Gate] | None = None) -> web.StreamResponse:
        if answer.status != 200:
            return error_response(answer.status, answer.error_message, answer.retry_after)
        model = str(body.get("model", "unknown"))
        usage = usage_of(answer, prompt_bytes=prompt_bytes)
        completion_id = f"chatcmpl-scripted-{next(self._counters.completions)}"
        if body.get("stream") and not answer.whole:
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            events = stream_events(answer, model, completion_id, usage,
                                   include_usage=include_usage)

            async def pause(i: int) -> None:  # event 0 opens the message; i is piece i
                gate = (pauses or {}).get(i)
                if gate is not None:
                    await self._held(gate)

            return await send_stream(request, events, pause=pause if pauses else None)
        return json_response(completion(answer, model, completion_id, usage))

    def _record(self, body: JSON, request: web.Request, *, unexpected: bool) -> None:
        """Record synchronously, so `requests` order matches the order script items were taken."""
        self.requests.append(body)
        self.request_headers.append({k.lower(): v for k, v in request.headers.items()})
        if unexpected:
            self.unexpected.append(body)
        self._changed.set()

    async def _from_responder(self, responder: Responder, body: JSON) -> Answer:
        result = responder(body)
        if inspect.isawaitable(result):
            result = await result
        return answer_from(result, self._make_call)

    async def _held(self, gate: Gate) -> bool:
        """Wait until the gate opens or the server stops; True means it is stopping."""
        if gate.released:
            return False
        opened = asyncio.ensure_future(gate.wait())
        stopping = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait({opened, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            opened.cancel()
            stopping.cancel()
        return not gate.released
