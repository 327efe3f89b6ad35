"""The schema a tool function gets, and how its arguments are checked."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from agent.tools.base import ToolRetry, tool
from agent.turn import TurnContext
from gateway.kernel.events import InboundMessage


@tool
async def lookup(ctx: TurnContext, query: str, limit: int | None = None,
                 tags: list[str] | None = None, exact: bool = False) -> str:
    """Look something up.

    Args:
        query: what to look for.
        limit: at most this many results.
        tags: only results with these tags.
        exact: match the whole query.
    """
    return f"{query}|{limit}|{tags}|{exact}"


def test_optional_arguments_are_plain_types_in_the_schema() -> None:
    params = lookup.parameters  # type: ignore[attr-defined]
    assert params["required"] == ["query"]
    assert params["properties"]["limit"] == {"type": "integer",
                                             "description": "at most this many results."}
    assert params["properties"]["tags"] == {"type": "array", "items": {"type": "string"},
                                            "description": "only results with these tags."}
    assert params["properties"]["exact"]["default"] is False  # a real default stays
    assert "additionalProperties" not in params


async def test_null_and_unknown_arguments(tmp_path: Path) -> None:
    ctx = TurnContext(message=InboundMessage(channel="local", chat_id="c1", sender_id="u1",
                                              trust="owner",
                                             text="", received_at=datetime.now(UTC)),
                      session_id=1, workspace=tmp_path)
    assert await lookup(ctx, {"query": "q", "limit": None}) == "q|None|None|False"
    assert await lookup(ctx, {"query": "q", "limit": 3, "tags": ["a"]}) == "q|3|['a']|False"
    with pytest.raises(ToolRetry, match="nope"):
        await lookup(ctx, {"query": "q", "nope": 1})
