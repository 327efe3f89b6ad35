"""The ``parley`` command. Every subcommand takes ``--config FILE``; errors go to stderr
with a non-zero exit status, never as a traceback."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.table import Table
from rich.text import Text

from gateway.cli_common import ConfigOpt, err, fail, load, out, run_sync, with_store
from gateway.cli_cron import cron_app
from gateway.cli_db import db_app
from gateway.cli_pairing import pairing_app
from gateway.cli_usage import usage_command
from gateway.kernel.config import Config, ConfigError
from gateway.kernel.secrets import SECRETS, RedactingFilter, register_secrets

app = typer.Typer(help="Parley: one AI agent on your chat channels.", no_args_is_help=True,
                  add_completion=False, pretty_exceptions_enable=False)
config_app = typer.Typer(help="Check the configuration.", no_args_is_help=True)
sessions_app = typer.Typer(help="Stored conversations.", no_args_is_help=True)
context_app = typer.Typer(help="What the model saw.", no_args_is_help=True)
app.add_typer(config_app, name="config")
app.add_typer(sessions_app, name="sessions")
app.add_typer(context_app, name="context")
app.add_typer(pairing_app, name="pairing")
app.add_typer(cron_app, name="cron")
app.add_typer(db_app, name="db")
app.command("usage")(usage_command)

T = TypeVar("T")




def _setup_logging(config: Config, *, quiet: bool = False) -> None:
    level = logging.WARNING if quiet else getattr(logging, config.logging.level)
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
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


# onboard --------------------------------------------------------------------------------------

ONBOARD_CONFIG = """\
# Parley configuration. Every option, with comments: config.example.yaml in the repository.
workspace: {workspace}
data_dir: {data_dir}

agent:
  # litellm model name: openai/gpt-4o-mini, anthropic/claude-sonnet-4-5, ollama/llama3.1, ...
  model: ${{PARLEY_MODEL:-openai/gpt-4o-mini}}
  # API key; empty means the provider's own variable (OPENAI_API_KEY, ANTHROPIC_API_KEY, ...).
  api_key: ${{PARLEY_API_KEY:-}}
  # An OpenAI-compatible server (Ollama, vLLM, LM Studio): http://localhost:11434/v1
  api_base: ${{PARLEY_API_BASE:-}}

channels:
  local:
    enabled: true
    host: 127.0.0.1
    port: 8765
"""


@app.command()
def onboard(
    directory: Annotated[Path, typer.Option("--dir", help="Where config and workspace go.")] =
    Path("~/.parley"),
    config_path: ConfigOpt = None,
    force: Annotated[bool, typer.Option(help="Overwrite an existing config.")] = False,
) -> None:
    """Write a config file and a workspace from the templates."""
    from workspace.bootstrap import seed_workspace

    base = directory.expanduser()
    target = config_path.expanduser() if config_path else base / "config.yaml"
    workspace = base / "workspace"
    if target.exists() and not force:
        out.print(f"config {target} exists; kept it (use --force to overwrite)")
    else:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(ONBOARD_CONFIG.format(workspace=workspace, data_dir=base / "data"),
                          encoding="utf-8")
        out.print(f"wrote {target}")
    written = seed_workspace(workspace)
    out.print(f"workspace {workspace}: {len(written)} new file(s)")
    out.print(f"next: parley config check --config {target}; then parley gateway "
              f"--config {target}")


# gateway and chat -----------------------------------------------------------------------------

@app.command()
def gateway(config_path: ConfigOpt = None) -> None:
    """Run the gateway with every enabled channel until Ctrl-C or SIGTERM."""
    from gateway.app import Gateway

    config = load(config_path)
    _setup_logging(config)
    gw = Gateway(config)
    run_sync(gw.run_until_signalled())


@app.command()
def chat(
    config_path: ConfigOpt = None,
    message: Annotated[str | None, typer.Option("--message", "-m",
                                                help="Send one message, print the answer.")]
    = None,
    plain: Annotated[bool, typer.Option(help="Print replies as plain text.")] = False,
) -> None:
    """Talk to the agent in the terminal (same agent and sessions as the gateway)."""
    from channels.terminal import TerminalChannel
    from gateway.app import Gateway

    config = load(config_path)
    _setup_logging(config, quiet=True)

    async def main() -> int:
        gw = Gateway(config, configured_channels=False)
        terminal = TerminalChannel(config.channels.terminal, gw.bus,
                                   markdown=not plain and message is None)
        gw.manager.add(terminal)
        async with gw:
            if message is not None:
                answer = await terminal.ask(message)
                return 1 if answer.kind == "error" else 0
            await terminal.interactive()
        return 0

    code = run_sync(main())
    raise typer.Exit(code)


# config ---------------------------------------------------------------------------------------

@config_app.command("check")
def config_check(config_path: ConfigOpt = None) -> None:
    """Validate the config: `ok` and a summary, or each error with its key path."""
    config = load(config_path)
    channels = [n for n, c in config.channels if getattr(c, "enabled", False)]
    out.print("ok", highlight=False)
    out.print(f"  file:      {config.source}", highlight=False)
    fallbacks = [f if isinstance(f, str) else f.model for f in config.agent.fallbacks]
    out.print(f"  model:     {config.agent.model}"
              + (f" (fallbacks: {', '.join(fallbacks)})" if fallbacks else ""), highlight=False)
    from agent.provider import Provider

    route = ("posted directly (OpenAI-compatible)" if Provider(config.agent).direct(
        config.agent.model) else "through litellm")
    out.print(f"  api:       {'api_base ' + config.agent.api_base if config.agent.api_base else 'provider default'}"  # noqa: E501
              f", key {'set' if config.agent.api_key else 'from environment'}, {route}",
              highlight=False)
    out.print(f"  workspace: {config.workspace_path}", highlight=False)
    out.print(f"  data:      {config.store_label}", highlight=False)
    out.print(f"  channels:  {', '.join(channels) or 'none'}", highlight=False)
    if config.channels.local.enabled:
        local = config.channels.local
        out.print(f"  local:     http://{local.host}:{local.port}/v1/messages", highlight=False)


# status, sessions, context --------------------------------------------------------------------

def _probe_health(config: Config) -> dict[str, Any] | None:
    import urllib.request

    local = config.channels.local
    if not local.enabled:
        return None
    req = urllib.request.Request(f"http://{local.host}:{local.port}/v1/health")
    if local.token:
        req.add_header("Authorization", f"Bearer {local.token}")
    try:
        with urllib.request.urlopen(req, timeout=2) as resp:  # noqa: S310 (loopback)
            return json.loads(resp.read())
    except (OSError, ValueError):
        return None


def _short_time(value: Any) -> str:
    return str(value)[11:19] if value else "-"


def _exec_line(config: Config, health: dict[str, Any] | None) -> str:
    """What the running gateway decided; else what it would decide here, now."""
    if health and health.get("exec"):
        return str(health["exec"])
    from agent.tools.exec_access import GatewayFiles, resolve_exec_access

    access = run_sync(resolve_exec_access(config.agent.tools.exec, GatewayFiles.of(config)))
    return access.describe()


@app.command()
def status(config_path: ConfigOpt = None) -> None:
    """Is the gateway running, which model, how many sessions."""
    config = load(config_path)
    health = _probe_health(config)
    out.print(f"config:   {config.source}", highlight=False)
    out.print(f"model:    {config.agent.model}", highlight=False)
    out.print(f"exec:     {_exec_line(config, health)}", highlight=False, markup=False,
              soft_wrap=True)
    if health:
        out.print(f"gateway:  {health.get('gateway', 'running')}, up {health.get('uptime_s')} s, "
                  f"{health.get('turns_done', 0)} turn(s) answered, "
                  f"{health.get('busy_sessions', 0)} busy session(s), "
                  f"{health.get('queued_messages', 0)} waiting message(s)", highlight=False)
        out.print(f"health:   {health.get('status', 'ok')}", highlight=False)
        out.print(f"outbox:   {health.get('outbox_pending', 0)} pending, "
                  f"{health.get('dead_letters', 0)} dead letter(s)", highlight=False)
        table = Table("channel", "state", "last inbound", "last send ok", "pending", "dead")
        for name, ch in (health.get("channels") or {}).items():
            state = str(ch.get("state", "?")) + (f" ({ch['reason']})" if ch.get("reason") else "")
            table.add_row(name, Text(state), _short_time(ch.get("last_inbound")),
                          _short_time(ch.get("last_send_ok")), str(ch.get("outbox_pending", 0)),
                          str(ch.get("dead_letters", 0)))
        out.print(table)
        for i, (name, mcp) in enumerate((health.get("mcp") or {}).items()):
            tools = mcp.get("tools") or []
            line = (f"{'mcp:' if i == 0 else '':<10}{name} ({mcp.get('transport')}): "
                    f"{mcp.get('state')}" + (f" ({mcp['error']})" if mcp.get("error") else "")
                    + f"; {len(tools)} tool(s)" + (f": {', '.join(tools)}" if tools else ""))
            out.print(line, highlight=False, markup=False, soft_wrap=True)
        errors = [*health.get("recent_errors", []),
                  *(f"{name}: {e}" for name, ch in (health.get("channels") or {}).items()
                    for e in ch.get("recent_errors", []))]
        for line in errors[-10:]:
            out.print(f"  recent error: {line}", highlight=False, markup=False)
    else:
        out.print("gateway:  not reachable on the local channel (not running?)", highlight=False)
    if config.database or config.db_path.exists():
        counts = run_sync(with_store(config, lambda s: s.counts()))
        out.print(f"storage:  {counts['sessions']} session(s), {counts['messages']} message(s) "
                  f"in {config.store_label}", highlight=False)


@sessions_app.command("list")
def sessions_list(
    config_path: ConfigOpt = None,
    all_: Annotated[bool, typer.Option("--all", help="Include sessions ended by /new.")] = False,
) -> None:
    """List sessions, most recent first."""
    config = load(config_path)
    rows = run_sync(with_store(config, lambda s: s.list_sessions(include_inactive=all_)))
    table = Table("id", "session", "messages", "last context", "updated")
    for r in rows:
        table.add_row(str(r.id), r.key + ("" if r.active else " (ended)"), str(r.message_count),
                      str(r.last_context_tokens or "-"), r.updated_at[:19])
    out.print(table)


def _session_dump(config: Config, ref: str) -> tuple[Any, list[Any]]:
    async def fn(store: Any) -> tuple[Any, list[Any]]:
        session = await store.find_session(ref)
        if session is None:
            raise fail(f"no session {ref!r} (see `parley sessions list`)")
        return session, [m async for m in store.all_messages(session.id)]
    return run_sync(with_store(config, fn))  # type: ignore[no-any-return]


@sessions_app.command("show")
def sessions_show(ref: Annotated[str, typer.Argument(help="Session id or key.")],
                  config_path: ConfigOpt = None) -> None:
    """Print a session's messages."""
    from gateway.kernel.store import content_text

    config = load(config_path)
    session, messages = _session_dump(config, ref)
    out.print(f"[bold]{session.key}[/bold] (#{session.id}, {len(messages)} messages)")
    for m in messages:
        body = m.body
        text = content_text(body.get("content"))
        calls = body.get("tool_calls") or []
        line = text or ", ".join(f"{c['function']['name']}({c['function']['arguments']})"
                                 for c in calls)
        out.print(f"[cyan]{m.role:>9}[/cyan] {line}", highlight=False, markup=True)


@sessions_app.command("export")
def sessions_export(ref: Annotated[str, typer.Argument(help="Session id or key.")],
                    config_path: ConfigOpt = None) -> None:
    """Print a session as JSON lines (one message a line)."""
    config = load(config_path)
    session, messages = _session_dump(config, ref)
    for m in messages:
        sys.stdout.write(json.dumps({"session": session.key, "turn_id": m.turn_id,
                                     "tokens": m.tokens, **m.body}, ensure_ascii=False) + "\n")


@context_app.command("show")
def context_show(ref: Annotated[str, typer.Argument(help="Session id or key.")],
                 config_path: ConfigOpt = None,
                 turn: Annotated[int | None, typer.Option(
                     "--turn", "-t", help="Turn number (1 = first; negative counts back).")]
                 = None,
                 full: Annotated[bool, typer.Option(
                     "--full", help="Also print the exact messages sent (rebuilt).")] = False,
                 as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """Explain what the model saw in a turn (default: the last one)."""
    from agent.replay import replay
    from gateway.kernel.store import content_text

    config = load(config_path)

    async def fn(store: Any) -> Any:
        session = await store.find_session(ref)
        if session is None:
            raise fail(f"no session {ref!r} (see `parley sessions list`)")
        snaps = await store.snapshots(session.id)
        if not snaps:
            raise fail(f"session {ref!r} has no context snapshot yet")
        index = len(snaps) - 1 if turn is None else (turn - 1 if turn > 0 else len(snaps) + turn)
        if not 0 <= index < len(snaps):
            raise fail(f"session {ref!r} has turns 1 to {len(snaps)}")
        rebuilt = None
        if full:
            try:
                rebuilt = await replay(store, config, session.id, snaps[index])
            except ValueError as exc:
                raise fail(str(exc)) from None
        return index + 1, len(snaps), snaps[index], rebuilt

    number, count, snap, rebuilt = run_sync(with_store(config, fn))
    if as_json:
        data = {**snap, "turn": number}
        if rebuilt is not None:
            data["messages"], data["replay_matches"] = rebuilt.messages, rebuilt.matches
        sys.stdout.write(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
        return
    out.print(f"session {snap['session_key']}, turn {number} of {count} ({snap['turn_id']})",
              highlight=False)
    out.print(f"hash {snap['hash']}", highlight=False)
    if "trust" in snap:  # snapshots from before trust levels have none
        owner = "with" if snap.get("owner_files") else "without"
        scopes = ", ".join(snap.get("memory_scopes", [])) or "none"
        out.print(f"sender trust {snap['trust']}, {owner} the owner's files; memory: {scopes}",
                  highlight=False)
    out.print(f"tokens {snap['total_tokens']:,} of {snap['max_context_tokens']:,}",
              highlight=False)
    notes: dict[str, list[str]] = {}
    for cut in snap.get("bootstrap_cuts", []):
        name, _, why = cut.partition(": ")
        notes.setdefault(name, []).append(why)
    for trim in snap.get("trimmed", []):
        notes.setdefault("history", []).append(trim)
    table = Table("layer", "tokens", "notes")
    for name, tokens in snap["layers"].items():
        table.add_row(name, f"{tokens:,}", "; ".join(notes.get(name, [])))
    out.print(table)
    out.print(", ".join(f"{k}: {v}" for k, v in snap["sources"].items()), highlight=False)
    if rebuilt is not None:
        state = "matches the stored hash" if rebuilt.matches else \
            "DIFFERS from the stored hash (the workspace or config changed since)"
        out.print(f"\nreplayed from the database: {state}", highlight=False)
        for m in rebuilt.messages:
            content = content_text(m.get("content"))
            out.rule(f"{m['role']}")
            out.print(content or json.dumps(m.get("tool_calls")), markup=False,
                      highlight=False)


def main() -> None:
    try:
        app()
    except ConfigError as exc:  # pragma: no cover - _load handles the usual path
        err.print(str(exc), markup=False)
        sys.exit(2)

