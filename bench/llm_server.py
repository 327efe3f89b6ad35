"""The scripted model server in its own process: ``python -m bench.llm_server``.

Prints one JSON line ``{"base_url", "control"}`` and serves until SIGTERM or SIGINT. Answers
``POST <base_url>/chat/completions`` (plain JSON, or server-sent events for ``"stream": true``,
with a usage chunk when ``stream_options.include_usage`` asks for one) and
``GET <base_url>/models``, in the shapes ``tests/fakes/openai_wire.py`` gives them:

- the last message is a tool result → a short text answer (the end of a one-tool turn);
- the last user text starts with ``tool:`` → one ``list_dir {"path": "."}`` call;
- anything else → ``echo: <last user text>``, cut to ``MAX_ANSWER_CHARS`` as a model that
  follows a prompt's length limit would (the gateway's compaction asks for a summary of at
  most N words; an echo of the whole transcript would grow the summary with every compaction).

``GET <control>/last`` returns the last request's parsed body, its size in bytes (its
``Content-Length``) and the number of requests answered so far; ``GET <control>/recent?n=``
the last ``n`` (≤ ``KEEP``) of them, oldest first. Only the raw bytes of the last ``KEEP``
requests are kept, parsed again when asked for: over ten thousand turns every parsed body
would be hundreds of MB.

Why not ``ScriptedLLM`` on aiohttp: the benchmark's helpers share one CPU, and aiohttp's
request, response and router objects cost ~0.8 ms of CPU a call, enough to make this server
the ceiling of the gateway's throughput. Here each request is read by httptools (llhttp, in C)
in an ``asyncio.Protocol`` and answered at once, in the same callback, with one write:
nothing in a script waits, so there are no tasks and no timers. ``uvloop`` runs the loop when
it is importable, and orjson reads and writes the JSON.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import signal
import time
from collections import deque
from collections.abc import Callable
from email.utils import formatdate
from http import HTTPStatus
from typing import Any, cast
from urllib.parse import parse_qsl

import httptools
import orjson

TOOL_PREFIX = "tool:"
KEEP = 8
MAX_ANSWER_CHARS = 2000
MAX_BODY = 64 * 1024 * 1024
"""A request body may be this large (``ScriptedLLM``'s ``client_max_size``); more is 413."""
MODELS = ("bench-model",)
STREAM_PIECES = 3

JSON = dict[str, Any]
Reply = tuple[int, bytes, bytes]
"""(status, header lines naming the body's type, body)."""
JSON_HEAD = b"Content-Type: application/json\r\n"
SSE_HEAD = b"Content-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
SSE_DONE = b"data: [DONE]\n\n"


# -- the script ----------------------------------------------------------------------------------

def _text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def answer(body: dict[str, Any]) -> str | dict[str, Any]:
    """The scripted answer to a request: a str is a text reply; a dict an assistant message
    with OpenAI-shaped ``tool_calls`` (``arguments`` as a dict)."""
    messages = body.get("messages") or [{}]
    last = messages[-1]
    if last.get("role") == "tool":
        return f"done: the folder listing had {len(_text(last))} characters"
    text = _text(last)
    if text.startswith(TOOL_PREFIX):
        return {"tool_calls": [{"function": {"name": "list_dir", "arguments": {"path": "."}}}]}
    return f"echo: {text[:MAX_ANSWER_CHARS]}"


# -- OpenAI's shapes (as tests/fakes/openai_wire.py builds them) --------------------------------

def _split(text: str) -> list[str]:
    """A few fragments, so a client must really reassemble the stream."""
    if not text:
        return []
    size = max(1, -(-len(text) // STREAM_PIECES))
    return [text[i:i + size] for i in range(0, len(text), size)]


def _error(status: int, message: str) -> Reply:
    """OpenAI's error body: the request's fault (4xx) or the server's (5xx)."""
    kind = "server_error" if status >= 500 else "invalid_request_error"
    payload = {"error": {"message": message, "type": kind, "param": None, "code": None}}
    return status, JSON_HEAD, orjson.dumps(payload)


def _parse(raw: bytes) -> JSON:
    """The body as a JSON object; ValueError when it is not one. orjson first; ``json`` when
    orjson refuses what ``json`` reads (lone surrogates, integers past 64 bits)."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        body = json.loads(raw)
    if not isinstance(body, dict):
        raise ValueError("body is not a JSON object")
    return body


class Model:
    """The chat endpoint's state: the ids it numbers, the requests it keeps."""

    def __init__(self) -> None:
        self.count = 0
        """Chat requests answered by the script."""
        self.kept: deque[bytes] = deque(maxlen=KEEP)
        """The raw bodies of the last ``KEEP`` chat requests."""
        self._completions = itertools.count(1)
        self._calls = itertools.count(1)

    def chat(self, raw: bytes) -> Reply:
        self.kept.append(raw)
        try:
            body = _parse(raw)
        except ValueError as exc:
            return _error(400, f"invalid JSON body: {exc}")
        self.count += 1
        try:
            result = answer(body)
        except Exception as exc:  # a request the script cannot read: ScriptedLLM's 500
            return _error(500, f"ScriptedLLM: responder failed: {exc!r}")
        if isinstance(result, str):
            content: str | None = result
            calls: list[JSON] = []
        else:
            content = result.get("content")
            calls = [{"id": c.get("id") or f"call_{next(self._calls):04d}", "type": "function",
                      "function": {"name": c["function"]["name"],
                                   "arguments": self._arguments(c["function"])}}
                     for c in result.get("tool_calls") or ()]
        if calls:
            reply_len = sum(len(c["function"]["name"]) + len(c["function"]["arguments"])
                            for c in calls)
        else:
            reply_len = len(content or "")
        prompt, completion = max(1, len(raw) // 4), max(1, reply_len // 4)
        usage = {"prompt_tokens": prompt, "completion_tokens": completion,
                 "total_tokens": prompt + completion}
        base = {"id": f"chatcmpl-scripted-{next(self._completions)}", "created": int(time.time()),
                "model": str(body.get("model", "unknown")), "system_fingerprint": "fp_scripted"}
        finish = "tool_calls" if calls else "stop"
        if body.get("stream"):
            options = body.get("stream_options") or {}
            return 200, SSE_HEAD, _events(base, content, calls, finish, usage,
                                              bool(options.get("include_usage")))
        message: JSON = {"role": "assistant", "content": content, "refusal": None}
        if calls:
            message["content"] = content or None
            message["tool_calls"] = calls
        return 200, JSON_HEAD, orjson.dumps({
            "id": base["id"], "object": "chat.completion", "created": base["created"],
            "model": base["model"], "system_fingerprint": "fp_scripted",
            "choices": [{"index": 0, "message": message, "logprobs": None,
                         "finish_reason": finish}],
            "usage": usage})

    @staticmethod
    def _arguments(function: JSON) -> str:
        """Arguments as OpenAI sends them, a JSON string (``json.dumps``, as ScriptedLLM)."""
        arguments = function.get("arguments", {})
        return arguments if isinstance(arguments, str) else json.dumps(dict(arguments))

    def last(self) -> JSON:
        if not self.kept:
            return {"body": None, "bytes": 0, "count": self.count}
        return {**_kept(self.kept[-1]), "count": self.count}

    def recent(self, n: int) -> JSON:
        return {"requests": [_kept(raw) for raw in list(self.kept)[-min(n, KEEP):]],
                "count": self.count}


def _kept(raw: bytes) -> JSON:
    """A kept request as the control endpoints show it (an unreadable body as ScriptedLLM
    recorded it)."""
    try:
        body: JSON = _parse(raw)
    except ValueError:
        body = {"_invalid_body": raw.decode("utf-8", "replace")}
    return {"body": body, "bytes": len(raw)}


def _events(base: JSON, content: str | None, calls: list[JSON], finish: str, usage: JSON,
            include_usage: bool) -> bytes:
    """The server-sent events of a streamed answer, ``data: [DONE]`` last."""
    deltas: list[JSON]
    if not calls:
        deltas = [{"role": "assistant", "content": "", "refusal": None},
                  *({"content": piece} for piece in _split(content or ""))]
    else:
        deltas = []
        if content:
            deltas.append({"role": "assistant", "content": content, "refusal": None})
        for index, call in enumerate(calls):
            function = call["function"]
            opening: JSON = {"tool_calls": [{
                "index": index, "id": call["id"], "type": "function",
                "function": {"name": function["name"], "arguments": ""}}]}
            if index == 0:
                opening = {"role": "assistant", "content": None, **opening}
            deltas.append(opening)
            deltas.extend({"tool_calls": [{"index": index, "function": {"arguments": piece}}]}
                          for piece in _split(function["arguments"]))
    head = {"id": base["id"], "object": "chat.completion.chunk", "created": base["created"],
            "model": base["model"], "system_fingerprint": "fp_scripted"}
    extra: JSON = {"usage": None} if include_usage else {}

    def event(choices: list[JSON], **more: Any) -> bytes:
        return b"data: " + orjson.dumps({**head, "choices": choices, **extra, **more}) + b"\n\n"

    events = [event([{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}])
              for delta in deltas]
    events.append(event([{"index": 0, "delta": {}, "logprobs": None, "finish_reason": finish}]))
    if include_usage:
        events.append(event([], usage=usage))
    events.append(SSE_DONE)
    return b"".join(events)


# -- HTTP/1.1 -------------------------------------------------------------------------------------

Route = Callable[[bytes, dict[str, str]], Reply]
"""An answer from the request's body and query."""
Routes = dict[tuple[bytes, bytes], Route]
"""(method, path) → route."""

_REASONS = {s.value: s.phrase.encode() for s in HTTPStatus}
_date_cache: list[Any] = [0, b""]


def _date() -> bytes:
    now = int(time.time())
    if _date_cache[0] != now:
        _date_cache[0], _date_cache[1] = now, formatdate(now, usegmt=True).encode()
    return cast(bytes, _date_cache[1])


def _encode(reply: Reply, keep_alive: bool) -> bytes:
    """The whole answer as one byte string. A stream too: every event is ready at once, and
    ``Content-Length`` frames it as well as chunks would (clients read events, not writes)."""
    status, head, body = reply
    return b"HTTP/1.1 %d %s\r\n%sContent-Length: %d\r\nDate: %s\r\n%s\r\n%s" % (
        status, _REASONS.get(status, b"Unknown"), head, len(body), _date(),
        b"" if keep_alive else b"Connection: close\r\n", body)


class _Connection(asyncio.Protocol):
    """One keep-alive connection. Each request is answered as soon as its last byte is read,
    so pipelined requests are answered in order without a queue."""

    def __init__(self, routes: Routes, connections: set[_Connection]) -> None:
        self.routes = routes
        self.connections = connections
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.url = b""
        self.body: list[bytes] = []
        self.size = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses
        self.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.connections.discard(self)
        self.transport = None

    def pause_writing(self) -> None:  # a client that does not read its answers: stop reading
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.transport is not None:
            self.transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:  # too large (raised in on_body)
            self._refuse(_error(413, f"body: larger than {MAX_BODY} bytes")
                         if isinstance(exc.__context__, OverflowError)
                         else _error(500, f"reading the request failed: {exc.__context__!r}"))
        except httptools.HttpParserUpgrade:
            self._refuse(_error(400, "request: protocol upgrades are not supported"))
        except httptools.HttpParserError as exc:
            self._refuse(_error(400, f"request: not valid HTTP/1.1 ({exc})"))

    # httptools' callbacks (only those defined are called)

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_body(self, body: bytes) -> None:
        self.size += len(body)
        if self.size > MAX_BODY:
            raise OverflowError
        self.body.append(body)

    def on_message_complete(self) -> None:
        url, body = self.url, self.body
        self.url, self.body, self.size = b"", [], 0  # the next request's
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        path, _, query = url.partition(b"?")
        route = self.routes.get((self.parser.get_method(), path))
        if route is None:
            known = any(p == path for _, p in self.routes)
            reply = _error(405 if known else 404, f"no route for {url.decode('latin-1')}")
        else:
            raw = body[0] if len(body) == 1 else b"".join(body)
            try:
                params = dict(parse_qsl(query.decode(), keep_blank_values=True)) if query else {}
                reply = route(raw, params)
            except ValueError as exc:  # the request's own fault: its query or body
                reply = _error(400, str(exc))
        keep_alive = self.parser.should_keep_alive()
        transport.write(_encode(reply, keep_alive))
        if not keep_alive:
            transport.close()

    def _refuse(self, reply: Reply) -> None:
        """Answer a request this server cannot read, and close: what follows is not read."""
        transport = self.transport
        if transport is not None and not transport.is_closing():
            transport.write(_encode(reply, keep_alive=False))
            transport.close()


def _json_reply(payload: JSON) -> Reply:
    """A control or listing answer: rare, so the standard library's json is fast enough and
    writes what orjson would refuse (a lone surrogate the gateway sent)."""
    return 200, JSON_HEAD, json.dumps(payload).encode()


def routes(model: Model) -> tuple[Routes, Routes]:
    """The model's routes (under ``/v1`` and bare, as ScriptedLLM) and the control routes."""
    created = int(time.time())
    models = _json_reply({"object": "list", "data": [
        {"id": m, "object": "model", "created": created, "owned_by": "parley-tests"}
        for m in MODELS]})
    api: Routes = {}
    for prefix in (b"/v1", b""):
        api[b"POST", prefix + b"/chat/completions"] = lambda raw, query: model.chat(raw)
        api[b"GET", prefix + b"/models"] = lambda raw, query: models
    control: Routes = {
        (b"GET", b"/last"): lambda raw, query: _json_reply(model.last()),
        (b"GET", b"/recent"): lambda raw, query: _json_reply(
            model.recent(int(query.get("n", "2")))),
    }
    return api, control


async def serve() -> None:
    loop = asyncio.get_running_loop()
    model = Model()
    api, control = routes(model)
    connections: set[_Connection] = set()

    async def listen(table: Routes) -> asyncio.Server:
        return await loop.create_server(lambda: _Connection(table, connections), "127.0.0.1",
                                        0, backlog=1024)

    servers = [await listen(api), await listen(control)]
    api_port, control_port = (int(s.sockets[0].getsockname()[1]) for s in servers)
    print(json.dumps({"base_url": f"http://127.0.0.1:{api_port}/v1",
                      "control": f"http://127.0.0.1:{control_port}"}), flush=True)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        for server in servers:
            server.close()
        for conn in list(connections):
            if conn.transport is not None:
                conn.transport.abort()


def main() -> None:
    try:
        import uvloop
    except ImportError:
        asyncio.run(serve())
    else:
        uvloop.run(serve())


if __name__ == "__main__":
    main()
