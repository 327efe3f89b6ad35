"""``parley pairing list|approve|revoke``: the owner's side of pairing (see ``gateway/pairing.py``).

Runs beside a live gateway: both open the same SQLite database, and the gateway reads the
approval on the user's next message.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

import typer
from rich.table import Table

from gateway.cli_common import ConfigOpt, add_row, fail, load, out, run_sync, say, with_store
from gateway.kernel.pairing import PairingStore, normalize_code

# gateway.cli imports this module to register it, so its helpers are imported when a command
# runs, not at import time.
pairing_app = typer.Typer(help="Let new people talk to the bot (dm_policy: pairing).",
                          no_args_is_help=True)


def _when(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


@pairing_app.command("list")
def pairing_list(
    channel: Annotated[str | None, typer.Argument(help="Only this channel (telegram, ...).")]
    = None,
    config_path: ConfigOpt = None,
) -> None:
    """Pending codes and approved users."""

    config = load(config_path)

    async def fn(store: Any) -> tuple[list[Any], list[Any]]:
        pairing = PairingStore(store)
        return await pairing.pending(channel), await pairing.approvals(channel)

    pending, approved = run_sync(with_store(config, fn))
    table = Table("channel", "code", "user id", "name", "expires", title="Pending")
    for p in pending:
        add_row(table, p.channel, p.code, p.user_id, p.user_name or "", _when(p.expires_at))
    out.print(table) if pending else say("no pending codes")
    table = Table("channel", "user id", "name", "approved", title="Approved")
    for a in approved:
        add_row(table, a.channel, a.user_id, a.user_name or "", _when(a.approved_at))
    out.print(table) if approved else say("no approved users")


@pairing_app.command("approve")
def pairing_approve(
    channel: Annotated[str, typer.Argument(help="The channel the code came from: telegram, ...")],
    code: Annotated[str, typer.Argument(help="The 8-character code the user was given.")],
    config_path: ConfigOpt = None,
) -> None:
    """Approve the user who was given CODE; they are served from their next message."""

    config = load(config_path)

    async def fn(store: Any) -> Any:
        return await PairingStore(store).approve(channel, code)

    approval = run_sync(with_store(config, fn))
    if approval is None:
        raise fail(f"no pending code {normalize_code(code)!r} on {channel} (it may have "
                    f"expired after an hour; see `parley pairing list`)")
    who = f"{approval.user_name} (id {approval.user_id})" if approval.user_name \
        else f"user {approval.user_id}"
    say(f"approved {who} on {channel}")


@pairing_app.command("revoke")
def pairing_revoke(
    channel: Annotated[str, typer.Argument(help="The channel: telegram, discord, ...")],
    user_id: Annotated[str, typer.Argument(help="The approved user's id (see `list`).")],
    config_path: ConfigOpt = None,
) -> None:
    """Withdraw an approval: the user gets a pairing code again instead of answers."""

    config = load(config_path)

    async def fn(store: Any) -> bool:
        return await PairingStore(store).revoke(channel, user_id)

    if not run_sync(with_store(config, fn)):
        raise fail(f"user {user_id!r} is not approved on {channel} (see `parley pairing "
                   "list`)")
    say(f"revoked user {user_id} on {channel}; a running gateway stops answering them within "
        "a minute")
