"""What every ``parley`` subcommand module shares: the consoles, ``--config``, loading the
config, running a coroutine, opening the store, failing with a clear message."""

from __future__ import annotations

import asyncio
import os
import sqlite3
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from gateway.kernel.config import Config, ConfigError, load_config

out = Console()
err = Console(stderr=True)
T = TypeVar("T")

ConfigOpt = Annotated[Path | None, typer.Option(
    "--config", "-c", help="Config file (default: $PARLEY_CONFIG, else ~/.parley/config.yaml).",
    show_default=False)]


def fail(message: str, code: int = 1) -> typer.Exit:
    """Print ``error: message`` to stderr; the message is text, never read as markup (it may
    hold a job's name, a session key or a path with brackets)."""
    err.print(Text.assemble(("error:", "bold red"), " ", message), highlight=False,
              soft_wrap=True)
    return typer.Exit(code)


def say(text: str, console: Console = out) -> None:
    """Print stored or user-given text as it is: no markup, no highlighting, no hard wrap."""
    console.print(text, markup=False, highlight=False, soft_wrap=True)


def load(config_path: Path | None) -> Config:
    try:
        return load_config(config_path)
    except ConfigError as exc:
        err.print(str(exc), markup=False, highlight=False)
        raise typer.Exit(2) from None


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop (libuv: about a third less CPU per turn than asyncio's own, measured
    in ``bench/``) unless ``PARLEY_EVENT_LOOP=asyncio`` asks for the standard one."""
    if os.environ.get("PARLEY_EVENT_LOOP", "").strip().lower() == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def run_sync(coro: Coroutine[Any, Any, T], config: Config | None = None, *,
             fast_loop: bool = False) -> T:
    """Run ``coro``; a failure an operator can fix (a port in use, a corrupt or locked
    database, a full disk, a bad path) ends in one line saying what to do, not a traceback."""
    from gateway.preflight import explain

    try:
        with asyncio.Runner(loop_factory=loop_factory() if fast_loop else None) as runner:
            return runner.run(coro)
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    except (OSError, sqlite3.DatabaseError) as exc:
        line = explain(exc, config) if config is not None else None
        raise fail(line or f"{type(exc).__name__}: {exc}") from None
    except ConfigError as exc:  # found at start (a window too small for the fixed part)
        raise fail(str(exc)) from None


async def with_store(config: Config, fn: Any) -> Any:
    if not config.database and not config.db_path.exists():
        raise fail(f"no database at {config.db_path} yet (start the gateway or `parley chat` "
                    "first)")
    store = await open_store(config)
    try:
        return await fn(store)
    finally:
        await store.close()


async def open_store(config: Config) -> Any:
    """The config's database, or one line saying why it cannot be opened."""
    from gateway.kernel.store import Store
    from gateway.preflight import explain

    try:
        return await Store.open(config.store_target)
    except (OSError, sqlite3.DatabaseError) as exc:
        raise fail(explain(exc, config) or f"{config.store_label}: {exc}") from None


def add_row(table: Table, *values: object) -> None:
    """A table row of plain text: stored names and keys are never read as markup."""
    table.add_row(*(Text(str(v)) for v in values))
