"""The aiohttp side of the guard: the resolver (errors that name the host) and the socket
factory (the decision, on the address each socket connects to)."""

from __future__ import annotations

import socket

import pytest
from aiohttp.abc import AbstractResolver, ResolveResult

from agent.net.aiohttp_client import GuardedConnector, GuardedResolver
from agent.net.policy import AllowList, BlockedAddress, Guard


class _FlipResolver(AbstractResolver):
    """A DNS server that answers a public address first and a loopback one after (rebind)."""

    def __init__(self) -> None:
        self.answers = ["93.184.216.34", "127.0.0.1"]

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        ip = self.answers.pop(0)
        return [ResolveResult(hostname=host, host=ip, port=port, family=socket.AF_INET,
                              proto=0, flags=0)]

    async def close(self) -> None:
        pass


async def test_the_resolver_checks_every_answer_it_hands_to_the_connector() -> None:
    resolver = GuardedResolver(Guard(), inner=_FlipResolver())
    first = await resolver.resolve("rebind.example", 80)
    assert [r["host"] for r in first] == ["93.184.216.34"]
    with pytest.raises(BlockedAddress, match="rebind.example resolves to 127.0.0.1"):
        await resolver.resolve("rebind.example", 80)



async def test_the_socket_factory_refuses_before_a_socket_exists() -> None:
    connector = GuardedConnector(Guard(AllowList.parse(["10.0.0.0/8"])))
    try:
        tcp = (socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "")
        for sockaddr in (("127.0.0.1", 80), ("169.254.169.254", 80), ("0.0.0.0", 80)):
            with pytest.raises(BlockedAddress):
                connector._socket((*tcp, sockaddr))
        with pytest.raises(BlockedAddress, match="IPv4 127.0.0.1"):
            connector._socket((socket.AF_INET6, socket.SOCK_STREAM, socket.IPPROTO_TCP, "",
                               ("::ffff:127.0.0.1", 80, 0, 0)))
        with pytest.raises(BlockedAddress, match="family"):
            connector._socket((socket.AF_UNIX, socket.SOCK_STREAM, 0, "", ("/tmp/x", 0)))
        for sockaddr in (("93.184.216.34", 80), ("10.2.3.4", 80)):
            connector._socket((*tcp, sockaddr)).close()
    finally:
        await connector.close()
