"""``parley status``, ``sessions list|show|export`` and ``context show``: what the gateway is
doing and what it stored. Stored text (messages, session keys, tool arguments) is always
printed as text, never read as Rich markup."""

from __future__ import annotations

import json
import sys
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from gateway.cli_common import ConfigOpt, add_row, fail, load, out, run_sync, say, with_store
from gateway.kernel.config import Config

# gateway.cli imports this module to register it: the rest is imported when a command runs.
sessions_app = typer.Typer(help="Stored conversations.", no_args_is_help=True)
context_app = typer.Typer(help="What the model saw.", no_args_is_help=True)


def probe_health(config: Config) -> dict[str, Any] | None:
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


def _installed_channels(config: Config) -> None:
    """The channels installed (``parley.channels`` entry points: built-in and plugins), and
    which of them the config switches on."""
    from gateway.kernel.channel_registry import names
    from gateway.kernel.config_channels import section_of

    installed = names()
    enabled = [n for n in installed
               if getattr(section_of(config.channels, n), "enabled", False)]
    say(f"channels: {', '.join(installed) or 'none'} installed; enabled: "
        f"{', '.join(enabled) or 'none'}")


def status(config_path: ConfigOpt = None) -> None:
    """Is the gateway running, which model, how many sessions.

    Exit status 1 when the gateway is not running."""
    config = load(config_path)
    health = probe_health(config)
    say(f"config:   {config.source}")
    say(f"model:    {config.agent.model}")
    say(f"exec:     {_exec_line(config, health)}")
    _installed_channels(config)
    if health:
        say(f"gateway:  {health.get('gateway', 'running')}, up {health.get('uptime_s')} s, "
            f"{health.get('turns_done', 0)} turn(s) answered, "
            f"{health.get('busy_sessions', 0)} busy session(s), "
            f"{health.get('queued_messages', 0)} waiting message(s)")
        say(f"health:   {health.get('status', 'ok')}")
        for reason in health.get("reasons") or []:  # why it is degraded, one line each
            say(f"  reason: {reason}")
        say(f"outbox:   {health.get('outbox_pending', 0)} pending, "
            f"{health.get('dead_letters', 0)} dead letter(s)")
        _cluster_lines(health.get("cluster"))
        table = Table("channel", "state", "last inbound", "last send ok", "pending", "dead")
        for name, ch in (health.get("channels") or {}).items():
            state = str(ch.get("state", "?")) + (f" ({ch['reason']})" if ch.get("reason") else "")
            add_row(table, name, state, _short_time(ch.get("last_inbound")),
                    _short_time(ch.get("last_send_ok")), ch.get("outbox_pending", 0),
                    ch.get("dead_letters", 0))
        out.print(table)
        for i, (name, mcp) in enumerate((health.get("mcp") or {}).items()):
            tools = mcp.get("tools") or []
            line = (f"{'mcp:' if i == 0 else '':<10}{name} ({mcp.get('transport')}): "
                    f"{mcp.get('state')}" + (f" ({mcp['error']})" if mcp.get("error") else "")
                    + f"; {len(tools)} tool(s)" + (f": {', '.join(tools)}" if tools else ""))
            say(line)
        errors = [*health.get("recent_errors", []),
                  *(f"{name}: {e}" for name, ch in (health.get("channels") or {}).items()
                    for e in ch.get("recent_errors", []))]
        for line in errors[-10:]:
            say(f"  recent error: {line}")
    elif config.channels.local.enabled:
        say("gateway:  not running (nothing answers on the local channel at "
            f"{config.channels.local.host}:{config.channels.local.port}); start it with "
            "`parley gateway`")
    else:
        say("gateway:  unknown: channels.local is disabled, and status asks through it")
    _context_line(config, health)
    if config.database or config.db_path.exists():
        counts = run_sync(with_store(config, lambda s: s.counts()), config)
        say(f"storage:  {counts['sessions']} session(s), {counts['messages']} message(s) "
            f"in {config.store_label}")
    if not health:  # scripts and service checks read the exit status
        raise typer.Exit(1)


def _cluster_lines(cluster: dict[str, Any] | None) -> None:
    """Several processes on PostgreSQL: each process, its lease, its share of the work and the
    connections it holds (a platform connection's leader lease, the schedules)."""
    if not cluster:
        return
    me = cluster.get("process")
    taking = "taking work" if cluster.get("taking_work") else \
        f"NOT taking work ({cluster.get('problem') or 'no lease'})"
    members = cluster.get("processes") or []
    say(f"cluster:  {len(members)} process(es); this one {me}, {taking}; "
        f"{cluster.get('unclaimed', 0)} unclaimed message(s)")
    for p in members:
        holds = ", ".join(p.get("leads") or []) or "no connection"
        say(f"  process {p.get('id')}{' (this one)' if p.get('me') else ''}: lease "
            f"{p.get('lease_left')} s left, {p.get('chats', 0)} chat(s), "
            f"{p.get('inbox_claimed', 0)} claimed, {p.get('outbox_pending', 0)} undelivered; "
            f"holds {holds}")
    for name, holder in sorted((cluster.get("connections") or {}).items()):
        say(f"  {name} is held by {holder}")


def _context_line(config: Config, health: dict[str, Any] | None) -> None:
    """How the model's window is shared out, and a warning when little is left for history
    (the running gateway's figures, else the config's and the workspace's)."""
    plan = (health or {}).get("context_window")
    if plan is None:
        from agent.assembly import plan_for

        plan = plan_for(config).describe()
    say(f"context:  {plan['window']:,}-token window: {plan['reserve']:,} for the reply, "
        f"{plan['fixed'] - plan['reserve']:,} fixed, {max(plan['history'], 0):,} for history")
    if plan.get("warning"):
        say(f"  warning: {plan['warning']}")


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
        add_row(table, r.id, r.key + ("" if r.active else " (ended)"), r.message_count,
                r.last_context_tokens or "-", r.updated_at[:19])
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
    out.print(Text.assemble((session.key, "bold"), f" (#{session.id}, {len(messages)} messages)"),
              highlight=False)
    for m in messages:
        body = m.body
        text = content_text(body.get("content"))
        calls = body.get("tool_calls") or []
        line = text or ", ".join(f"{c['function']['name']}({c['function']['arguments']})"
                                 for c in calls)
        out.print(Text.assemble((f"{m.role:>9}", "cyan"), " ", line), highlight=False)


@sessions_app.command("export")
def sessions_export(ref: Annotated[str, typer.Argument(help="Session id or key.")],
                    config_path: ConfigOpt = None) -> None:
    """Print a session as JSON lines (one message a line)."""
    config = load(config_path)
    session, messages = _session_dump(config, ref)
    for m in messages:
        sys.stdout.write(json.dumps({"session": session.key, "turn_id": m.turn_id,
                                     "tokens": m.tokens, **m.body}, ensure_ascii=False) + "\n")


@sessions_app.command("search")
def sessions_search(
    query: Annotated[str, typer.Argument(help="Words to find (3+ letters match inside words).")],
    config_path: ConfigOpt = None,
    chat: Annotated[str | None, typer.Option(
        "--chat", help="Only this chat (channel:chat_id); default: every chat.")] = None,
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, max=100)] = 10,
) -> None:
    """Find words in past conversations (the index session_search uses)."""
    config = load(config_path)
    hits = run_sync(with_store(config, lambda s: s.search_messages(query, chat=chat,
                                                                     limit=limit)), config)
    if not hits:
        say(f"no message matches {query!r}")
        return
    table = Table("message", "session", "when", "role", "text")
    for hit in hits:
        add_row(table, hit.message_id, hit.session_key, hit.created_at[:16], hit.role, hit.text)
    out.print(table)


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
            data["replay_calls"] = [{"messages": c.messages, "matches": c.matches}
                                    for c in rebuilt.calls]
            data["replay_note"] = rebuilt.note
        sys.stdout.write(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
        return
    say(f"session {snap['session_key']}, turn {number} of {count} ({snap['turn_id']})")
    say(f"hash {snap['hash']}")
    if "trust" in snap:  # snapshots from before trust levels have none
        owner = "with" if snap.get("owner_files") else "without"
        scopes = ", ".join(snap.get("memory_scopes", [])) or "none"
        say(f"sender trust {snap['trust']}, {owner} the owner's files; memory: {scopes}")
    say(f"tokens {snap['total_tokens']:,} of {snap['max_context_tokens']:,}")
    notes: dict[str, list[str]] = {}
    for cut in snap.get("bootstrap_cuts", []):
        name, _, why = cut.partition(": ")
        notes.setdefault(name, []).append(why)
    for trim in snap.get("trimmed", []):
        notes.setdefault("history", []).append(trim)
    table = Table("layer", "tokens", "notes")
    for name, tokens in snap["layers"].items():
        add_row(table, name, f"{tokens:,}", "; ".join(notes.get(name, [])))
    out.print(table)
    say(", ".join(f"{k}: {v}" for k, v in snap["sources"].items()))
    if rebuilt is not None:
        _print_replay(rebuilt, content_text)


def _print_replay(rebuilt: Any, content_text: Any) -> None:
    """The first call's messages, then what each later model call of the turn added."""
    if rebuilt.note:
        say(f"\nnote: {rebuilt.note}")
    else:
        state = "matches the stored hash" if rebuilt.matches else \
            "DIFFERS from the stored hash (a stored text or message changed)"
        say(f"\nreplayed from the database: {state}")
    shown = 0
    for number, call in enumerate(rebuilt.calls, 1):
        if len(rebuilt.calls) > 1:
            verdict = "matches" if call.matches else "DIFFERS"
            out.rule(Text(f"model call {number} of {len(rebuilt.calls)}: {verdict}"))
        for m in call.messages[shown:]:
            content = content_text(m.get("content"))
            out.rule(Text(str(m["role"])))
            say(content or json.dumps(m.get("tool_calls")))
        shown = len(call.messages)
