"""``parley backup``: a consistent copy of the database, taken while the gateway runs.

SQLite's online backup API copies the pages under a read transaction, so a copy taken during
writes is still one committed state (WAL readers do not block the gateway's writer). The copy
is checked (``PRAGMA quick_check``) before it is reported. Restoring is copying it back while
the gateway is stopped (README, "Backups").
"""

from __future__ import annotations

import sqlite3
from contextlib import closing
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer

from gateway.cli_common import ConfigOpt, fail, load, say

# gateway.cli imports this module to register it: the rest is imported when a command runs.


def copy_database(source: Path, target: Path) -> int:
    """Copy ``source`` into a new ``target`` with the backup API; the copy's message count."""
    with closing(sqlite3.connect(source, timeout=30)) as src, \
            closing(sqlite3.connect(target)) as dst:
        src.backup(dst)
        (check,) = dst.execute("PRAGMA quick_check").fetchone()
        if check != "ok":
            raise sqlite3.DatabaseError(f"the copy failed its check: {check}")
        try:
            (count,) = dst.execute("SELECT COUNT(*) FROM messages").fetchone()
        except sqlite3.OperationalError:  # not Parley's database after all
            raise sqlite3.DatabaseError("file is not a database (no messages table)") from None
    return int(count)


def backup(
    to: Annotated[Path | None, typer.Option(
        "--to", help="The copy's file (default: data_dir/backups/parley-<UTC time>.db).")]
    = None,
    config_path: ConfigOpt = None,
) -> None:
    """Copy the database now, safely while the gateway runs."""
    from gateway.preflight import explain

    config = load(config_path)
    if config.database:
        raise fail("the store is on PostgreSQL (`database`): back it up with pg_dump")
    source = config.db_path
    if not source.is_file():
        raise fail(f"no database at {source} yet (nothing to back up)")
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    target = (to.expanduser() if to else config.data_path / "backups" / f"parley-{stamp}.db")
    if target.exists():
        raise fail(f"{target} exists; name another file with --to")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        count = copy_database(source, target)
    except (OSError, sqlite3.DatabaseError) as exc:
        target.unlink(missing_ok=True)
        raise fail(explain(exc, config) or f"backup failed: {exc}") from None
    size = target.stat().st_size
    say(f"backed up {source} to {target} ({size:,} bytes, {count:,} message(s))")
    say("restore: stop the gateway, then copy it back as " f"{source} (see README, Backups)")
