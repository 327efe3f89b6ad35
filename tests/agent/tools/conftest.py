"""The exec tool's helpers: the real bubblewrap sandbox, and a way to call exec with a runner."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from agent.tools.base import ToolRegistry
from agent.tools.exec_access import ExecAccess, HostRunner
from agent.tools.sandbox import Sandbox, SandboxSpec
from agent.tools.sandbox_probe import NoSandbox, find_sandbox
from agent.tools.shell import CommandRunner, exec_tool
from agent.turn import TurnContext
from gateway.kernel.config import ExecToolConfig, ToolsConfig
from gateway.kernel.events import InboundMessage

EXEC_FOR_LISTS = ExecAccess("unsandboxed", "tests that only list tools", HostRunner())
"""For a registry whose tool list is looked at, never its exec run: exec is offered only with
a way to run it (``build_registry``)."""


async def real_sandbox(**spec: Any) -> Sandbox:
    """The sandbox for ``spec`` on this host. CI installs bubblewrap (``make test``); the only
    reason to skip is that it is not installed at all — any other failure is a failure."""
    found = await find_sandbox(SandboxSpec(**spec))
    if isinstance(found, NoSandbox):
        if shutil.which("bwrap") is None:
            pytest.skip("bubblewrap (bwrap) is not installed; `make test` installs it")
        pytest.fail(f"no sandbox here: {found.reason}")
    return found


@pytest.fixture
async def sandbox() -> Sandbox:
    return await real_sandbox()


def make_ctx(workspace: Path, **exec_config: Any) -> TurnContext:
    return TurnContext(message=InboundMessage(channel="local", chat_id="c1", sender_id="u1",
                                              trust="owner", text="",
                                              received_at=datetime.now(UTC)),
                       session_id=1, workspace=workspace,
                       tools=ToolsConfig(exec=ExecToolConfig(**exec_config)))


Exec = Callable[..., Any]


def exec_with(runner: CommandRunner) -> Exec:
    """``await run(ctx, command, timeout=...)`` → (text, is_error), through the registry."""
    registry = ToolRegistry([exec_tool(runner)])

    async def run(ctx: TurnContext, command: str, **args: Any) -> tuple[str, bool]:
        result = await registry.execute("exec", json.dumps({"command": command, **args}), ctx)
        return result.text, result.is_error

    return run


@pytest.fixture
def run(sandbox: Sandbox) -> Exec:
    return exec_with(sandbox)


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    path = tmp_path / "ws"
    path.mkdir()
    return path
