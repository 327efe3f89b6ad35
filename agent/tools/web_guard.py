"""The SSRF guard of ``web_fetch``: which addresses a fetched URL may reach.

``blocked_reason`` is a pure function over addresses already resolved: private, loopback,
link-local, cloud-metadata and other non-public addresses are refused unless the host or the
address is listed in ``agent.tools.web.allow_hosts``. ``GuardedResolver`` applies it inside
aiohttp's connector, so the address that was checked is the address that is connected to (a
DNS answer that changes between a check and the connect cannot slip through), while the Host
header and TLS SNI keep the name. aiohttp never asks a resolver about an IP literal, so the
fetcher checks those itself with ``check_literal``.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import ThreadedResolver

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

METADATA_HOSTS = frozenset({"metadata.google.internal", "metadata.goog", "metadata",
                            "instance-data", "instance-data.ec2.internal"})
"""Cloud metadata services by name (their addresses are link-local or private anyway)."""
METADATA_ADDRESSES = frozenset(ipaddress.ip_address(a) for a in (
    "169.254.169.254", "169.254.170.2", "100.100.100.200", "fd00:ec2::254", "192.0.0.192"))
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


class BlockedAddress(OSError):
    """Raised by the resolver so aiohttp gives up on the host; ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class AllowList:
    """``allow_hosts`` parsed: host names (exact, case-insensitive) and IP networks."""

    hosts: frozenset[str] = frozenset()
    networks: tuple[IPNetwork, ...] = ()

    @classmethod
    def parse(cls, entries: Iterable[str]) -> AllowList:
        hosts: set[str] = set()
        networks: list[IPNetwork] = []
        for raw in entries:
            entry = raw.strip().lower().strip("[]")
            try:
                networks.append(ipaddress.ip_network(entry, strict=False))
            except ValueError:
                hosts.add(entry.rstrip("."))
        return cls(frozenset(hosts), tuple(networks))

    def allows_host(self, host: str) -> bool:
        return host.lower().rstrip(".").strip("[]") in self.hosts

    def allows_address(self, address: IPAddress) -> bool:
        return any(address in net for net in self.networks)


def _kind(address: IPAddress) -> str | None:
    """What makes an address internal ("loopback", "private", ...), or None if it is public."""
    if isinstance(address, ipaddress.IPv6Address):
        embedded = address.ipv4_mapped or address.sixtofour
        if embedded is None and address in _NAT64:
            embedded = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
        if embedded is not None:
            return _kind(embedded)
    if address in METADATA_ADDRESSES:
        return "cloud-metadata"
    for kind in ("loopback", "link_local", "private", "multicast", "unspecified", "reserved"):
        if getattr(address, f"is_{kind}"):
            return kind.replace("_", "-")
    return None if address.is_global else "non-public"


def blocked_reason(host: str, addresses: Sequence[str], allow: AllowList) -> str | None:
    """Why ``host`` must not be fetched at ``addresses`` (its DNS answer, or the literal
    itself), or None when every address may be reached. One bad address refuses the host:
    a public site does not also resolve to an internal one."""
    if allow.allows_host(host):
        return None
    name = host.lower().rstrip(".")
    if name in METADATA_HOSTS:
        return f"{host} is a cloud metadata service"
    if not addresses:
        return f"{host} did not resolve to any address"
    for text in addresses:
        try:
            address = ipaddress.ip_address(text.split("%", 1)[0])
        except ValueError:
            return f"{host} resolved to {text!r}, which is not an IP address"
        kind = _kind(address)
        if kind is not None and not allow.allows_address(address):
            shown = host if host == text else f"{host} resolves to {text}, which"
            return (f"{shown} is a {kind} address; internal addresses are refused unless "
                    "listed in agent.tools.web.allow_hosts")
    return None


def check_literal(host: str, allow: AllowList) -> str | None:
    """The guard for a URL whose host is an IP literal (aiohttp resolves nothing for it);
    None when ``host`` is a name (the resolver checks those) or an allowed address."""
    bare = host.strip("[]")
    try:
        ipaddress.ip_address(bare.split("%", 1)[0])
    except ValueError:
        return None
    return blocked_reason(bare, [bare], allow)


class GuardedResolver(AbstractResolver):
    """Resolves with ``inner`` (getaddrinfo in a thread by default) and refuses a host any of
    whose addresses is internal; aiohttp then connects to exactly the addresses returned."""

    def __init__(self, allow: AllowList, inner: AbstractResolver | None = None) -> None:
        self.allow = allow
        self.inner = inner or ThreadedResolver()

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        results = await self.inner.resolve(host, port, family)
        reason = blocked_reason(host, [r["host"] for r in results], self.allow)
        if reason:
            raise BlockedAddress(reason)
        return results

    async def close(self) -> None:
        await self.inner.close()
