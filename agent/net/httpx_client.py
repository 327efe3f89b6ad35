"""The guarded httpx client (the MCP SDK's ``httpx2``): every connection passes
``Guard.check_connect``.

httpcore's connection asks its network backend for ``connect_tcp(host, port)`` with the
URL's host as httpx normalised it. ``GuardedBackend`` resolves that host itself, checks the
DNS answer (``check_host``: an error naming the host) and each address, connects the inner
backend to the checked numeric address (so nothing resolves twice), and checks the peer
address of the connected socket once more. TLS still verifies the name: httpcore passes the
URL's host as ``server_hostname`` to ``start_tls``. The client reads no proxy or netrc
settings from the environment (``trust_env`` off), so the target is what is connected to.
"""

from __future__ import annotations

import socket
from collections.abc import Iterable
from typing import Any

import anyio
import httpcore2
import httpx2
from httpcore2 import AsyncNetworkBackend, AsyncNetworkStream

from agent.net.policy import BlockedAddress, Guard

SocketOption = Any
"""httpcore's ``SOCKET_OPTION`` (a tuple of two or three items), passed through."""


class GuardedBackend(AsyncNetworkBackend):
    def __init__(self, guard: Guard, inner: AsyncNetworkBackend | None = None) -> None:
        self.guard = guard
        self.inner = inner or httpcore2.AnyIOBackend()

    async def connect_tcp(self, host: str, port: int,
                          timeout: float | None = None,  # noqa: ASYNC109 (httpcore's)
                          local_address: str | None = None,
                          socket_options: Iterable[SocketOption] | None = None,
                          ) -> AsyncNetworkStream:
        try:
            with anyio.fail_after(timeout):
                infos = await anyio.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except TimeoutError:
            raise httpcore2.ConnectTimeout(f"resolving {host} timed out") from None
        except OSError as exc:
            raise httpcore2.ConnectError(f"{host}: {exc}") from exc
        addresses = list(dict.fromkeys(str(info[4][0]) for info in infos
                                       if info[0] in (socket.AF_INET, socket.AF_INET6)))
        last: Exception | None = None
        try:
            self.guard.check_host(host, port, addresses)
            for address in addresses:
                self.guard.check_connect(address, port)
                try:
                    stream = await self.inner.connect_tcp(
                        address, port, timeout=timeout, local_address=local_address,
                        socket_options=socket_options)
                except (httpcore2.ConnectError, httpcore2.ConnectTimeout) as exc:
                    last = exc
                    continue
                await self._check_peer(stream)
                return stream
        except BlockedAddress as exc:
            raise httpcore2.ConnectError(exc.reason) from exc
        raise last or httpcore2.ConnectError(f"{host} did not resolve to any address")

    async def _check_peer(self, stream: AsyncNetworkStream) -> None:
        peer = stream.get_extra_info("server_addr")
        try:
            if not peer:
                raise self.guard.refuse("the connected socket has no peer address")
            self.guard.check_connect(str(peer[0]), int(peer[1]))
        except BlockedAddress:
            await stream.aclose()
            raise

    async def connect_unix_socket(self, path: str,
                                  timeout: float | None = None,  # noqa: ASYNC109 (httpcore's)
                                  socket_options: Iterable[SocketOption] | None = None,
                                  ) -> AsyncNetworkStream:
        raise httpcore2.ConnectError("the guarded client does not use Unix sockets")

    async def sleep(self, seconds: float) -> None:
        await self.inner.sleep(seconds)


class GuardedTransport(httpx2.AsyncHTTPTransport):
    """httpx's own transport (its request and error mapping) over a connection pool whose
    network backend is guarded. httpx takes no backend argument, so the pool is replaced."""

    def __init__(self, guard: Guard, *, backend: AsyncNetworkBackend | None = None) -> None:
        super().__init__(trust_env=False)
        self._pool = httpcore2.AsyncConnectionPool(
            ssl_context=httpx2.create_ssl_context(), max_connections=100,
            max_keepalive_connections=20, keepalive_expiry=5.0,  # httpx's default limits
            network_backend=GuardedBackend(guard, backend))


def url_endpoint(url: str) -> tuple[str, int]:
    """(host, port) of ``url`` as the client will connect to them (httpx's normalised host)."""
    parsed = httpx2.URL(url)
    return parsed.raw_host.decode("ascii"), parsed.port or (443 if parsed.scheme == "https"
                                                             else 80)


def guarded_httpx_client(guard: Guard, **kwargs: Any) -> httpx2.AsyncClient:
    """An AsyncClient under ``guard``; ``kwargs`` go to the client (headers, timeout...)."""
    return httpx2.AsyncClient(transport=GuardedTransport(guard), trust_env=False, **kwargs)
