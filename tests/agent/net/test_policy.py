"""The guard's policy as pure functions: which addresses are internal, what allow_hosts and
an owner's endpoint let through, and at which port."""

from __future__ import annotations

import aiohttp
import pytest

from agent.net.policy import AllowList, BlockedAddress, Guard, blocked_reason, refusal


@pytest.mark.parametrize("address", [
    "127.0.0.1", "127.8.9.10", "10.1.2.3", "172.16.0.1", "192.168.1.1", "169.254.169.254",
    "169.254.1.1", "100.64.0.1", "100.100.100.200", "0.0.0.0", "224.0.0.1", "::1", "::",
    "fe80::1", "fc00::1", "fd00:ec2::254", "::ffff:127.0.0.1", "::ffff:10.0.0.1",
    "64:ff9b::a00:1", "2002:7f00:1::", "240.0.0.1"])
def test_internal_addresses_are_refused(address: str) -> None:
    reason = blocked_reason("example.com", [address], AllowList())
    assert reason is not None and address in reason and "allow_hosts" in reason


@pytest.mark.parametrize("address", ["93.184.216.34", "8.8.8.8", "2606:4700:4700::1111",
                                     "64:ff9b::808:808"])
def test_public_addresses_pass(address: str) -> None:
    assert blocked_reason("example.com", [address], AllowList()) is None


def test_one_internal_address_among_public_ones_refuses_the_host() -> None:
    assert blocked_reason("rebind.example", ["93.184.216.34", "127.0.0.1"], AllowList())


def test_metadata_names_and_empty_answers_are_refused() -> None:
    assert "metadata" in (blocked_reason("metadata.google.internal", ["8.8.8.8"],
                                         AllowList()) or "")
    assert blocked_reason("example.com", [], AllowList())


def test_allow_hosts_by_name_address_and_network() -> None:
    allow = AllowList.parse(["Intranet.Example", "127.0.0.1", "10.0.0.0/8", "[::1]"])
    assert blocked_reason("intranet.example", ["192.168.1.5"], allow) is None
    assert blocked_reason("localhost", ["127.0.0.1"], allow) is None
    assert blocked_reason("localhost", ["::1"], allow) is None
    assert blocked_reason("git.corp", ["10.20.30.40"], allow) is None
    assert blocked_reason("git.corp", ["10.20.30.40", "192.168.0.1"], allow) is not None
    assert blocked_reason("x.example", ["169.254.169.254"], allow) is not None


def test_the_connect_check_judges_the_address_in_every_spelling() -> None:
    guard = Guard()
    for address in ("127.0.0.1", "::ffff:127.0.0.1", "::ffff:7f00:1", "64:ff9b::7f00:1",
                    "2002:7f00:1::", "0.0.0.0", "::", "fe80::1%eth0", "64:ff9b:1::a00:1"):
        with pytest.raises(BlockedAddress):
            guard.check_connect(address, 80)
    guard.check_connect("93.184.216.34", 80)
    guard.check_connect("64:ff9b::808:808", 443)  # NAT64 of a public address
    with pytest.raises(BlockedAddress, match="not an IP address"):
        guard.check_connect("localhost", 80)
    with pytest.raises(BlockedAddress, match=r"::ffff:7f00:1 \(IPv4 127.0.0.1\) is a loopback"):
        guard.check_connect("::ffff:7f00:1", 80)


def test_unspecified_addresses_are_named_as_such() -> None:
    with pytest.raises(BlockedAddress, match="0.0.0.0 is a unspecified address"):
        Guard().check_connect("0.0.0.0", 80)


def test_an_allowed_name_approves_its_addresses_at_that_port_only() -> None:
    guard = Guard(AllowList.parse(["wiki.lan"]))
    guard.check_host("wiki.lan", 8080, ["192.168.1.10"])
    guard.check_connect("192.168.1.10", 8080)
    with pytest.raises(BlockedAddress, match="192.168.1.10 is a private address"):
        guard.check_connect("192.168.1.10", 22)
    with pytest.raises(BlockedAddress, match="intranet resolves to 10.0.0.1"):
        guard.check_host("intranet", 80, ["10.0.0.1"])


def test_allowed_networks_cover_the_mapped_forms_too() -> None:
    guard = Guard(AllowList.parse(["127.0.0.0/8"]))
    guard.check_connect("127.0.0.1", 1)
    guard.check_connect("::ffff:127.0.0.1", 2)
    with pytest.raises(BlockedAddress):
        guard.check_connect("::1", 3)


def test_an_owner_endpoint_is_trusted_at_its_port() -> None:
    guard = Guard(endpoints=[("127.0.0.1", 8000), ("mcp.lan", 9000)], hint="ask the owner")
    guard.check_host("127.0.0.1", 8000, ["127.0.0.1"])
    guard.check_connect("127.0.0.1", 8000)
    with pytest.raises(BlockedAddress, match="ask the owner"):
        guard.check_connect("127.0.0.1", 8001)
    guard.check_host("MCP.lan.", 9000, ["10.1.1.1"])
    guard.check_connect("10.1.1.1", 9000)
    with pytest.raises(BlockedAddress):
        guard.check_host("mcp.lan", 9001, ["10.1.1.1"])


def test_refusal_finds_the_reason_behind_a_client_error() -> None:
    guard = Guard()
    with pytest.raises(BlockedAddress) as caught:
        guard.check_connect("10.0.0.1", 80)
    try:
        raise aiohttp.ClientConnectionError("wrapped") from caught.value
    except aiohttp.ClientConnectionError as exc:
        assert refusal(exc, guard) == caught.value.reason
    assert refusal(OSError("Multiple exceptions: ..."), guard) == caught.value.reason
    assert refusal(OSError("refused"), Guard()) is None
