"""The agent's tools: one module per group, assembled here from the config."""

from __future__ import annotations

from agent.tools.base import Tool, ToolError, ToolRegistry, ToolRetry, tool
from gateway.config import ToolsConfig

__all__ = ["Tool", "ToolError", "ToolRegistry", "ToolRetry", "build_registry", "tool"]


def build_registry(config: ToolsConfig) -> ToolRegistry:
    """The tools the model is offered: only the enabled groups."""
    tools: list[Tool] = []
    if config.files.enabled:
        from agent.tools.files import FILE_TOOLS

        tools += FILE_TOOLS
    if config.exec.enabled:
        from agent.tools.shell import SHELL_TOOLS

        tools += SHELL_TOOLS
    return ToolRegistry(tools)
