"""Fixtures the end-to-end tests share."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.fakes.discord_server import FakeDiscord


@pytest.fixture
async def dc() -> AsyncIterator[FakeDiscord]:
    """A fake Discord (REST and gateway websocket) on loopback."""
    async with FakeDiscord(heartbeat_interval=0.5) as server:
        yield server
