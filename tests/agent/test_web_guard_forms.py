"""The SSRF guard against the spellings of an internal address: Unicode and fullwidth digits,
octal, hex and decimal hosts, IPv4-mapped and NAT64 IPv6, names that resolve inward, user
info, whitespace, and redirects to each of them, through the real ``web_fetch`` tool and
through the guarded aiohttp session and httpx client directly.

A recorder listens on 127.0.0.1 and [::1] at one port and notes every request; after each
form it must have seen nothing. The controls show that the forms do reach it without the
guard, and that an ``allow_hosts`` entry lets exactly the allowed fetch through.
"""

from __future__ import annotations

import re
import socket
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import httpx2
import pytest
from aiohttp import web
from yarl import URL

from agent.net import Guard, guarded_httpx_client, guarded_session, refusal
from agent.tools.base import ToolRegistry
from agent.tools.web import WEB_FETCH_TOOLS, WEB_SEARCH_TOOLS
from agent.turn import TurnContext
from gateway.kernel.config import ToolsConfig, WebToolsConfig
from gateway.kernel.events import InboundMessage

REGISTRY = ToolRegistry(WEB_FETCH_TOOLS + WEB_SEARCH_TOOLS)
LOOPBACK = r"refused to fetch .*loopback address"
REFUSED_OR_INVALID = r"refused to fetch|is not a valid URL"
"""aiohttp takes a non-canonical IPv4 address for an invalid URL; the guard sees the rest."""

# (URL with {v} for the recorder's port, what web_fetch answers)
FORMS: list[tuple[str, str]] = [
    ("http://127.0.0.1:{v}/", LOOPBACK),
    ("HTTP://127.0.0.1:{v}/", LOOPBACK),
    ("http://localhost:{v}/", r"localhost resolves to 127\.0\.0\.1, which is a loopback"),
    ("http://LOCALHOST:{v}/", LOOPBACK),
    ("http://localhost.:{v}/", LOOPBACK),
    ("http://ⓛⓞⓒⓐⓛⓗⓞⓢⓣ:{v}/", LOOPBACK),  # circled letters, NFKC: localhost
    ("http://ⅼocalhost:{v}/", LOOPBACK),  # U+217C SMALL ROMAN NUMERAL FIFTY
    ("http://①②⑦.0.0.1:{v}/", LOOPBACK),  # the reported bypass
    ("http://１２７．０．０．１:{v}/", LOOPBACK),  # fullwidth digits and dots
    ("http://127。0。0。1:{v}/", LOOPBACK),  # ideographic full stops
    ("http://127.1:{v}/", REFUSED_OR_INVALID),
    ("http://0177.0.0.1:{v}/", REFUSED_OR_INVALID),
    ("http://0x7f.0.0.1:{v}/", LOOPBACK),
    ("http://0x7f.1:{v}/", LOOPBACK),
    ("http://127.0x0.1:{v}/", LOOPBACK),
    ("http://2130706433:{v}/", REFUSED_OR_INVALID),
    ("http://0x7f000001:{v}/", LOOPBACK),
    ("http://017700000001:{v}/", REFUSED_OR_INVALID),
    ("http://127.000.000.001:{v}/", REFUSED_OR_INVALID),
    ("http://0:{v}/", REFUSED_OR_INVALID),
    ("http://0.0.0.0:{v}/", r"refused to fetch .*0\.0\.0\.0 is a unspecified address"),
    ("http://[::]:{v}/", r"refused to fetch .*:: is a unspecified address"),
    ("http://[::1]:{v}/", LOOPBACK),
    ("http://[0::1]:{v}/", LOOPBACK),
    ("http://[::ffff:127.0.0.1]:{v}/", r"\(IPv4 127\.0\.0\.1\) is a loopback"),
    ("http://[0:0:0:0:0:ffff:7f00:1]:{v}/", LOOPBACK),
    ("http://[::ffff:7f00:1]:{v}/", LOOPBACK),
    ("http://[64:ff9b::7f00:1]:{v}/", LOOPBACK),  # NAT64
    ("http://[2002:7f00:1::]:{v}/", LOOPBACK),  # 6to4
    ("http://[::127.0.0.1]:{v}/", r"refused to fetch .*reserved address"),  # IPv4-compatible
    ("http://127.0.0.\t1:{v}/", LOOPBACK),
    ("http://127.0.0.1\n:{v}/", LOOPBACK),
    ("http://user@127.0.0.1:{v}/", "user name or password"),
    ("http://example.com@127.0.0.1:{v}/", "user name or password"),
    ("http://127.0.0.1\\@example.com:{v}/", "user name or password|not a valid URL"),
    ("http://loopback.test:{v}/", r"loopback\.test resolves to 127\.0\.0\.1"),
    ("http://loopback6.test:{v}/", r"loopback6\.test resolves to ::1"),
    ("http://mapped.test:{v}/", r"mapped\.test resolves to ::ffff:127\.0\.0\.1"),
    ("http://rebind.test:{v}/", r"rebind\.test resolves to 127\.0\.0\.1"),
]
"""Every one would reach the recorder, or be refused trying."""

ELSEWHERE: list[tuple[str, str]] = [
    ("http://169.254.169.254/latest/meta-data/", "cloud-metadata"),
    ("http://⑯⑨.②⑤④.①⑥⑨.②⑤④/latest/meta-data/", "cloud-metadata"),
    ("http://0xa9fea9fe/", "cloud-metadata"),
    ("http://2852039166/", REFUSED_OR_INVALID),
    ("http://[::ffff:169.254.169.254]/", "cloud-metadata"),
    ("http://[::ffff:a9fe:a9fe]/", "cloud-metadata"),
    ("http://metadata.test/", "metadata.test resolves to 169.254.169.254"),
    ("http://[fe80::1]/", "link-local address"),
    ("http://224.0.0.1/", "multicast address"),
    ("http://[ff02::1]/", "multicast address"),
    ("http://240.0.0.1/", "(private|reserved) address"),
    ("http://10.0.0.1/", "private address"),
    ("http://192.168.0.1/", "private address"),
    ("http://[fc00::1]/", "private address"),
    ("http://100.64.0.1/", "non-public address"),
]
"""Internal addresses other than the recorder's: refused before any socket connects."""

NAMES = {"localhost": ["127.0.0.1"], "loopback.test": ["127.0.0.1"], "loopback6.test": ["::1"],
         "mapped.test": ["::ffff:127.0.0.1"], "rebind.test": ["93.184.216.34", "127.0.0.1"],
         "metadata.test": ["169.254.169.254"], "front.test": ["127.0.0.1"]}
"""What the test's DNS answers (getaddrinfo, as both aiohttp's and anyio's resolvers use)."""


class Recorder:
    """An HTTP server on 127.0.0.1 and [::1] (one port) that notes every request; ``/to``
    redirects to its ``u`` parameter."""

    def __init__(self) -> None:
        self.hits: list[str] = []
        self.port = 0
        self.has_v6 = False
        self.search_to = ""
        """Where ``/search`` redirects (a search API that points elsewhere)."""
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/to", self.redirect)
        app.router.add_get("/search", self.search)
        app.router.add_route("*", "/{tail:.*}", self.hit)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        v4 = socket.socket()
        v4.bind(("127.0.0.1", 0))
        self.port = v4.getsockname()[1]
        await web.SockSite(self._runner, v4).start()
        v6 = socket.socket(socket.AF_INET6)
        v6.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        try:
            v6.bind(("::1", self.port))
        except OSError:  # no IPv6 loopback here: the [::1] forms then find nothing anyway
            v6.close()
        else:
            await web.SockSite(self._runner, v6).start()
            self.has_v6 = True

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def hit(self, request: web.Request) -> web.Response:
        self.hits.append(f"{request.host} {request.path_qs}")
        return web.Response(text="the recorder's secret")

    async def redirect(self, request: web.Request) -> web.Response:
        self.hits.append(f"{request.host} {request.path_qs}")
        return web.Response(status=302, headers={"Location": request.query["u"]})

    async def search(self, request: web.Request) -> web.Response:
        self.hits.append(f"{request.host} {request.path_qs}")
        return web.Response(status=302, headers={"Location": self.search_to})


async def _running() -> AsyncIterator[Recorder]:
    server = Recorder()
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


@pytest.fixture
async def victim() -> AsyncIterator[Recorder]:
    """The loopback server no form may reach."""
    async for server in _running():
        yield server


@pytest.fixture
async def front() -> AsyncIterator[Recorder]:
    """An allowed server (``front.test`` in ``allow_hosts``) that redirects."""
    async for server in _running():
        yield server


@pytest.fixture(autouse=True)
def test_dns(monkeypatch: pytest.MonkeyPatch) -> None:
    real = socket.getaddrinfo

    def getaddrinfo(host: Any, port: Any, family: int = 0, type: int = 0, proto: int = 0,
                    flags: int = 0) -> list[Any]:
        name = (host.decode() if isinstance(host, bytes) else str(host)).lower().rstrip(".")
        if name not in NAMES:
            return real(host, port, family, type, proto, flags)
        out = []
        for ip in NAMES[name]:
            v6 = ":" in ip
            fam = socket.AF_INET6 if v6 else socket.AF_INET
            if family in (0, socket.AF_UNSPEC, fam):
                addr = (ip, int(port or 0), 0, 0) if v6 else (ip, int(port or 0))
                out.append((fam, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", addr))
        return out

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)


def make_ctx(tmp_path: Path, allow: list[str] | None = None, **web_config: Any) -> TurnContext:
    web_tools = WebToolsConfig.model_validate({"allow_hosts": allow or [], "timeout": 5,
                                               **web_config})
    return TurnContext(message=InboundMessage(channel="local", chat_id="c1", sender_id="u1",
                                              text="", received_at=datetime.now(UTC)),
                       session_id=1, workspace=tmp_path, tools=ToolsConfig(web=web_tools))


async def web_fetch(tmp_path: Path, url: str, allow: list[str] | None = None) -> tuple[str, bool]:
    result = await REGISTRY.execute("web_fetch", {"url": url}, make_ctx(tmp_path, allow))
    return result.text, result.is_error


def assert_refusal(text: str, error: bool, expected: str) -> None:
    assert error, text
    assert "Traceback" not in text and len(text) < 400, text
    assert re.search(expected, text, re.S), text


def ids(forms: list[tuple[str, str]]) -> list[str]:
    return [url.encode("unicode_escape").decode("ascii") for url, _ in forms]


# through the tool -------------------------------------------------------------------------

@pytest.mark.parametrize(("form", "expected"), FORMS, ids=ids(FORMS))
async def test_web_fetch_refuses_every_form(victim: Recorder, tmp_path: Path, form: str,
                                            expected: str) -> None:
    text, error = await web_fetch(tmp_path, form.format(v=victim.port))
    assert_refusal(text, error, expected)
    assert victim.hits == []


@pytest.mark.parametrize(("form", "expected"), ELSEWHERE, ids=ids(ELSEWHERE))
async def test_web_fetch_refuses_other_internal_addresses(tmp_path: Path, form: str,
                                                          expected: str) -> None:
    text, error = await web_fetch(tmp_path, form)
    assert_refusal(text, error, expected)


REDIRECTABLE = [(url, exp) for url, exp in FORMS if not any(c in url for c in "\t\n")]
"""A Location header cannot carry a tab or a newline."""


@pytest.mark.parametrize(("form", "expected"), REDIRECTABLE, ids=ids(REDIRECTABLE))
async def test_a_redirect_from_an_allowed_host_to_each_form_is_refused(
        victim: Recorder, front: Recorder, tmp_path: Path, form: str, expected: str) -> None:
    target = form.format(v=victim.port)
    start = str(URL(f"http://front.test:{front.port}/to").with_query(u=target))
    text, error = await web_fetch(tmp_path, start, allow=["front.test"])
    assert_refusal(text, error, expected)
    assert f"(redirected from {start})" in text
    assert len(front.hits) == 1 and victim.hits == []


def legs(form: str, victim: Recorder, front: Recorder) -> list[tuple[str, str]]:
    """(what, URL): the form itself, and a redirect to it from an allowed server."""
    url = form.format(v=victim.port)
    out = [("direct", url)]
    if not any(c in url for c in "\t\n"):
        out.append(("redirect", str(URL(f"http://127.0.0.1:{front.port}/to")
                                    .with_query(u=url))))
    return out


# through the clients directly (aiohttp follows the redirect itself here) -------------------

ALL = FORMS + ELSEWHERE


@pytest.mark.parametrize("form", [url for url, _ in ALL], ids=ids(ALL))
async def test_the_guarded_session_refuses_every_form(victim: Recorder, front: Recorder,
                                                      form: str) -> None:
    for leg, url in legs(form, victim, front):
        guard = Guard(endpoints=[("127.0.0.1", front.port)])
        with pytest.raises((aiohttp.ClientConnectorError, aiohttp.InvalidURL)) as caught:
            async with guarded_session(guard, timeout=aiohttp.ClientTimeout(total=5)) as \
                    session, session.get(url) as resp:
                await resp.read()
        if isinstance(caught.value, aiohttp.ClientConnectorError):
            assert refusal(caught.value, guard), (leg, caught.value)
    assert victim.hits == []


@pytest.mark.parametrize("form", [url for url, _ in ALL], ids=ids(ALL))
async def test_the_guarded_httpx_client_refuses_every_form(victim: Recorder, front: Recorder,
                                                           form: str) -> None:
    guard = Guard(endpoints=[("127.0.0.1", front.port)])
    async with guarded_httpx_client(guard, timeout=5, follow_redirects=True) as client:
        for leg, url in legs(form, victim, front):
            with pytest.raises((httpx2.ConnectError, httpx2.InvalidURL,
                                httpx2.RemoteProtocolError)) as caught:
                await client.get(url)
            if isinstance(caught.value, httpx2.RemoteProtocolError):  # httpx's own check
                assert "Invalid URL in location header" in str(caught.value), caught.value
            elif isinstance(caught.value, httpx2.ConnectError) and "\\@" not in form:
                assert refusal(caught.value, guard), (leg, caught.value)
            # httpx reads http://127.0.0.1\@example.com as example.com, not the recorder
    assert victim.hits == []


# the controls: without the guard these forms do get through; with allow_hosts exactly the
# allowed fetch does -------------------------------------------------------------------------

REACH_AIOHTTP = ["http://①②⑦.0.0.1:{v}/", "http://１２７．０．０．１:{v}/", "http://127。0。0。1:{v}/",
                 "http://ⓛⓞⓒⓐⓛⓗⓞⓢⓣ:{v}/", "http://0x7f.1:{v}/", "http://0x7f000001:{v}/",
                 "http://0.0.0.0:{v}/", "http://[::ffff:127.0.0.1]:{v}/", "http://127.0.0.\t1:{v}/",
                 "http://example.com@127.0.0.1:{v}/", "http://loopback.test:{v}/",
                 "http://mapped.test:{v}/", "http://[::]:{v}/", "http://loopback6.test:{v}/"]
REACH_HTTPX = ["http://127.1:{v}/", "http://2130706433:{v}/", "http://017700000001:{v}/",
               "http://0:{v}/", "http://[::ffff:7f00:1]:{v}/"]


async def test_without_the_guard_the_forms_reach_the_recorder(victim: Recorder) -> None:
    """What the tests above would see if the guard let a form through (Linux: 0.0.0.0 and
    [::] connect to the local host)."""
    known = {url for url, _ in FORMS}
    tried = 0
    for form in REACH_AIOHTTP:
        assert form in known
        if ("[::]" in form or "6.test" in form) and not victim.has_v6:
            continue
        tried += 1
        async with aiohttp.ClientSession(trust_env=False) as session, \
                session.get(form.format(v=victim.port)) as resp:
            assert await resp.text() == "the recorder's secret", form
    async with httpx2.AsyncClient(trust_env=False) as client:
        for form in REACH_HTTPX:
            assert form in known
            resp = await client.get(form.format(v=victim.port))
            assert resp.text == "the recorder's secret", form
    assert len(victim.hits) == tried + len(REACH_HTTPX)


async def test_allow_hosts_lets_exactly_the_allowed_fetch_through(victim: Recorder,
                                                                  tmp_path: Path) -> None:
    allow = ["127.0.0.1"]
    text, error = await web_fetch(tmp_path, f"http://127.0.0.1:{victim.port}/ok", allow)
    assert not error and "the recorder's secret" in text
    assert victim.hits == [f"127.0.0.1:{victim.port} /ok"]
    # The reported form is the same address: allowed as that, judged as that.
    text, error = await web_fetch(tmp_path, f"http://①②⑦.0.0.1:{victim.port}/odd", allow)
    assert not error and "the recorder's secret" in text
    assert len(victim.hits) == 2
    text, error = await web_fetch(tmp_path, f"http://[::1]:{victim.port}/v6", allow)
    assert error and "::1 is a loopback address" in text
    text, error = await web_fetch(tmp_path, f"http://loopback.test:{victim.port}/name",
                                  ["loopback.test"])
    assert not error and len(victim.hits) == 3


# proxies, and the owner's own endpoints -------------------------------------------------------

PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy",
                   "all_proxy")


async def test_proxy_settings_cannot_route_around_the_guard(
        victim: Recorder, front: Recorder, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    for name in PROXY_VARIABLES:
        monkeypatch.setenv(name, f"http://127.0.0.1:{victim.port}")
    async with httpx2.AsyncClient() as plain:  # the control: httpx does read them
        await plain.get(f"http://front.test:{front.port}/plain")
    assert len(victim.hits) == 1
    victim.hits.clear()

    text, error = await web_fetch(tmp_path, f"http://front.test:{front.port}/a", ["front.test"])
    assert not error and front.hits == [f"front.test:{front.port} /a"]
    guard = Guard(endpoints=[("front.test", front.port)])
    async with guarded_httpx_client(guard) as client:
        assert (await client.get(f"http://front.test:{front.port}/b")).status_code == 200
    async with guarded_session(guard) as session:
        with pytest.raises(aiohttp.ClientConnectionError, match="does not use proxies"):
            await session.get(f"http://front.test:{front.port}/c",
                              proxy=f"http://127.0.0.1:{victim.port}")
    assert victim.hits == [] and len(front.hits) == 2


async def test_an_owner_endpoint_is_trusted_at_its_own_port_only(victim: Recorder,
                                                                 front: Recorder) -> None:
    """An MCP server's URL: its host and port, even on loopback, and nothing else there."""
    guard = Guard(endpoints=[("front.test", front.port)])
    async with guarded_httpx_client(guard) as client:
        assert (await client.get(f"http://front.test:{front.port}/mcp")).status_code == 200
        with pytest.raises(httpx2.ConnectError, match="loopback address"):
            await client.get(f"http://front.test:{victim.port}/other-port")
    assert victim.hits == []


async def test_a_search_api_redirecting_inward_is_refused(victim: Recorder, front: Recorder,
                                                          tmp_path: Path) -> None:
    front.search_to = f"http://127.0.0.1:{victim.port}/"
    ctx = make_ctx(tmp_path, search={"provider": "searxng",
                                     "base_url": f"http://127.0.0.1:{front.port}"})
    result = await REGISTRY.execute("web_search", {"query": "q"}, ctx)
    assert result.is_error and "127.0.0.1 is a loopback address" in result.text
    assert len(front.hits) == 1 and victim.hits == []
