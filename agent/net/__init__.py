"""Outbound connections the agent can cause, under one guard.

``policy.Guard`` decides on the numeric address each socket connects to (loopback, private,
link-local, multicast, reserved, unspecified, cloud-metadata and IPv4-in-IPv6 forms of them are
refused unless allowed). Every client that fetches on the agent's behalf is made here:
``guarded_session`` (aiohttp: web_fetch, web_search) and ``guarded_httpx_client`` (httpx2:
MCP over HTTP). No proxies, no environment settings: the guard sees the real target.
"""

from agent.net.aiohttp_client import guarded_session
from agent.net.httpx_client import guarded_httpx_client, url_endpoint
from agent.net.policy import AllowList, BlockedAddress, Guard, refusal

__all__ = ["AllowList", "BlockedAddress", "Guard", "guarded_httpx_client", "guarded_session",
           "refusal", "url_endpoint"]
