"""``parley db stats`` and ``parley db vacuum`` (issue 24): the database's size, and giving back
what retention removed.

A self-contained typer group (``db_app``); other ``db`` commands may join it. Both work beside
a running gateway (SQLite's WAL: readers never block its writer); ``vacuum`` needs a moment with
no writes and waits for one up to ``--wait`` seconds.
"""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing
from typing import Annotated, Any

import typer

from gateway.cli_common import ConfigOpt, fail, load, say

db_app = typer.Typer(help="The database: its size, and retention applied now.",
                     no_args_is_help=True)


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


@db_app.command("stats")
def db_stats(as_json: Annotated[bool, typer.Option("--json", help="As JSON.")] = False,
             config_path: ConfigOpt = None) -> None:
    """Size of the database: rows and bytes per table, bytes per stored turn."""
    from gateway.kernel.store_retention import stats

    conn, config = _open(config_path)
    with closing(conn):
        found = stats(conn)
    wal = config.db_path.with_name(config.db_path.name + "-wal")
    found["wal_bytes"] = wal.stat().st_size if wal.exists() else 0
    if as_json:
        say(json.dumps(found, indent=2))
        return
    say(f"database {config.db_path}: {_kb(found['bytes'])} "
        f"({_kb(found['free_bytes'])} free to reuse), "
        f"write-ahead log {_kb(found['wal_bytes'])}")
    sizes: dict[str, int] = found["table_bytes"]
    rows: dict[str, int] = found["rows"]
    for table in sorted(set(rows) | set(sizes), key=lambda t: -sizes.get(t, 0)):
        if table in rows or sizes.get(table, 0) > 8192:
            say(f"  {table:<24} {rows.get(table, ''):>10} rows  {_kb(sizes.get(table))}")
    say(f"per stored turn: {found['bytes_per_turn'] or '-'} bytes; delivered outbox rows "
        f"kept: {found['delivered_outbox']}; oldest snapshot: {found['oldest_snapshot'] or '-'}")


@db_app.command("vacuum")
def db_vacuum(
    prune: Annotated[bool, typer.Option(
        "--prune/--no-prune", help="Apply the config's retention first (default).")] = True,
    wait: Annotated[float, typer.Option(
        "--wait", help="Seconds to wait for the gateway's writes to pause.")] = 30.0,
    config_path: ConfigOpt = None,
) -> None:
    """Apply retention now, then rewrite the file so the space it freed goes back to the disk."""
    from gateway.kernel.events import utcnow
    from gateway.kernel.store_retention import policy_of, prune_once, stats

    conn, config = _open(config_path, wait)
    with closing(conn):
        before = stats(conn)["bytes"]
        removed: dict[str, int] = {}
        try:
            if prune:
                policy, now = policy_of(config.retention), utcnow()
                while True:
                    conn.execute("BEGIN IMMEDIATE")
                    try:
                        done = prune_once(conn, policy, now)
                    except BaseException:
                        conn.execute("ROLLBACK")
                        raise
                    conn.execute("COMMIT")
                    for table, n in done.removed.items():
                        removed[table] = removed.get(table, 0) + n
                    if not done.more:
                        break
            conn.execute("VACUUM")
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        except sqlite3.OperationalError as exc:
            raise fail(f"could not vacuum {config.db_path}: {exc} (the gateway kept writing "
                       f"for {wait:g} s; try again, or with a longer --wait)") from None
        after = stats(conn)["bytes"]
    said = ", ".join(f"{n} {t}" for t, n in removed.items()) or "nothing"
    say(f"retention removed {said}" if prune else "retention not applied (--no-prune)")
    say(f"database {config.db_path}: {_kb(before)} → {_kb(after)}")
