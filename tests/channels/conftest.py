"""Fixtures that several test modules here share: the local channel on a real bus with an HTTP
client (``test_local``, ``test_local_replies``), a fresh store (the WebChat tests), and a
whole gateway with WebChat on and a page that talks to it (``test_webchat``,
``test_webchat_access``; defined in ``webchat_page``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from channels.local import LocalChannel
from gateway.kernel.bus import MessageBus
from gateway.kernel.config import LocalChannelConfig
from gateway.kernel.pairing import PairingStore
from gateway.kernel.store import Store
from tests.channels.webchat_page import gw, page, webchat_config  # noqa: F401 (fixtures)


def make_channel(tmp_path: Path, bus: MessageBus, **config: Any) -> LocalChannel:
    settings: dict[str, Any] = {"port": 0, "max_text_chars": 1000, "max_media_bytes": 1024}
    settings.update(config)
    return LocalChannel(LocalChannelConfig(**settings), bus, workspace=tmp_path,
                        health=lambda: {"gateway": "up", "sessions": 3})


@pytest.fixture
def bus() -> MessageBus:
    return MessageBus()


@pytest.fixture
async def channel(tmp_path: Path, bus: MessageBus) -> AsyncIterator[LocalChannel]:
    ch = make_channel(tmp_path, bus)
    await ch.start()
    yield ch
    await ch.stop()


@pytest.fixture
async def http(channel: LocalChannel) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(base_url=channel.base_url) as session:
        yield session


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    db = await Store.open(tmp_path / "db" / "parley.db")
    yield db
    await db.close()


@pytest.fixture
async def pairing(tmp_path: Path) -> AsyncIterator[PairingStore]:
    """Pairing codes and approvals in a database of their own."""
    store = await Store.open(tmp_path / "parley.db")
    try:
        yield PairingStore(store)
    finally:
        await store.close()
