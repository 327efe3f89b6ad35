"""The agent's tools: one module per group, assembled here from the config."""

from __future__ import annotations

from typing import TYPE_CHECKING

from agent.tools.base import Tool, ToolError, ToolRegistry, ToolRetry, tool
from gateway.kernel.config import MemoryConfig, ToolsConfig

if TYPE_CHECKING:
    from agent.tools.exec_access import ExecAccess

__all__ = ["Tool", "ToolError", "ToolRegistry", "ToolRetry", "build_registry", "tool"]


def build_registry(config: ToolsConfig, *, memory: MemoryConfig | None = None,
                   timezone: str = "UTC", exec_access: ExecAccess | None = None) -> ToolRegistry:
    """The tools the model is offered: only the enabled groups. ``memory`` is
    ``agent.memory`` (with ``agent.timezone`` for the daily logs' dates); None: no memory tool.
    ``exec_access``: how commands run here (``resolve_exec_access``); exec is offered only
    when they can (in the sandbox, or unsandboxed when the config insists)."""
    tools: list[Tool] = []
    if config.files.enabled:
        from agent.tools.files import FILE_TOOLS

        tools += FILE_TOOLS
    if config.exec.enabled and exec_access is not None and exec_access.runner is not None:
        from agent.tools.shell import exec_tool

        tools.append(exec_tool(exec_access.runner, about=exec_access.about))
    if config.message.enabled:
        from agent.tools.message import MESSAGE_TOOLS

        tools += MESSAGE_TOOLS
    if config.cron.enabled:
        from agent.tools.cron import CRON_TOOLS

        tools += CRON_TOOLS
    if config.web.enabled:
        from agent.tools.web import WEB_FETCH_TOOLS

        tools += WEB_FETCH_TOOLS
    if config.web.search.provider != "none":  # without a provider it could only fail
        from agent.tools.web import WEB_SEARCH_TOOLS

        tools += WEB_SEARCH_TOOLS
    if config.spawn.enabled:
        from agent.tools.spawn import SPAWN_TOOLS

        tools += SPAWN_TOOLS
    if config.session_search.enabled:
        from agent.tools.session_search import SESSION_SEARCH_TOOLS

        tools += SESSION_SEARCH_TOOLS
    if memory is not None and memory.enabled:
        from agent.tools.memory import memory_tool

        tools.append(memory_tool(memory, timezone=timezone))
    return ToolRegistry(tools, core=None if "*" in config.core else tuple(config.core))
