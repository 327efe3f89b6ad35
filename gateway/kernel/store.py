"""The one SQLite database (WAL) behind sessions, messages, turns and context snapshots.

One aiosqlite connection; writes go through ``transaction()`` under a lock so two concurrent
turns never interleave statements in one transaction. Each message's token count is stored
once, when it is written, and history is read newest-first with a LIMIT, never whole.

``Store`` is put together from one class per group of tables, each in its own module:
``store_db`` (the connection, schema and write lock), ``store_sessions`` (sessions, messages,
compactions, a turn's write), ``store_queues`` (inbox, outbox) and ``store_snapshots``
(snapshots, usage) and ``store_usage`` (the usage ledger's reads, limit notices, each
conversation's model). The row types and ``content_text`` are re-exported here, so
``from gateway.kernel.store import StoredMessage`` keeps working wherever it is written.
"""

from __future__ import annotations

import asyncio
from contextlib import suppress
from pathlib import Path
from typing import Self, cast

from gateway.kernel.store_db import SCHEMA_VERSION
from gateway.kernel.store_queues import PendingOutbound, QueueTables
from gateway.kernel.store_search import SearchHit, SearchTables, content_text
from gateway.kernel.store_sessions import (
    Compaction,
    LLMCallRecord,
    NewMessage,
    SessionRow,
    SessionTables,
    StoredMessage,
    UsageTags,
)
from gateway.kernel.store_snapshots import SnapshotTables
from gateway.kernel.store_sql import is_postgres_url
from gateway.kernel.store_usage import UsageRow, UsageTables

__all__ = [
    "SCHEMA_VERSION", "Compaction", "LLMCallRecord", "NewMessage", "PendingOutbound",
    "SearchHit",
    "SessionRow", "Store", "StoredMessage", "UsageRow", "UsageTags", "content_text",
]


class Store(SessionTables, QueueTables, SnapshotTables, UsageTables, SearchTables):
    """The database: open with ``await Store.open(path)``, close once with ``close()``.
    A ``postgresql://`` URL instead of a path opens it on PostgreSQL (``store_pg``)."""

    @classmethod
    async def open(cls, path: Path | str) -> Self:
        if is_postgres_url(path):
            from gateway.kernel.store_pg import PgStore  # psycopg only where it is used

            return cast(Self, await PgStore.connect(str(path)))
        store = await super().open(Path(path))
        try:
            await store.ensure_search()
            await store.backfill_search()
        except BaseException:
            await store.close()
            raise
        return store

    async def close(self) -> None:
        """The messages waiting for the search index go in first (a store that cannot take
        them leaves them for the next open)."""
        if not self._closed:
            if self._indexing is not None:
                await asyncio.gather(self._indexing, return_exceptions=True)
            with suppress(Exception):
                await self.index_messages()
        await super().close()
