"""Where reading Discord left off, per channel, kept in SQLite.

Discord does not queue messages for a bot that is not connected: what is said while the
gateway is stopped (an upgrade, a crash, a reboot) reaches it only if it reads the channel's
history when it comes back. The inbound worker records the last message it handled in each
channel; on start, the channels active within ``KEEP_SECONDS`` are read back from there, as
after a session Discord could not resume. A message answered before the stop is not answered
again: its id is already in the inbox.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

from gateway.kernel.store import Store
from gateway.kernel.store_sql import Migration, TableSet, register, twin

KEEP_SECONDS = 24 * 3600.0
"""Read back at most a day: what Telegram keeps for a bot that was away, for the same reason
(an answer to something said a week ago is more confusing than none)."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS discord_cursors (
    channel_id INTEGER PRIMARY KEY,
    guild_id INTEGER,
    last_id INTEGER NOT NULL,
    updated_at REAL NOT NULL
);
"""
_SCHEMA_PG = _SCHEMA.replace("INTEGER", "BIGINT").replace("REAL", "DOUBLE PRECISION")
"""PostgreSQL's twin: Discord's ids are 64-bit (BIGINT), times DOUBLE PRECISION."""
TABLES = register(TableSet("discord", (Migration(1, _SCHEMA, _SCHEMA_PG),),
                           ("discord_cursors",)))
_SAVE = twin(
    "INSERT INTO discord_cursors (channel_id, guild_id, last_id, updated_at) "
    "VALUES (?, ?, ?, ?) ON CONFLICT (channel_id) DO UPDATE SET "
    "guild_id = excluded.guild_id, last_id = max(last_id, excluded.last_id), "
    "updated_at = excluded.updated_at",
    "INSERT INTO discord_cursors (channel_id, guild_id, last_id, updated_at) "
    "VALUES (%s, %s, %s, %s) ON CONFLICT (channel_id) DO UPDATE SET "
    "guild_id = EXCLUDED.guild_id, "
    "last_id = GREATEST(discord_cursors.last_id, EXCLUDED.last_id), "
    "updated_at = EXCLUDED.updated_at")


Cursor = tuple[int | None, int]
"""(guild id or None for a DM, id of the last message handled in the channel)."""


class Cursors:
    def __init__(self, store: Store, *, clock: Callable[[], float] = time.time) -> None:
        self._store = store
        self._clock = clock

    async def setup(self) -> None:
        """Create the table and forget channels quiet for longer than ``KEEP_SECONDS``."""
        await self._store.migrate(TABLES)
        async with self._store.transaction() as db:
            await db.execute("DELETE FROM discord_cursors WHERE updated_at < ?",
                             (self._clock() - KEEP_SECONDS,))

    async def load(self, limit: int) -> OrderedDict[int, Cursor]:
        """The ``limit`` most recently active channels, oldest first."""
        rows = await self._store.fetchall(
            "SELECT channel_id, guild_id, last_id FROM discord_cursors "
            "ORDER BY updated_at DESC LIMIT ?", (limit,))
        return OrderedDict((int(r[0]), (r[1], int(r[2]))) for r in reversed(rows))

    async def save(self, channel_id: int, guild_id: int | None, last_id: int) -> None:
        async with self._store.transaction() as db:
            await db.execute(_SAVE, (channel_id, guild_id, last_id, self._clock()))
