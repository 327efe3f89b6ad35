"""Discord read positions across restarts (``channels/discord_cursors.py``)."""

from __future__ import annotations

from pathlib import Path

from channels.discord_cursors import KEEP_SECONDS, Cursors
from gateway.kernel.store import Store


async def test_positions_only_move_forward_and_old_ones_are_forgotten(tmp_path: Path) -> None:
    now = [1_000_000.0]
    store = await Store.open(tmp_path / "p.db")
    try:
        cursors = Cursors(store, clock=lambda: now[0])
        await cursors.setup()
        await cursors.save(10, 1, 500)
        await cursors.save(10, 1, 400)  # a read-back handled an older message after a newer one
        now[0] += 1
        await cursors.save(20, None, 900)  # a DM: no guild
        assert list((await cursors.load(50)).items()) == [(10, (1, 500)), (20, (None, 900))]
        assert list(await cursors.load(1)) == [20]  # the most recently active first kept
        now[0] += KEEP_SECONDS
        await cursors.setup()  # channel 10 fell quiet more than a day ago
        assert list(await cursors.load(50)) == [20]
    finally:
        await store.close()
