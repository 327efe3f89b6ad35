"""Waiting for what the gateway is doing, not for time to pass.

A test that needs "b and c arrived while a was running" holds a's answer (``ScriptedLLM.hold``),
sends b and c, waits here until the agent has them in the session's lane, and only then
releases the answer. The timeout is a safety cap that fails a hung test; the outcome is
decided by the condition alone.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from gateway.app import Gateway

SPINS = 50
PAUSE = 0.001
"""``until`` looks again after each yield to the event loop (the gateway's own steps need
nothing more), and every ``SPINS`` looks pauses ``PAUSE`` seconds so that threads (aiosqlite,
a fake's thread) get the CPU instead of a spinning test. How often it looks decides nothing."""


async def until(condition: Callable[[], bool], what: str | Callable[[], str],
                timeout: float = 10.0) -> None:  # noqa: ASYNC109 - a safety cap, not a decision
    """Return as soon as ``condition()`` holds; AssertionError naming ``what`` after ``timeout``."""
    try:
        async with asyncio.timeout(timeout):
            spins = 0
            while not condition():
                spins += 1
                await asyncio.sleep(0 if spins % SPINS else PAUSE)
    except TimeoutError:
        said = what if isinstance(what, str) else what()
        raise AssertionError(f"still waiting after {timeout}s for {said}") from None


async def queued(gw: Gateway, session_key: str, n: int) -> None:
    """Wait until ``n`` messages wait in the session's lane behind its running turn."""
    agent = gw.agent
    assert agent is not None, "the gateway is not started"
    lanes = agent.lanes
    await until(lambda: lanes.waiting_messages(session_key) >= n,
                lambda: f"{n} message(s) queued in {session_key}, "
                        f"{lanes.waiting_messages(session_key)} are")
