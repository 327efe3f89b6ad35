"""``parley db migrate|copy``: the store's schema versions, and moving an SQLite store to
PostgreSQL (issue 19: several gateway processes on one database)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gateway.cli_common import ConfigOpt, fail, load, out, run_sync

db_app = typer.Typer(help="The store: schema versions, SQLite to PostgreSQL.",
                     no_args_is_help=True)


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
