"""``parley usage``: the usage ledger from the command line — model calls, tokens and cost,
in total or by person, chat, model or day, since a day.

Reads the database a running gateway writes; days are in ``agent.timezone``.
"""

from __future__ import annotations

import re
from datetime import date, datetime, timedelta
from typing import Annotated, Any, Literal

import typer
from rich.table import Table

from gateway.cli_common import ConfigOpt, add_row, fail, load, out, run_sync, with_store

# gateway.cli imports this module to register it: the rest is imported when a command runs.
By = Literal["person", "chat", "model", "day", "session", "turn", "kind"]
_DAYS_BACK = re.compile(r"^(\d+)d$")


def since_day(text: str | None, today: date) -> str | None:
    """``--since``: ``YYYY-MM-DD``, ``today``, or ``7d`` (the last 7 days, today included)."""
    if text is None:
        return None
    if text == "today":
        return today.isoformat()
    if match := _DAYS_BACK.match(text):
        return (today - timedelta(days=max(int(match.group(1)) - 1, 0))).isoformat()
    try:
        return date.fromisoformat(text).isoformat()
    except ValueError:
        raise fail(f"--since {text!r}: write a day (2025-01-31), today, or a count of days "
                   "(7d)") from None


def usage_command(
    config_path: ConfigOpt = None,
    by: Annotated[By | None, typer.Option(
        "--by", help="Group by person (channel:sender_id), chat, model, day, session (its "
                     "id), turn or kind (chat, transcription, vision, document, speech).")]
    = None,
    since: Annotated[str | None, typer.Option(
        "--since", help="From this day on: 2025-01-31, today, or 7d (the last 7 days).")]
    = None,
    person: Annotated[str | None, typer.Option(
        "--person", help="Only this person (channel:sender_id).")] = None,
    chat: Annotated[str | None, typer.Option(
        "--chat", help="Only this chat (channel:chat_id).")] = None,
) -> None:
    """Model calls, tokens and cost from the usage ledger."""
    from zoneinfo import ZoneInfo

    config = load(config_path)
    today = datetime.now(ZoneInfo(config.agent.timezone)).date()
    first = since_day(since, today)

    async def fn(store: Any) -> Any:
        if by is None:
            return [await store.usage_total(person=person, chat=chat, since_day=first)]
        return await store.usage_by(by, person=person, chat=chat, since_day=first)

    rows = run_sync(with_store(config, fn))
    table = Table(by or "", "calls", "tokens in", "tokens out", "cost",
                  title=f"Usage since {first}" if first else "Usage")
    for row in rows:
        add_row(table, row.key, f"{row.calls:,}", f"{row.prompt_tokens:,}",
                f"{row.completion_tokens:,}", f"{row.cost:.4f}")
    out.print(table)
