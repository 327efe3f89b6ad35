"""Fixtures the gateway tests share."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.kernel.store import Store


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    """A fresh database in ``tmp_path/parley.db``."""
    opened = await Store.open(tmp_path / "parley.db")
    try:
        yield opened
    finally:
        await opened.close()
