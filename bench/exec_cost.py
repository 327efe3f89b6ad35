"""What the exec sandbox costs per command: ``echo hi`` run through the exec tool, sandboxed
(bubblewrap, as the gateway runs it) and on the host (the runner of the unsafe switch).

Both go through the whole tool (deny list, pipes, output capping), so the difference is the
sandbox's own: bwrap's namespaces and mounts, prlimit, and waiting for PID 1 to be gone.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.stats import summary_ms


async def measure(root: Path, n: int) -> dict[str, Any]:
    from agent.tools.base import ToolRegistry
    from agent.tools.exec_access import GatewayFiles, HostRunner, resolve_exec_access
    from agent.tools.shell import CommandRunner, exec_tool
    from agent.turn import TurnContext
    from gateway.kernel.config import ExecToolConfig
    from gateway.kernel.events import InboundMessage

    workspace = root / "exec" / "workspace"
    workspace.mkdir(parents=True)
    access = await resolve_exec_access(ExecToolConfig(),
                                       GatewayFiles(config=None, data_dir=root / "exec" / "data"))
    out: dict[str, Any] = {"commands": n, "exec": access.describe()}
    runners: dict[str, CommandRunner] = {"host": HostRunner()}
    if access.state == "sandboxed" and access.runner is not None:
        runners["sandboxed"] = access.runner
    ctx = TurnContext(message=InboundMessage(channel="local", chat_id="bench", sender_id="b",
                                             text="", received_at=datetime.now(UTC),
                                             trust="owner"),  # only the owner may run exec
                      session_id=1, workspace=workspace)
    for name, runner in runners.items():
        registry = ToolRegistry([exec_tool(runner)])
        samples = []
        for i in range(n + 5):
            t0 = time.perf_counter()
            result = await registry.execute("exec", {"command": "echo hi"}, ctx)
            if i >= 5:  # warm-up
                samples.append(time.perf_counter() - t0)
            if result.text != "hi\n[exit code: 0]":
                raise RuntimeError(f"exec ({name}) answered {result.text!r}")
        out[name] = summary_ms(samples)
    if "sandboxed" in out:
        out["overhead_p50_ms"] = round(out["sandboxed"]["p50_ms"] - out["host"]["p50_ms"], 3)
    return out
