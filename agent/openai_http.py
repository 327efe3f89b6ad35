"""OpenAI-compatible chat completions, for ``openai/<name>`` at an ``api_base``.

Ollama, vLLM, LM Studio, llama.cpp and most hosted gateways speak this one protocol, so there is
nothing for litellm to translate. Going through litellm costs ~3 ms of CPU per call (its logging
object, response metadata and cost lookup; measured in ``bench/``), which was half of what the
gateway spent on a turn; this client posts the body ``Provider`` already built and reads the
answer (plain JSON or server-sent events) over ``agent/http1.py``'s keep-alive connections,
~0.1 ms, or through aiohttp when the environment names a proxy for the server. Errors map onto
the same ``ProviderError`` tree as litellm's, so retries, fallbacks and what the user is told
do not depend on the route.
``agent.transport: litellm`` sends these models through litellm as well.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from collections.abc import AsyncIterator, Callable
from typing import Any
from urllib.parse import unquote, urlsplit

import aiohttp
import orjson

from agent import http1
from agent.errors import (
    ProviderAuthError,
    ProviderBadRequest,
    ProviderContextTooLarge,
    ProviderError,
    ProviderUnavailable,
)
from agent.llm_types import (
    EncodedSpan,
    LLMResponse,
    StreamAssembler,
    ToolCall,
    without_reasoning,
)
from gateway.kernel.store_db import load_json

MAX_BODY_BYTES = 32 * 1024 * 1024
"""A reply larger than this is refused: no chat answer is that big, a broken server might be."""
MAX_ERROR_CHARS = 300
# The wordings servers use for "your prompt is larger than my window" (OpenAI, vLLM, llama.cpp,
# Ollama, LM Studio, TGI, OpenRouter); matched lower-cased anywhere in an error body.
CONTEXT_SIGNS = (
    "maximum context length", "context length", "context_length_exceeded", "context window",
    "prompt is too long", "input is too long", "too many tokens", "too many input tokens",
    "exceeds the available context", "exceed_context_size", "longer than the model's maximum",
)


_TLS: ssl.SSLContext | None = None


def env_proxy(url: str) -> tuple[Any, aiohttp.BasicAuth | None]:
    """The proxy the environment names for ``url`` (none when ``NO_PROXY`` covers it)."""
    from aiohttp.helpers import get_env_proxy_for_url
    from yarl import URL

    try:
        return get_env_proxy_for_url(URL(url))
    except LookupError:
        return None, None


def tls_context() -> ssl.SSLContext:
    """The system's trusted CAs (and ``SSL_CERT_FILE``/``SSL_CERT_DIR``), plus certifi's
    bundle, which the SDKs ship with: a slim container without CA certificates still
    reaches a hosted OpenAI-compatible API."""
    global _TLS
    if _TLS is None:
        context = ssl.create_default_context()
        try:
            import certifi

            context.load_verify_locations(certifi.where())
        except (ImportError, OSError):
            pass
        _TLS = context
    return _TLS


class OpenAIHTTP:
    """One connection pool per provider; created in the loop that first calls it."""

    def __init__(self, api_base: str, api_key: str | None, timeout: float) -> None:
        base = api_base.rstrip("/")
        url = base if base.endswith("/chat/completions") else f"{base}/chat/completions"
        self.url = _without_credentials(url)
        """Also what errors show: a user:password in ``api_base`` stays out of logs and
        chats."""
        parts = urlsplit(url)
        if parts.username is not None or parts.password is not None:
            # A server behind a proxy's basic auth: that is the authorization it takes.
            auth = aiohttp.encode_basic_auth(unquote(parts.username or ""),
                                             unquote(parts.password or ""))
        else:  # local servers rarely check keys; send one anyway, as the SDKs do
            auth = f"Bearer {api_key or 'not-needed'}"
        self._headers = {"Content-Type": "application/json", "Accept": "application/json",
                         "Authorization": auth}
        self._timeout = aiohttp.ClientTimeout(total=None, sock_connect=timeout,
                                              sock_read=timeout)
        self._seconds = timeout
        """The direct route's connect and read timeouts (aiohttp's: ``_timeout``)."""
        self._session: aiohttp.ClientSession | None = None
        self._origin: http1.Origin | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._completion_tokens_models: set[str] = set()
        self._proxy, self._proxy_auth = env_proxy(url)
        """``HTTPS_PROXY``/``HTTP_PROXY``/``NO_PROXY`` read once: aiohttp's ``trust_env``
        looks them (and ``~/.netrc``) up again on a worker thread for every request, two
        thread hops and ~0.3 ms of CPU per model call (``bench/``)."""

    def _client(self) -> aiohttp.ClientSession:
        session, loop = self._session, asyncio.get_running_loop()
        if session is None or session.closed or self._loop is not loop:  # an earlier loop's
            self._loop = loop
            session = self._session = aiohttp.ClientSession(
                timeout=self._timeout, trust_env=False,
                connector=aiohttp.TCPConnector(limit=100, ssl=tls_context()))
        return session

    def _direct(self) -> http1.Origin:
        origin, loop = self._origin, asyncio.get_running_loop()
        if origin is None or origin.closed or origin.loop is not loop:  # an earlier loop's
            origin = self._origin = http1.Origin(
                self.url, self._headers, tls=tls_context() if self.url.startswith("https:")
                else None, connect_timeout=self._seconds, read_timeout=self._seconds)
        return origin

    def _open(self, data: bytes) -> Any:
        """``async with`` it: the answer, read through ``chunks()`` whichever way it came."""
        if self._proxy is None:
            return self._direct().post(data)
        return _Proxied(self._client().post(self.url, data=data, headers=self._headers,
                                            proxy=self._proxy, proxy_auth=self._proxy_auth))

    async def aclose(self) -> None:
        session, self._session = self._session, None
        if session is not None and not session.closed:
            await session.close()
        origin, self._origin = self._origin, None
        if origin is not None:
            await origin.aclose()

    async def complete(self, body: dict[str, Any], model: str,
                       on_text: Callable[[str], None] | None = None,
                       encoded: EncodedSpan | None = None) -> LLMResponse:
        """POST ``body`` (``model`` is the configured name, for errors and the answer).

        OpenAI's reasoning models refuse ``max_tokens`` and want ``max_completion_tokens``;
        a server that says so gets the request again with that name, and from then on."""
        if body["model"] in self._completion_tokens_models and "max_tokens" in body:
            body = {**body, "max_completion_tokens": body["max_tokens"]}
            del body["max_tokens"]
        try:
            return await self._post(body, model, on_text, encoded)
        except ProviderBadRequest as exc:
            if "max_completion_tokens" not in str(exc) or "max_tokens" not in body:
                raise
        self._completion_tokens_models.add(body["model"])
        return await self.complete(body, model, on_text, encoded)

    async def _post(self, body: dict[str, Any], model: str,
                    on_text: Callable[[str], None] | None,
                    encoded: EncodedSpan | None = None) -> LLMResponse:
        started = time.perf_counter()
        data = encode_body(body, encoded)
        try:
            async with self._open(data) as resp:
                if resp.status >= 400:
                    raw = await _read(resp, 64 * 1024, truncate=True)
                    if resp.status in (404, 405) and b"model" not in raw.lower():
                        # Nothing answers at this path (not "no such model"): the usual
                        # cause is an api_base without its /v1.
                        raise ProviderBadRequest(
                            f"{self.url} answered {resp.status} ({_error_text(raw)}); check "
                            "agent.api_base: most servers want it to end in /v1", model=model)
                    raise _status_error(resp.status, raw, resp.headers, model)
                # Some proxies stream whatever was asked, others answer a stream request
                # with one JSON body: read what came, not what was asked.
                if _is_stream(resp, body):
                    assembler = StreamAssembler(on_text)
                    async for event in _sse_events(resp):
                        _stream_event(assembler, event, model)
                    return assembler.result(model, (time.perf_counter() - started) * 1000)
                payload = _json(await _read(resp, MAX_BODY_BYTES), model)
                answer = _from_payload(payload, model, started)
                if on_text is not None and answer.content and not answer.tool_calls:
                    on_text(answer.content)
                return answer
        except ProviderError:
            raise
        except (TimeoutError, aiohttp.ServerTimeoutError) as exc:
            raise ProviderUnavailable("timed out", model=model, cause="timeout") from exc
        except (aiohttp.ClientConnectorCertificateError,
                ssl.SSLCertVerificationError) as exc:  # retrying cannot help
            why = getattr(exc, "certificate_error", exc)
            why = getattr(why, "verify_message", None) or why
            raise ProviderError(
                f"the TLS certificate of {self.url} is not trusted "
                f"({why}); if the server uses a private CA, point "
                "SSL_CERT_FILE at it", model=model
            ) from exc
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, OSError) as exc:
            raise ProviderUnavailable("connection failed", model=model) from exc
        except http1.HTTPError as exc:  # an answer that is not HTTP, a corrupt compression
            raise ProviderUnavailable(str(exc), model=model, cause="server_error") from exc
        except aiohttp.ClientError as exc:
            raise ProviderUnavailable(f"{type(exc).__name__}: {exc}", model=model,
                                      cause="server_error") from exc


class _Proxied:
    """An aiohttp answer (the proxy route) read the way ``http1.Response`` is."""

    def __init__(self, request: Any) -> None:
        self._request = request
        self.status = 0
        self.headers: Any = None
        self.content_type = ""
        self._resp: aiohttp.ClientResponse | None = None

    async def __aenter__(self) -> _Proxied:
        self._resp = resp = await self._request.__aenter__()
        self.status, self.headers, self.content_type = resp.status, resp.headers, \
            resp.content_type
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self._request.__aexit__(*exc)

    def chunks(self) -> AsyncIterator[bytes]:
        assert self._resp is not None
        return self._resp.content.iter_any()


def _is_stream(resp: Any, body: dict[str, Any]) -> bool:
    """Server-sent events: said so by the content type; a stream request answered with no
    type that names JSON is read as events too (what most servers that stream send)."""
    kind = resp.content_type
    if kind == "text/event-stream":
        return True
    return bool(body.get("stream")) and "json" not in kind


def _without_credentials(url: str) -> str:
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    host = f"[{host}]" if ":" in host else host
    return parts._replace(netloc=f"{host}:{parts.port}" if parts.port else host).geturl()


async def _read(resp: Any, limit: int, *, truncate: bool = False) -> bytes:
    chunks: list[bytes] = []
    size = 0
    async for chunk in resp.chunks():
        size += len(chunk)
        chunks.append(chunk)
        if size > limit:
            if truncate:
                break
            raise ProviderUnavailable(f"the answer was larger than {limit // 1024 // 1024} MB",
                                      cause="server_error")
    return b"".join(chunks)


async def _sse_events(resp: Any) -> AsyncIterator[dict[str, Any]]:
    """The ``data:`` payloads of a server-sent event stream, up to ``[DONE]``. Lines are split
    here, not by aiohttp's readline, whose 128 KB line limit a one-chunk tool call can pass."""
    buffer = b""
    size = 0
    async for chunk in resp.chunks():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise ProviderUnavailable("the streamed answer was larger than 32 MB",
                                      cause="server_error")
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            data = _sse_data(line)
            if data == b"[DONE]":
                return
            if data:
                yield _json(data, None)
    data = _sse_data(buffer)  # a last event the server did not end with a newline
    if data and data != b"[DONE]":
        yield _json(data, None)


def _sse_data(line: bytes) -> bytes | None:
    """A ``data:`` line's payload; None for blank separators, ``: keep-alive`` comments and
    ``event:`` names."""
    line = line.strip()
    return line[5:].strip() if line.startswith(b"data:") else None


def _stream_event(assembler: StreamAssembler, event: dict[str, Any], model: str) -> None:
    if "error" in event:
        raise _status_error(None, json.dumps(event).encode(), None, model)
    usage = event.get("usage")
    if isinstance(usage, dict):
        assembler.usage(usage.get("prompt_tokens"), usage.get("completion_tokens"))
    for choice in (event.get("choices") or ())[:1]:
        delta = choice.get("delta") or {}
        calls = [(tc.get("index"), tc.get("id"), (tc.get("function") or {}).get("name"),
                  (tc.get("function") or {}).get("arguments"))
                 for tc in delta.get("tool_calls") or ()]
        assembler.delta(choice.get("finish_reason"), _text(delta.get("content")), calls)


def _json(raw: bytes, model: str | None) -> dict[str, Any]:
    try:
        value = load_json(raw)
    except (ValueError, RecursionError) as exc:
        raise ProviderUnavailable("the server's answer is not JSON", model=model,
                                  cause="server_error") from exc
    if not isinstance(value, dict):
        raise ProviderUnavailable("the server's answer is not a JSON object", model=model,
                                  cause="server_error")
    return value


def _text(content: Any) -> str | None:
    """``content`` as text: a string, or the text parts of a list some servers send."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict)) or None
    return str(content)


def _arguments(value: Any) -> str:
    if value is None or value == "":
        return "{}"
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _from_payload(payload: dict[str, Any], model: str, started: float) -> LLMResponse:
    if "error" in payload:  # some servers answer 200 with an error object
        raise _status_error(None, json.dumps(payload).encode(), None, model)
    choices = payload.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise ProviderUnavailable("the server's answer has no choices", model=model,
                                  cause="server_error")
    choice = choices[0]
    message = choice.get("message") or {}
    calls = tuple(
        ToolCall(id=c.get("id") or f"call_{i}", name=(c.get("function") or {}).get("name") or "",
                 arguments=_arguments((c.get("function") or {}).get("arguments")))
        for i, c in enumerate(message.get("tool_calls") or ()) if isinstance(c, dict))
    usage = payload.get("usage")
    usage = usage if isinstance(usage, dict) else {}
    return LLMResponse(
        content=without_reasoning(_text(message.get("content"))), tool_calls=calls,
        model=payload.get("model") or model, finish_reason=choice.get("finish_reason"),
        prompt_tokens=int(usage.get("prompt_tokens") or 0),
        completion_tokens=int(usage.get("completion_tokens") or 0),
        latency_ms=(time.perf_counter() - started) * 1000)


def _error_text(raw: bytes) -> str:
    text = raw.decode("utf-8", "replace").strip()
    try:
        body = json.loads(text)
    except ValueError:
        body = None
    if isinstance(body, dict):
        error = body.get("error", body)
        if isinstance(error, dict):
            error = error.get("message") or error.get("detail") or error
        elif "detail" in body and error is body:
            error = body["detail"]
        text = error if isinstance(error, str) else json.dumps(error)
    text = " ".join(text.split()) or "no details"
    return text if len(text) <= MAX_ERROR_CHARS else text[:MAX_ERROR_CHARS - 3] + "..."


def _retry_after(headers: Any) -> float | None:
    value = headers.get("retry-after") if headers is not None else None
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:  # an HTTP date: rare from model servers; back off as usual
        return None


def _status_error(status: int | None, raw: bytes, headers: Any, model: str) -> ProviderError:
    text = _error_text(raw)
    if status in (401, 403):
        return ProviderAuthError(text, model=model)
    if status == 429:
        return ProviderUnavailable("rate limited (429)", model=model,
                                   retry_after=_retry_after(headers), cause="rate_limited")
    if status == 413 or any(sign in text.lower() for sign in CONTEXT_SIGNS):
        return ProviderContextTooLarge(text, model=model)
    if status == 408:
        return ProviderUnavailable("timed out", model=model, cause="timeout")
    if status is not None and 400 <= status < 500:
        return ProviderBadRequest(text, model=model)
    detail = f"server error {status}" if status else f"the server reported an error: {text}"
    return ProviderUnavailable(detail, model=model, cause="server_error")


# -- the request body --------------------------------------------------------------------------

def encode_body(body: dict[str, Any], encoded: EncodedSpan | None = None) -> bytes:
    """``body`` as compact UTF-8 JSON; orjson writes a long history in microseconds where
    ``json`` took a millisecond (bench/). ``encoded``: messages of ``body["messages"]``
    already written (``EncodedSpan``), copied in as they are: writing them again walked every
    message of the history, every turn, ~40 µs a turn at 200 messages in a busy gateway
    where the bytes copy in a few (bench/RESULTS.md, round seventeen)."""
    sent = body
    messages = body.get("messages")
    if encoded is not None and encoded.count and isinstance(messages, list) \
            and len(messages) >= encoded.start + encoded.count:
        end = encoded.start + encoded.count
        sent = {**body, "messages": [*messages[:encoded.start], orjson.Fragment(encoded.raw),
                                     *messages[end:]]}
    try:
        return orjson.dumps(sent)
    except TypeError:  # what orjson will not write (a key that is not a string, a huge int)
        return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()

