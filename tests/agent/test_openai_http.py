"""The direct OpenAI-compatible client against servers that misbehave in the ways real ones do:
answers that are not JSON, errors inside a 200, HTML error pages, huge one-line stream events,
keep-alive comments, CRLF line ends. (Well-behaved answers are covered on both routes in
``test_provider.py``.)"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from agent import openai_http
from agent.errors import (
    ProviderBadRequest,
    ProviderContextTooLarge,
    ProviderError,
    ProviderUnavailable,
)
from agent.provider import Provider
from gateway.kernel.config import AgentConfig

HELLO = [{"role": "user", "content": "héllo ✓"}]
ROOT = Path(__file__).resolve().parents[2]
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class RawServer:
    """Answers each POST with the next scripted handler; records bodies and headers."""

    def __init__(self) -> None:
        self.handlers: list[Handler] = []
        self.bodies: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.paths: list[str] = []
        self.base_url = ""

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.bodies.append(json.loads(await request.read()))
        self.headers.append(dict(request.headers))
        self.paths.append(request.path)
        return await self.handlers.pop(0)(request)


@pytest.fixture
async def raw() -> AsyncIterator[RawServer]:
    server = RawServer()
    app = web.Application()
    app.router.add_post("/{tail:.*}", server.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    server.base_url = f"http://127.0.0.1:{port}/v1"
    yield server
    await runner.cleanup()


@pytest.fixture
async def make(raw: RawServer) -> AsyncIterator[Callable[..., Provider]]:
    made: list[Provider] = []

    def build(**kw: Any) -> Provider:
        p = Provider(AgentConfig.model_validate({
            "model": "openai/m1", "api_base": raw.base_url, "retry_backoff": 0.001,
            "max_retries": 1, "timeout": 5, **kw}))
        made.append(p)
        return p

    yield build
    for p in made:
        await p.aclose()


def answer(payload: Any, status: int = 200, content_type: str = "application/json") -> Handler:
    async def handler(request: web.Request) -> web.Response:
        text = payload if isinstance(payload, str) else json.dumps(payload)
        return web.Response(status=status, text=text, content_type=content_type)
    return handler


def completion(message: dict[str, Any]) -> dict[str, Any]:
    return {"id": "x", "object": "chat.completion", "model": "m1",
            "choices": [{"index": 0, "message": {"role": "assistant", **message},
                         "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 2}}


def sse(events: list[bytes]) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for event in events:
            await resp.write(event)
        await resp.write_eof()
        return resp
    return handler


async def test_request_shape(raw: RawServer, make: Callable[..., Provider]) -> None:
    raw.handlers.append(answer(completion({"content": "ok"})))
    r = await make(temperature=0.2).complete(HELLO, max_tokens=77)
    assert r.content == "ok" and (r.prompt_tokens, r.completion_tokens) == (5, 2)
    body, headers = raw.bodies[0], raw.headers[0]
    assert body == {"model": "m1", "messages": HELLO, "max_tokens": 77, "temperature": 0.2}
    assert headers["Authorization"] == "Bearer not-needed"  # no key configured
    assert raw.paths == ["/v1/chat/completions"]


async def test_api_base_may_name_the_endpoint(raw: RawServer,
                                              make: Callable[..., Provider]) -> None:
    raw.handlers.append(answer(completion({"content": "ok"})))
    await make(api_base=raw.base_url + "/chat/completions/", api_key="k").complete(HELLO)
    assert raw.paths == ["/v1/chat/completions"]
    assert raw.headers[0]["Authorization"] == "Bearer k"


async def test_not_json_is_retried_then_told(raw: RawServer,
                                             make: Callable[..., Provider]) -> None:
    raw.handlers += [answer("<html>oops</html>", content_type="text/html")] * 2
    with pytest.raises(ProviderUnavailable) as info:
        await make().complete(HELLO)
    assert "not JSON" in str(info.value) and info.value.attempts == 2
    assert "kept failing" in info.value.user_message


async def test_html_error_page_is_a_server_error(raw: RawServer,
                                                 make: Callable[..., Provider]) -> None:
    raw.handlers += [answer("<h1>502 Bad Gateway</h1>", 502, "text/html"),
                     answer(completion({"content": "back"}))]
    r = await make().complete(HELLO)
    assert (r.content, r.attempts) == ("back", 2)


async def test_errors_inside_a_200_and_context_overflow(raw: RawServer,
                                                        make: Callable[..., Provider]) -> None:
    raw.handlers.append(answer({"error": {"message": "the request exceeds the available "
                                                     "context size, try increasing it"}}))
    with pytest.raises(ProviderContextTooLarge):
        await make().complete(HELLO)
    raw.handlers.append(answer("request entity too large", 413, "text/plain"))
    with pytest.raises(ProviderContextTooLarge):
        await make().complete(HELLO)
    raw.handlers.append(answer({"detail": [{"msg": "field required"}]}, 422))
    with pytest.raises(ProviderBadRequest) as bad:
        await make().complete(HELLO)
    assert "field required" in str(bad.value)


async def test_answer_shapes_some_servers_send(raw: RawServer,
                                               make: Callable[..., Provider]) -> None:
    raw.handlers.append(answer(completion({
        "content": [{"type": "text", "text": "two "}, {"type": "text", "text": "parts"}],
        "tool_calls": [{"id": "", "type": "function",
                        "function": {"name": "list_dir", "arguments": {"path": "."}}}]})))
    r = await make().complete(HELLO)
    assert r.content == "two parts"
    assert [(c.id, c.name, json.loads(c.arguments)) for c in r.tool_calls] == [
        ("call_0", "list_dir", {"path": "."})]
    raw.handlers.append(answer({"choices": []}))
    raw.handlers.append(answer({"choices": []}))
    with pytest.raises(ProviderUnavailable, match="no choices"):
        await make().complete(HELLO)


async def test_stream_with_a_huge_event_comments_and_crlf(raw: RawServer,
                                                          make: Callable[..., Provider]) -> None:
    big = "x" * 300_000  # one event larger than aiohttp's readline limit
    tool = {"choices": [{"index": 0, "delta": {"tool_calls": [{
        "index": 0, "id": "c1", "function": {"name": "write_file",
                                             "arguments": json.dumps({"content": big})}}]}}]}
    text = {"choices": [{"index": 0, "delta": {"content": "wr"}}]}
    text2 = {"choices": [{"index": 0, "delta": {"content": "iting"},
                          "finish_reason": "tool_calls"}]}
    usage = {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 4}}
    events = [b": keep-alive\r\n\r\n"]
    for event in (text, text2, tool, usage):
        data = b"data: " + json.dumps(event).encode() + b"\r\n\r\n"
        events += [data[:70_000], data[70_000:]] if len(data) > 70_000 else [data]
    events.append(b"data: [DONE]\r\n\r\n")
    raw.handlers.append(sse(events))
    r = await make(stream=True).complete(HELLO)
    assert raw.bodies[0]["stream"] is True
    assert raw.bodies[0]["stream_options"] == {"include_usage": True}
    assert r.content == "writing" and r.finish_reason == "tool_calls"
    assert json.loads(r.tool_calls[0].arguments)["content"] == big
    assert (r.prompt_tokens, r.completion_tokens) == (9, 4)


async def test_error_event_mid_stream(raw: RawServer, make: Callable[..., Provider]) -> None:
    bad = b'data: {"error": {"message": "model crashed"}}\n\n'
    raw.handlers += [sse([bad]), sse([bad])]
    with pytest.raises(ProviderUnavailable, match="model crashed"):
        await make(stream=True).complete(HELLO)


async def test_oversized_answer_is_refused(raw: RawServer, make: Callable[..., Provider],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(openai_http, "MAX_BODY_BYTES", 1024 * 1024)
    huge = completion({"content": "y" * (2 * 1024 * 1024)})
    raw.handlers += [answer(huge), answer(huge)]
    with pytest.raises(ProviderUnavailable, match="larger than 1 MB"):
        await make().complete(HELLO)


def test_a_direct_gateway_never_imports_litellm(tmp_path: Path) -> None:
    """A gateway whose model is OpenAI-compatible answers a turn without loading litellm
    (~2 s and ~160 MB); asking for the model's window reads litellm's map file instead."""
    code = f"""
import asyncio, sys
from gateway.app import Gateway
from gateway.kernel.config import parse_config
from tests.fakes.openai_server import ScriptedLLM

async def main():
    async with ScriptedLLM() as llm:
        llm.reply("hi")
        config = parse_config({{
            "workspace": {str(tmp_path / "ws")!r}, "data_dir": {str(tmp_path / "data")!r},
            "agent": {{"model": "openai/gpt-4o-mini", "api_base": llm.base_url}},
            "channels": {{"local": {{"port": 0}}}}}}, env={{}})
        async with Gateway(config) as gw:
            print(await gw.local.ask("c1", "hello", timeout=10))
            print(gw.agent.context.max_context_tokens)
    print("litellm" in sys.modules)

asyncio.run(main())
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["hi", "128000", "False"]


def _self_signed(tmp_path: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 signed by itself, and its key."""
    x509 = pytest.importorskip("cryptography.x509")
    from datetime import UTC, datetime, timedelta
    from ipaddress import ip_address

    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "parley test CA")])
    now = datetime.now(UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(hours=1)).not_valid_after(now + timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


async def test_https_with_a_private_ca(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import ssl

    cert, key = _self_signed(tmp_path)
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(cert, key)
    app = web.Application()
    app.router.add_post("/v1/chat/completions", answer(completion({"content": "over TLS"})))
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_tls)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    config = {"model": "openai/m1", "api_base": f"https://127.0.0.1:{port}/v1",
              "max_retries": 2, "retry_backoff": 0.001}
    try:
        monkeypatch.setattr(openai_http, "_TLS", None)
        untrusted = Provider(AgentConfig.model_validate(config))
        with pytest.raises(ProviderError) as info:
            await untrusted.complete(HELLO)
        await untrusted.aclose()
        assert "not trusted" in str(info.value) and "SSL_CERT_FILE" in str(info.value)
        assert not isinstance(info.value, ProviderUnavailable)  # not retried: it cannot help

        monkeypatch.setenv("SSL_CERT_FILE", str(cert))
        monkeypatch.setattr(openai_http, "_TLS", None)
        trusted = Provider(AgentConfig.model_validate(config))
        assert (await trusted.complete(HELLO)).content == "over TLS"
        await trusted.aclose()
    finally:
        monkeypatch.setattr(openai_http, "_TLS", None)
        await runner.cleanup()


async def test_a_wrong_api_base_is_named(raw: RawServer, make: Callable[..., Provider]) -> None:
    raw.handlers.append(answer("404 page not found", 404, "text/plain"))  # Ollama without /v1
    with pytest.raises(ProviderBadRequest) as info:
        await make().complete(HELLO)
    assert "/v1/chat/completions answered 404 (404 page not found)" in str(info.value)
    assert "end in /v1" in str(info.value)
    raw.handlers.append(answer({"error": {"message": "model 'm1' not found"}}, 404))
    with pytest.raises(ProviderBadRequest) as missing:
        await make().complete(HELLO)
    assert str(missing.value) == "model 'm1' not found"  # the server's own words


async def test_max_completion_tokens_when_the_model_asks_for_it(
        raw: RawServer, make: Callable[..., Provider]) -> None:
    refusal = {"error": {"message": "Unsupported parameter: 'max_tokens' is not supported with "
                                    "this model. Use 'max_completion_tokens' instead.",
                         "type": "invalid_request_error", "param": "max_tokens"}}
    raw.handlers += [answer(refusal, 400), answer(completion({"content": "thought about it"})),
                     answer(completion({"content": "again"}))]
    provider = make(max_tokens=300)
    assert (await provider.complete(HELLO)).content == "thought about it"
    assert (await provider.complete(HELLO)).content == "again"
    first, retried, later = raw.bodies
    assert first["max_tokens"] == 300 and "max_completion_tokens" not in first
    for body in (retried, later):  # remembered: no refused request before each call
        assert body["max_completion_tokens"] == 300 and "max_tokens" not in body


async def test_a_stream_that_ends_without_done_or_newline(
        raw: RawServer, make: Callable[..., Provider]) -> None:
    text = b'data: {"choices": [{"index": 0, "delta": {"content": "hi"}}]}\n\n'
    usage = b'data: {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 1}}'
    raw.handlers.append(sse([text, usage]))
    r = await make(stream=True).complete(HELLO)
    assert (r.content, r.prompt_tokens, r.completion_tokens) == ("hi", 3, 1)


async def test_a_stream_that_was_not_asked_for_is_read(raw: RawServer,
                                                      make: Callable[..., Provider]) -> None:
    raw.handlers.append(sse([b'data: {"choices": [{"index": 0, "delta": {"content": "ok"}}]}\n\n',
                             b"data: [DONE]\n\n"]))
    r = await make().complete(HELLO)
    assert "stream" not in raw.bodies[0] and r.content == "ok"


async def test_a_password_in_api_base_stays_out_of_errors(
        raw: RawServer, make: Callable[..., Provider]) -> None:
    raw.handlers.append(answer("404 page not found", 404, "text/plain"))
    base = raw.base_url.replace("http://", "http://bob:s3cret@")
    with pytest.raises(ProviderBadRequest) as info:
        await make(api_base=base).complete(HELLO)
    assert "s3cret" not in str(info.value) and "bob" not in str(info.value)
    assert raw.base_url.removeprefix("http://") in str(info.value)
    assert raw.headers[0]["Authorization"] == "Basic Ym9iOnMzY3JldA=="  # bob:s3cret


def test_the_request_body_is_the_same_json_with_history_messages_serialised_once() -> None:
    """``encode_body`` (issue 24) reuses each message's and the tool list's JSON from the
    turns before; what is sent parses to the same body, and a new message is sent as new."""
    import json

    from agent.openai_http import encode_body

    history = [{"role": "user", "content": "héllo"}, {"role": "assistant", "content": "hi"}]
    tools = [{"type": "function", "function": {"name": "t", "parameters": {}}}]
    for body in ({"model": "m", "messages": history, "tools": tools, "max_tokens": 5},
                 {"model": "m", "messages": [*history, {"role": "user", "content": "new"}]},
                 {"model": "m", "messages": []}, {"model": "m", "input": "no messages"}):
        assert json.loads(encode_body(body)) == body
    assert b"\xc3\xa9" in encode_body({"messages": history})  # UTF-8, not \\u escapes
    # the history as the turns carry it, written once: copied in where the span says
    from agent.fingerprint import message_json
    from agent.llm_types import EncodedSpan
    span = EncodedSpan(1, 2, b",".join(message_json(m) for m in history))
    messages = [{"role": "system", "content": "s"}, *history, {"role": "user", "content": "n"}]
    body = {"model": "m", "messages": messages, "tools": tools}
    sent = encode_body(body, span)
    assert json.loads(sent) == body and span.raw in sent
    for short in (EncodedSpan(1, 2, b'{"role":"user","content":"stale"}'),):
        # a span the list no longer has room for is not used
        assert json.loads(encode_body({"messages": messages[:2]}, short)) == {
            "messages": messages[:2]}


async def test_a_proxy_from_the_environment_is_used_unless_no_proxy(
        raw: RawServer, make: Callable[..., Provider], monkeypatch: pytest.MonkeyPatch) -> None:
    """``HTTP_PROXY`` (read once, not looked up per request) carries the call to a model host
    only the proxy can reach; ``NO_PROXY`` naming that host sends it direct (and it fails)."""
    for name in ("NO_PROXY", "no_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", raw.base_url.removesuffix("/v1"))
    raw.handlers.append(answer(completion({"content": "through the proxy"})))
    via = make(api_base="http://model.invalid/v1")
    assert (await via.complete(HELLO)).content == "through the proxy"
    assert raw.headers[-1]["Host"] == "model.invalid"

    monkeypatch.setenv("NO_PROXY", "model.invalid")
    with pytest.raises(ProviderUnavailable):
        await make(api_base="http://model.invalid/v1").complete(HELLO)
    assert len(raw.bodies) == 1
