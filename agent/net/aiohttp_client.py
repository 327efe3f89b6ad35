"""The guarded aiohttp session: every connection it makes passes ``Guard.check_connect``.

The check sits in the connector's ``socket_factory`` (aiohttp >= 3.12, handed to
aiohappyeyeballs), which receives the exact ``sockaddr`` the new socket is about to connect
to: a resolved name's address, an IP literal (aiohttp asks no resolver about those, after yarl
has turned ``①②⑦.0.0.1`` or ``[::ffff:127.0.0.1]`` into an address), and every hop of a
redirect, which aiohttp connects through the same connector. The resolver checks a name's
DNS answer first, for an error that names the host. Proxies are never used: ``trust_env`` is
off and a request with ``proxy=`` is refused, since a proxy would make the connection the
guard sees the proxy's, not the target's.
"""

from __future__ import annotations

import socket
from typing import Any

import aiohttp
from aiohappyeyeballs import AddrInfoType
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.client_reqrep import ClientRequest
from aiohttp.connector import Connection
from aiohttp.resolver import ThreadedResolver
from aiohttp.tracing import Trace

from agent.net.policy import Guard


class GuardedResolver(AbstractResolver):
    """Resolves with ``inner`` (getaddrinfo in a thread by default) and refuses a host any of
    whose addresses is internal, naming the host; aiohttp then connects to exactly the
    addresses returned, each checked again by the socket factory."""

    def __init__(self, guard: Guard, inner: AbstractResolver | None = None) -> None:
        self.guard = guard
        self.inner = inner or ThreadedResolver()

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        results = await self.inner.resolve(host, port, family)
        self.guard.check_host(host, port, [r["host"] for r in results])
        return results

    async def close(self) -> None:
        await self.inner.close()


class GuardedConnector(aiohttp.TCPConnector):
    """A TCPConnector whose sockets are made by ``guard`` (and no DNS cache: every
    connection's name is resolved and checked afresh)."""

    def __init__(self, guard: Guard, *, resolver: AbstractResolver | None = None,
                 **kwargs: Any) -> None:
        self.guard = guard
        super().__init__(resolver=GuardedResolver(guard, resolver), use_dns_cache=False,
                         socket_factory=self._socket, **kwargs)

    def _socket(self, addr_info: AddrInfoType) -> socket.socket:
        family, type_, proto, _, sockaddr = addr_info
        if family not in (socket.AF_INET, socket.AF_INET6):
            raise self.guard.refuse(f"address family {family!r} is not used")
        self.guard.check_connect(str(sockaddr[0]), int(sockaddr[1]))
        return socket.socket(family=family, type=type_, proto=proto)

    async def connect(self, req: ClientRequest, traces: list[Trace],
                      timeout: aiohttp.ClientTimeout,  # noqa: ASYNC109 (aiohttp's signature)
                      ) -> Connection:
        if req.proxy is not None:
            raise aiohttp.ClientConnectionError("the guarded session does not use proxies")
        return await super().connect(req, traces, timeout)


def guarded_session(guard: Guard, *, resolver: AbstractResolver | None = None,
                    limit: int = 10, **kwargs: Any) -> aiohttp.ClientSession:
    """A ClientSession under ``guard``; ``kwargs`` go to the session (timeout, headers...),
    ``resolver`` replaces getaddrinfo (tests)."""
    connector = GuardedConnector(guard, resolver=resolver, limit=limit)
    return aiohttp.ClientSession(connector=connector, trust_env=False, **kwargs)
