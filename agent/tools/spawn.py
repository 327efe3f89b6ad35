"""The ``spawn`` tool: hand a task to a subagent (``agent/subagent.py`` does the work)."""

from __future__ import annotations

from agent.tools.base import ToolError, tool
from agent.turn import TurnContext


@tool(group="spawn")
async def spawn(ctx: TurnContext, task: str, background: bool = False) -> str:
    """Hand a self-contained task to a subagent (fresh context; your tools except message,
    cron and spawn) and get its answer. For long or parallel work.

    Args:
        task: all the subagent needs to know; it cannot see this chat.
        background: return now; the result comes later as a new message.
    """
    spawner = ctx.services.spawn
    if spawner is None:
        raise ToolError("subagents are not available here")
    return await spawner(ctx, task, background=background)


SPAWN_TOOLS = [spawn]
