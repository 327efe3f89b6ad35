"""``parley db``: the store's schema versions and moving an SQLite store to PostgreSQL
(``migrate``, ``copy``: issue 19, several gateway processes on one database), and its size and
giving back what retention removed (``stats``, ``vacuum``: issue 24).

``stats`` and ``vacuum`` work beside a running gateway (SQLite's WAL: readers never block its
writer; PostgreSQL: plain ``VACUUM`` takes no lock a gateway waits on); on SQLite ``vacuum``
needs a moment with no writes and waits for one up to ``--wait`` seconds.
"""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Annotated, Any

import typer

from gateway.cli_common import ConfigOpt, fail, load, out, run_sync, say

db_app = typer.Typer(help="The store: schema versions, SQLite to PostgreSQL, its size, "
                     "retention applied now.", no_args_is_help=True)


@db_app.command("migrate")
def db_migrate(config_path: ConfigOpt = None) -> None:
    """Create the store's tables or bring them to the newest version (safe to run again)."""
    from gateway.db_copy import migrate_all
    from gateway.kernel.store import Store

    config = load(config_path)

    async def run() -> dict[str, int]:
        store = await Store.open(config.store_target)
        try:
            return await migrate_all(store)
        finally:
            await store.close()

    versions = run_sync(run())
    out.print(f"{config.store_label}: " + ", ".join(f"{k} v{v}" for k, v in versions.items()),
              highlight=False)


@db_app.command("copy")
def db_copy(
    to: Annotated[str | None, typer.Option(
        "--to", help="The PostgreSQL URL to copy into (default: the config's `database`).",
        show_default=False)] = None,
    source: Annotated[Path | None, typer.Option(
        "--from", help="The SQLite file to copy (default: data_dir/parley.db).",
        show_default=False)] = None,
    config_path: ConfigOpt = None,
) -> None:
    """Copy every table of an SQLite store into an empty PostgreSQL database. Stop the
    gateway first; the SQLite file is only read."""
    from gateway.db_copy import NotEmpty, copy_store
    from gateway.kernel.store import Store
    from gateway.kernel.store_sql import hide_password, is_postgres_url

    config = load(config_path)
    url = to or (config.database.get_secret_value() if config.database else None)
    if not url or not is_postgres_url(url):
        raise fail("--to must be a postgresql:// URL (or set `database` in the config)")
    path = source or config.db_path
    if not path.exists():
        raise fail(f"no SQLite database at {path}")

    async def run() -> dict[str, int]:
        src = await Store.open(path)
        try:
            dest = await Store.open(url)
            try:
                return await copy_store(src, dest)
            finally:
                await dest.close()
        finally:
            await src.close()

    try:
        copied = run_sync(run())
    except NotEmpty as exc:
        raise fail(str(exc)) from None
    except ConnectionError as exc:
        raise fail(str(exc)) from None
    total = sum(copied.values())
    out.print(f"copied {total} row(s) from {path} to {hide_password(url)}: "
              + ", ".join(f"{t} {n}" for t, n in copied.items() if n), highlight=False)


def _kb(n: int | None) -> str:
    return "-" if n is None else f"{n / 1024:,.1f} KB"


def _open(config_path: Any, wait: float = 5.0) -> tuple[sqlite3.Connection, Any]:
    config = load(config_path)
    path = config.db_path
    if not path.is_file():
        raise fail(f"no database at {path} yet")
    try:
        conn = sqlite3.connect(path, timeout=wait, isolation_level=None)
    except sqlite3.Error as exc:
        raise fail(f"cannot open {path}: {exc}") from None
    return conn, config


def _on_postgres(config: Any, work: Any) -> Any:
    """``work(store)`` on the configured PostgreSQL store (a clear error when unreachable)."""
    from gateway.kernel.store import Store

    async def run() -> Any:
        store = await Store.open(config.store_target)
        try:
            return await work(store)
        finally:
            await store.close()

    try:
        return run_sync(run())
    except ConnectionError as exc:
        raise fail(str(exc)) from None


def _add(total: dict[str, int], removed: dict[str, int]) -> None:
    for table, n in removed.items():
        if n:
            total[table] = total.get(table, 0) + n


FEW_TURNS = 100
"""Below this many turns, ``db stats`` says its bytes per turn are mostly empty pages."""


@db_app.command("stats")
def db_stats(as_json: Annotated[bool, typer.Option("--json", help="As JSON.")] = False,
             config_path: ConfigOpt = None) -> None:
    """Size of the database: rows and bytes per table, bytes per stored turn."""
    from gateway.kernel.store_retention import stats, stats_store

    config = load(config_path)
    if config.database:
        found = _on_postgres(config, stats_store)
        found["wal_bytes"] = None
        where = f"database {config.store_label}: {_kb(found['bytes'])}"
    else:
        conn, config = _open(config_path)
        with closing(conn):
            found = stats(conn)
        wal = config.db_path.with_name(config.db_path.name + "-wal")
        found["wal_bytes"] = wal.stat().st_size if wal.exists() else 0
        where = (f"database {config.db_path}: {_kb(found['bytes'])} "
                 f"({_kb(found['free_bytes'])} free to reuse), "
                 f"write-ahead log {_kb(found['wal_bytes'])}")
    if as_json:
        say(json.dumps(found, indent=2))
        return
    say(where)
    sizes: dict[str, int] = found["table_bytes"]
    rows: dict[str, int] = found["rows"]
    for table in sorted(set(rows) | set(sizes), key=lambda t: -sizes.get(t, 0)):
        if table in rows or sizes.get(table, 0) > 8192:
            say(f"  {table:<24} {rows.get(table, ''):>10} rows  {_kb(sizes.get(table))}")
    turns = rows.get("turns", 0)
    per_turn = found["bytes_per_turn"]
    # every table and index starts with a page of its own: over a handful of turns the
    # figure is those pages, not what a turn costs
    few = "; mostly the pages every table starts with" if 0 < turns < FEW_TURNS else ""
    say(f"per stored turn: {f'{per_turn:,} bytes over {turns:,} turns' if per_turn else '-'}"
        f"{few}; delivered outbox rows kept: {found['delivered_outbox']}; oldest snapshot: "
        f"{found['oldest_snapshot'] or '-'}")


async def _vacuum_postgres(store: Any, policy: Any, now: Any) -> tuple[int, dict[str, int], int]:
    """(bytes before, rows removed, bytes after) on PostgreSQL: retention a batch per
    transaction, then ``VACUUM`` (space reused by the tables; ``VACUUM FULL`` would lock out
    the running gateways)."""
    from gateway.kernel.store_retention import prune_store, stats_store, sweep_texts_store

    before = (await stats_store(store))["bytes"]
    removed: dict[str, int] = {}
    if policy is not None:
        while True:
            done = await prune_store(store, policy, now)
            _add(removed, done.removed)
            if not done.more:
                break
        _add(removed, {"layer_texts": len(await sweep_texts_store(store, policy, now))})
    await store.vacuum()
    return before, removed, (await stats_store(store))["bytes"]


@db_app.command("vacuum")
def db_vacuum(
    prune: Annotated[bool, typer.Option(
        "--prune/--no-prune", help="Apply the config's retention first (default).")] = True,
    wait: Annotated[float, typer.Option(
        "--wait", help="Seconds to wait for the gateway's writes to pause (SQLite).")] = 30.0,
    config_path: ConfigOpt = None,
) -> None:
    """Apply retention now, then rewrite the file so the space it freed goes back to the disk
    (on PostgreSQL: ``VACUUM``, the space reused by the tables)."""
    from gateway.kernel.events import utcnow
    from gateway.kernel.store_retention import policy_of, prune_once, stats, sweep_texts

    config = load(config_path)
    policy, now = policy_of(config.retention), utcnow()
    if config.database:
        before, removed, after = _on_postgres(
            config, lambda store: _vacuum_postgres(store, policy if prune else None, now))
        label = config.store_label
    else:
        conn, config = _open(config_path, wait)
        label = str(config.db_path)
        with closing(conn):
            before = stats(conn)["bytes"]
            removed = {}
            try:
                # a batch per transaction; then the texts no kept snapshot names, at once
                for rule in (prune_once, sweep_texts) if prune else ():
                    while True:
                        conn.execute("BEGIN IMMEDIATE")
                        try:
                            done = rule(conn, policy, now)
                        except BaseException:
                            conn.execute("ROLLBACK")
                            raise
                        conn.execute("COMMIT")
                        _add(removed, done.removed)
                        if not done.more:
                            break
                conn.execute("VACUUM")
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            except sqlite3.OperationalError as exc:
                raise fail(f"could not vacuum {config.db_path}: {exc} (the gateway kept "
                           f"writing for {wait:g} s; try again, or with a longer --wait)"
                           ) from None
            after = stats(conn)["bytes"]
    said = ", ".join(f"{n} {t}" for t, n in removed.items()) or "nothing"
    say(f"retention removed {said}" if prune else "retention not applied (--no-prune)")
    say(f"database {label}: {_kb(before)} → {_kb(after)}")
