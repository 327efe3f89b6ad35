"""Every table set of the store, brought to its newest version (``parley db migrate``) or copied
from an SQLite database to PostgreSQL (``parley db copy``).

In ``gateway/`` (not the kernel) because it gathers the table sets of every layer: importing
their modules registers them (``store_sql.register``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from gateway.kernel.snapshot_frame import pack, unpack
from gateway.kernel.store import Store
from gateway.kernel.store_sql import TABLE_SETS, TableSet

OWNERS = ("gateway.kernel.store_schema", "gateway.kernel.pairing", "gateway.kernel.cron_jobs",
          "channels.webchat_store", "channels.discord_cursors", "channels.sent_parts",
          "gateway.kernel.store_pg_cluster", "channels.local_log", "gateway.streaming",
          "channels.webchat_chats", "gateway.kernel.store_search")
"""The modules that own table sets; a new one is added here (docs/architecture.md)."""

BATCH = 500


def table_sets() -> list[TableSet]:
    """Every table set, ``core`` first (the others may refer to its tables)."""
    for name in OWNERS:
        importlib.import_module(name)
    return sorted(TABLE_SETS.values(), key=lambda t: (t.name != "core", t.name))


async def migrate_all(store: Store) -> dict[str, int]:
    """Bring every table set to its newest version; each one's version now."""
    return {tables.name: await store.migrate(tables) for tables in table_sets()}


class NotEmpty(Exception):
    """The destination already holds rows: copying would mix two histories."""


async def copy_store(source: Store, dest: Store,
                     progress: Callable[[str, int], None] = lambda table, n: None
                     ) -> dict[str, int]:
    """Copy every row of every table from ``source`` into the empty ``dest`` (each table in
    its own order, generated ids kept, PostgreSQL's sequences moved past them); rows per
    table. Raises ``NotEmpty`` before writing anything when ``dest`` has rows."""
    sets = table_sets()
    for tables in sets:
        await source.migrate(tables)
        await dest.migrate(tables)
    for tables in sets:
        for table in tables.tables:
            if not await dest.columns(table):
                continue
            row = await dest._fetchone(f"SELECT COUNT(*) FROM {table}", ())
            if row and int(row[0]):
                raise NotEmpty(f"{dest.target} already has rows in {table}: copy into an "
                               "empty database")
    copied: dict[str, int] = {}
    for tables in sets:
        for table in tables.tables:
            copied[table] = await _copy_table(source, dest, table, tables)
            progress(table, copied[table])
    if dest.dialect == "postgresql":  # index the copied messages for session search
        await dest._write(lambda db: db.execute("DELETE FROM search_backfill"))
        await dest._write(lambda db: db.execute("DELETE FROM message_search_plain"))
        await dest.backfill_search()
    return copied


async def _copy_table(source: Store, dest: Store, table: str, tables: TableSet) -> int:
    have = await dest.columns(table)
    cols = [c for c in await _ordered_columns(source, table) if c in have]
    if not cols:  # not in the source (SQLite's search index may be FTS5 instead)
        return 0
    names = ", ".join(cols)
    insert = f"INSERT INTO {table} ({names}) VALUES ({', '.join('?' * len(cols))})"
    order = "1"
    if source.dialect == "sqlite":  # insertion order, where the table has one
        made = await source._fetchone("SELECT sql FROM sqlite_master WHERE name = ?", (table,))
        order = "1" if made and "WITHOUT ROWID" in str(made[0]).upper() else "rowid"
    batch: list[tuple[Any, ...]] = []
    count = 0

    async def flush() -> None:
        rows = list(batch)
        batch.clear()
        await dest._write(lambda db: db.executemany(insert, rows))

    packed = cols.index("detail") if table == "context_snapshots" and "detail" in cols else None
    async for row in source.iterate(f"SELECT {names} FROM {table} ORDER BY {order}"):
        values = tuple(row)
        if packed is not None:  # SQLite packs a snapshot's JSON; each store writes its own
            detail = unpack(values[packed])
            values = (*values[:packed], pack(detail) if dest.dialect == "sqlite" else detail,
                      *values[packed + 1:])
        batch.append(values)
        count += 1
        if len(batch) >= BATCH:
            await flush()
    if batch:
        await flush()
    column = tables.generated_ids.get(table)
    if column and dest.dialect == "postgresql":
        await dest._fetchone(
            f"SELECT setval(pg_get_serial_sequence('{table}', '{column}'), "
            f"COALESCE(MAX({column}), 1), MAX({column}) IS NOT NULL) FROM {table}", ())
    return count


async def _ordered_columns(store: Store, table: str) -> list[str]:
    if store.dialect == "sqlite":
        return [r[1] for r in await store._fetchall(f"PRAGMA table_info({table})", ())]
    rows = await store._fetchall(
        "SELECT column_name FROM information_schema.columns WHERE table_name = ? "
        "ORDER BY ordinal_position", (table,))
    return [r[0] for r in rows]
