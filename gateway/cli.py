"""The ``parley`` command. Every subcommand takes ``--config FILE``; errors go to stderr
with a non-zero exit status, never as a traceback.

This module holds the app, ``gateway`` and ``chat``; the other commands live in ``cli_*``
modules (config, onboard, doctor, status/sessions/context, backup, cron, pairing, usage)."""

from __future__ import annotations

import contextlib
import logging
import signal
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from gateway.cli_backup import backup
from gateway.cli_common import ConfigOpt, err, load, run_sync, say
from gateway.cli_config import config_check
from gateway.cli_cron import cron_app
from gateway.cli_db import db_app
from gateway.cli_doctor import doctor
from gateway.cli_inspect import context_app, sessions_app, status
from gateway.cli_onboard import ONBOARD_CONFIG, onboard
from gateway.cli_pairing import pairing_app
from gateway.cli_usage import usage_command
from gateway.kernel.config import Config, ConfigError
from gateway.kernel.secrets import SECRETS, RedactingFilter, register_secrets

__all__ = ["ONBOARD_CONFIG", "app", "main"]

app = typer.Typer(help="Parley: one AI agent on your chat channels.", no_args_is_help=True,
                  add_completion=False, pretty_exceptions_enable=False)
config_app = typer.Typer(help="Check the configuration.", no_args_is_help=True)
config_app.command("check")(config_check)
app.command("onboard")(onboard)
app.command("doctor")(doctor)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        say(f"parley {version('parley')}")
        raise typer.Exit()


@app.callback()
def _root(version: Annotated[bool, typer.Option(
        "--version", callback=_version, is_eager=True, help="Print the version and exit.")]
        = False) -> None:
    """Parley: one AI agent on your chat channels."""


class _CurrentStderr(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is at the time: the terminal chat's prompt and
    spinner swap it for a proxy that prints above them, so a log line never draws over."""

    @property  # type: ignore[override]
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, _: Any) -> None:
        pass


def _setup_logging(config: Config, *, quiet: bool = False) -> None:
    level = logging.WARNING if quiet else getattr(logging, config.logging.level)
    handlers: list[logging.Handler] = [_CurrentStderr()]
    if config.logging.file:
        path = Path(config.logging.file).expanduser()
        path.parent.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(path, encoding="utf-8"))
    register_secrets(config)
    for handler in handlers:  # every record, whichever library wrote it
        handler.addFilter(RedactingFilter(SECRETS))
    logging.basicConfig(level=level, handlers=handlers, force=True,
                        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s")
    for noisy in ("aiohttp.access", "httpx", "LiteLLM", "aiosqlite", "markdown_it"):
        logging.getLogger(noisy).setLevel(max(level, logging.WARNING))


def _ready(config_path: Path | None, *, ports: bool) -> Config:
    """The config, once nothing found before start would stop the gateway: one line per
    problem (its key and what to do) and exit status 2 otherwise."""
    from gateway.preflight import path_problems, port_problems

    config = load(config_path)
    problems = path_problems(config) + (port_problems(config) if ports else [])
    if problems:
        for problem in problems:
            say(f"error: {problem}", err)
        raise typer.Exit(2)
    return config


# gateway and chat -----------------------------------------------------------------------------

@app.command()
def gateway(config_path: ConfigOpt = None) -> None:
    """Run the gateway with every enabled channel until Ctrl-C or SIGTERM."""
    from gateway.app import Gateway

    config = _ready(config_path, ports=True)
    _setup_logging(config)
    gw = Gateway(config)
    run_sync(gw.run_until_signalled(), config, fast_loop=True)


@app.command()
def chat(
    config_path: ConfigOpt = None,
    message: Annotated[str | None, typer.Option("--message", "-m",
                                                help="Send one message, print the answer.")]
    = None,
    plain: Annotated[bool, typer.Option(help="Print replies as plain text.")] = False,
) -> None:
    """Talk to the agent in the terminal (same agent and sessions as the gateway)."""
    from channels.terminal import TerminalChannel, leaving
    from gateway.app import Gateway

    config = _ready(config_path, ports=False)
    _setup_logging(config, quiet=True)

    async def main() -> int:
        gw = Gateway(config, configured_channels=False)
        terminal = TerminalChannel(config.channels.terminal, gw.bus,
                                   markdown=not plain and message is None)
        gw.manager.add(terminal)
        with contextlib.ExitStack() as closing:
            async with gw:
                if message is not None:
                    answer = await terminal.ask(message)
                    return 1 if answer.kind == "error" else 0
                await terminal.interactive(history=config.data_path / "chat_history")
                closing.enter_context(leaving())  # the gateway's shutdown, after the person left
        return 0

    code = run_sync(main(), config)
    if message is None:  # left cleanly: a late Ctrl-C while the interpreter exits is moot
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise typer.Exit(code)


# registered after gateway and chat, so `parley --help` lists them in this order
app.command("status")(status)
app.add_typer(config_app, name="config")
app.add_typer(sessions_app, name="sessions")
app.add_typer(context_app, name="context")
app.add_typer(pairing_app, name="pairing")
app.add_typer(cron_app, name="cron")
app.add_typer(db_app, name="db")  # migrate/copy (issue 19), stats/vacuum (issue 24)
app.command("usage")(usage_command)
app.command("backup")(backup)


def main() -> None:
    try:
        app()
    except ConfigError as exc:  # pragma: no cover - load() handles the usual path
        err.print(str(exc), markup=False)
        sys.exit(2)
