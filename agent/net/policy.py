"""Which addresses an outbound connection may reach: the policy of the connect-time guard.

Pure, no client library. ``Guard.check_connect`` is the decision, made on the numeric address
a socket is about to connect to, after the client has parsed and normalised the URL and after
DNS (so Unicode or octal digits, a decimal host, an IPv4-mapped IPv6 address or a rebinding
DNS answer all arrive here as the address they mean). ``Guard.check_host`` runs earlier, on a
name's DNS answer: it gives an error that names the host, and it records the addresses an
allowed name or a trusted endpoint stands for, so that the connect-time check lets exactly
those through (at that port).
"""

from __future__ import annotations

import errno
import ipaddress
from collections.abc import Iterable, Sequence

from gateway.kernel.frozen import frozen

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

METADATA_HOSTS = frozenset({"metadata.google.internal", "metadata.goog", "metadata",
                            "instance-data", "instance-data.ec2.internal"})
"""Cloud metadata services by name (their addresses are link-local or private anyway)."""
METADATA_ADDRESSES = frozenset(ipaddress.ip_address(a) for a in (
    "169.254.169.254", "169.254.170.2", "100.100.100.200", "fd00:ec2::254", "192.0.0.192"))
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_NAT64_LOCAL = ipaddress.ip_network("64:ff9b:1::/48")
WEB_HINT = "internal addresses are refused unless listed in agent.tools.web.allow_hosts"


class BlockedAddress(OSError):
    """The guard's refusal (an OSError, so a client gives up on that address as it would on a
    refused connection); ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(errno.EACCES, reason)  # strerror: what aiohttp's error shows
        self.reason = reason

    def __str__(self) -> str:
        return self.reason


@frozen
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
                hosts.add(host_key(entry))
        return cls(frozenset(hosts), tuple(networks))

    def allows_host(self, host: str) -> bool:
        return host_key(host) in self.hosts

    def allows_address(self, address: IPAddress) -> bool:
        embedded = embedded_ipv4(address)
        return any(address in net or (embedded is not None and embedded in net)
                   for net in self.networks)


def host_key(host: str) -> str:
    """A host name as the allow list compares it: lower case, no brackets or final dot."""
    return host.strip().lower().strip("[]").rstrip(".")


def parse_address(text: str) -> IPAddress:
    """An address as a socket address or DNS answer spells it (an IPv6 zone dropped);
    ValueError for anything else."""
    return ipaddress.ip_address(text.split("%", 1)[0])


def embedded_ipv4(address: IPAddress) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one carries: IPv4-mapped, 6to4, or well-known NAT64."""
    if not isinstance(address, ipaddress.IPv6Address):
        return None
    embedded = address.ipv4_mapped or address.sixtofour
    if embedded is None and address in _NAT64:
        embedded = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return embedded


def address_kind(address: IPAddress) -> str | None:
    """What makes an address internal ("loopback", "private", ...), or None if it is public."""
    embedded = embedded_ipv4(address)
    if embedded is not None:
        return address_kind(embedded)
    if address in METADATA_ADDRESSES:
        return "cloud-metadata"
    if isinstance(address, ipaddress.IPv6Address) and address in _NAT64_LOCAL:
        return "private"
    for kind in ("loopback", "unspecified", "link_local", "multicast", "private", "reserved"):
        if getattr(address, f"is_{kind}"):
            return kind.replace("_", "-")
    return None if address.is_global else "non-public"


def _shown(text: str, address: IPAddress) -> str:
    embedded = embedded_ipv4(address)
    return f"{text} (IPv4 {embedded})" if embedded is not None else text


def _literal(host: str) -> IPAddress | None:
    try:
        return parse_address(host_key(host))
    except ValueError:
        return None


def blocked_reason(host: str, addresses: Sequence[str], allow: AllowList,
                   hint: str = WEB_HINT) -> str | None:
    """Why ``host`` must not be fetched at ``addresses`` (its DNS answer, or the literal
    itself), or None when every address may be reached. One bad address refuses the host:
    a public site does not also resolve to an internal one."""
    if allow.allows_host(host):
        return None
    if host_key(host) in METADATA_HOSTS:
        return f"{host} is a cloud metadata service"
    if not addresses:
        return f"{host} did not resolve to any address"
    for text in addresses:
        try:
            address = parse_address(text)
        except ValueError:
            return f"{host} resolved to {text!r}, which is not an IP address"
        kind = address_kind(address)
        if kind is not None and not allow.allows_address(address):
            shown = _shown(host, address) if _literal(host) == address else \
                f"{host} resolves to {_shown(text, address)}, which"
            return f"{shown} is a {kind} address; {hint}"
    return None


class Guard:
    """The policy of one client: the allow list, the endpoints the owner configured (a host
    trusted at one port only, e.g. an MCP server's URL), and the addresses approved so far
    for allowed names. ``hint`` ends each refusal: what the owner could change."""

    def __init__(self, allow: AllowList | None = None, *,
                 endpoints: Iterable[tuple[str, int]] = (), hint: str = WEB_HINT) -> None:
        self.allow = allow or AllowList()
        self.hint = hint
        self._endpoints: set[tuple[str, int]] = set()
        self._approved: set[tuple[IPAddress, int]] = set()
        self.last_refusal: BlockedAddress | None = None
        """The latest refusal: a client that merges several failed addresses into one error
        loses the exception itself."""
        for host, port in endpoints:
            self._endpoints.add((host_key(host), port))
            try:  # a literal is connected to without a DNS answer to approve
                self._approved.add((parse_address(host_key(host)), port))
            except ValueError:
                pass

    def trusts(self, host: str, port: int) -> bool:
        return self.allow.allows_host(host) or (host_key(host), port) in self._endpoints

    def check_host(self, host: str, port: int, addresses: Sequence[str]) -> None:
        """Before connecting to ``host`` at its DNS answer: BlockedAddress naming the host,
        or (for an allowed name) remember its addresses as approved at ``port``."""
        if self.trusts(host, port):
            for text in addresses:
                try:
                    self._approved.add((parse_address(text), port))
                except ValueError:
                    pass
            return
        reason = blocked_reason(host, addresses, self.allow, self.hint)
        if reason:
            raise self.refuse(reason)

    def check_connect(self, address: str, port: int) -> None:
        """The decision, on the address a socket is about to connect to (or just did)."""
        try:
            ip = parse_address(address)
        except ValueError:
            raise self.refuse(f"{address!r} is not an IP address") from None
        if (ip, port) in self._approved or self.allow.allows_address(ip):
            return
        kind = address_kind(ip)
        if kind is not None:
            raise self.refuse(f"{_shown(address, ip)} is a {kind} address; {self.hint}")

    def refuse(self, reason: str) -> BlockedAddress:
        self.last_refusal = BlockedAddress(reason)
        return self.last_refusal


def refusal(exc: BaseException, guard: Guard) -> str | None:
    """The guard's reason behind a client's connection error, or None when the guard refused
    nothing. Clients wrap the refusal (its cause chain is searched); aiohappyeyeballs merges
    several failed addresses into a plain OSError, hence ``guard.last_refusal`` as well."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, BlockedAddress):
            return seen.reason
        seen = seen.__cause__ or seen.__context__
    return guard.last_refusal.reason if guard.last_refusal is not None else None
