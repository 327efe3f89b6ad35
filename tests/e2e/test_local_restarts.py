"""A client of the local channel that does what the README says — pass ``next`` back as
``after`` — gets every reply once, across restarts of the gateway.

On main ``seq`` started at 0 with each start, so after a restart the new replies were numbered
below the client's ``after`` and never shown, and replies not read before a stop were gone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import aiohttp

from gateway.app import Gateway
from tests.conftest import MakeConfig
from tests.e2e.waiting import until
from tests.fakes.openai_server import ScriptedLLM

RESTARTS = 3
PER_RUN = 4


class Follower:
    """A client that keeps only ``after``, as a script following the README would."""

    def __init__(self) -> None:
        self.after = 0
        self.seen: list[dict[str, Any]] = []

    async def read(self, base: str, until_count: int) -> None:
        async with aiohttp.ClientSession() as session:
            while len(self.seen) < until_count:
                params = {"chat_id": "c1", "after": str(self.after), "wait": "10"}
                async with session.get(f"{base}/v1/messages", params=params) as resp:
                    data = await resp.json()
                assert data["messages"], f"no reply after {self.after}; seen {len(self.seen)}"
                self.seen += data["messages"]
                assert data["next"] > self.after
                self.after = data["next"]


def delivered(gw: Gateway, n: int) -> Callable[[], bool]:
    return lambda: gw.manager.delivered >= n


async def post(base: str, text: str) -> None:
    body = {"chat_id": "c1", "sender_id": "u1", "text": text}
    async with aiohttp.ClientSession() as session, \
            session.post(f"{base}/v1/messages", json=body) as resp:
        assert resp.status == 202, await resp.text()


async def test_a_client_following_next_gets_every_reply_once_across_restarts(
        make_config: MakeConfig, llm: ScriptedLLM) -> None:
    llm.echo()
    config = make_config()
    client = Follower()
    sent: list[str] = []
    for run in range(RESTARTS):
        async with Gateway(config, grace=2.0) as gw:
            base = gw.local.base_url
            await client.read(base, len(sent))  # what was left unread before the restart
            for n in range(1, PER_RUN + 1):
                sent.append(f"run {run} message {n}")
                await post(base, sent[-1])
                await until(delivered(gw, n), "the reply delivered")
            # read only half of this run's replies: the rest waits for the next start
            await client.read(base, len(sent) - PER_RUN // 2)
    async with Gateway(config, grace=2.0) as gw:
        await client.read(gw.local.base_url, len(sent))

    texts = [m["text"] for m in client.seen]
    assert texts == [f"echo: {t}" for t in sent]  # all of them, in order, none twice
    seqs = [m["seq"] for m in client.seen]
    assert seqs == sorted(set(seqs))
