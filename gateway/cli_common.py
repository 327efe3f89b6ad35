"""What every ``parley`` subcommand module shares: the consoles, ``--config``, loading the
config, running a coroutine, opening the store, failing with a clear message."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console

from gateway.kernel.config import Config, ConfigError, load_config

out = Console()
err = Console(stderr=True)
T = TypeVar("T")

ConfigOpt = Annotated[Path | None, typer.Option(
    "--config", "-c", help="Config file (default: $PARLEY_CONFIG, else ~/.parley/config.yaml).",
    show_default=False)]


def fail(message: str, code: int = 1) -> typer.Exit:
    err.print(f"[bold red]error:[/bold red] {message}", highlight=False, markup=True)
    return typer.Exit(code)


def load(config_path: Path | None) -> Config:
    try:
        return load_config(config_path)
    except ConfigError as exc:
        err.print(str(exc), markup=False, highlight=False)
        raise typer.Exit(2) from None


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    try:
        return asyncio.run(coro)
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    except OSError as exc:
        raise fail(str(exc)) from None


async def with_store(config: Config, fn: Any) -> Any:
    from gateway.kernel.store import Store

    if not config.database and not config.db_path.exists():
        raise fail(f"no database at {config.db_path} yet (start the gateway or `parley chat` "
                    "first)")
    store = await Store.open(config.store_target)
    try:
        return await fn(store)
    finally:
        await store.close()
