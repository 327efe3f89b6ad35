"""Whether and how ``exec`` runs here, decided once at start.

*sandboxed* (bubblewrap, ``sandbox.py``), *off* with the reason when no sandbox can be made,
*unsandboxed* only when the config says ``dangerously_run_unsandboxed: true``, or *disabled*.
The root (``gateway/app.py``) resolves it with the gateway's own files, logs it once, shows it
in ``parley status`` and hands it to ``build_registry``, which offers ``exec`` to the model only
when it can run.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from pathlib import Path
from typing import Literal

from agent.tools.sandbox import SandboxSpec
from agent.tools.sandbox_probe import NoSandbox, find_sandbox
from agent.tools.shell import CommandRunner, child_env
from gateway.kernel.config import Config, ExecToolConfig
from gateway.kernel.frozen import frozen


@frozen(kw_only=True)
class GatewayFiles:
    """The gateway's own files, which no command may see (its config holds keys, its data
    folder every conversation): known to the root, handed to the sandbox."""

    config: Path | None
    data_dir: Path
    log_file: Path | None = None

    @classmethod
    def of(cls, config: Config) -> GatewayFiles:
        log = config.logging.file
        return cls(config=config.source, data_dir=config.data_path,
                   log_file=Path(log).expanduser().absolute() if log else None)

    def paths(self) -> tuple[Path, ...]:
        return tuple(p for p in (self.config, self.data_dir, self.log_file) if p is not None)


@frozen
class ExecAccess:
    state: Literal["sandboxed", "off", "unsandboxed", "disabled"]
    detail: str
    runner: CommandRunner | None = None
    about: str = ""
    """What the tool's description adds about where commands run."""

    def describe(self) -> str:
        """The ``exec:`` line of ``parley status`` and the start-up log."""
        return {"sandboxed": f"sandboxed ({self.detail})", "off": f"off — {self.detail}",
                "unsandboxed": f"UNSANDBOXED — {self.detail}",
                "disabled": f"disabled ({self.detail})"}[self.state]


class _HostCommand:
    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self._proc = proc

    async def wait(self) -> int:
        return await self._proc.wait()

    async def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._proc.pid, signal.SIGKILL)
        await self._proc.wait()


class HostRunner:
    """Runs a command straight on the host, in its own process group, without secrets in its
    environment: what ``dangerously_run_unsandboxed`` asks for. It can read everything the
    gateway's user can, and a process that leaves the group (``setsid``) outlives it."""

    async def start(self, command: str, *, cwd: Path, stdout: int,
                    stderr: int) -> _HostCommand:
        env, _ = child_env()
        proc = await asyncio.create_subprocess_shell(
            command, cwd=cwd, env=env, stdin=asyncio.subprocess.DEVNULL, stdout=stdout,
            stderr=stderr, start_new_session=True)
        return _HostCommand(proc)


async def resolve_exec_access(config: ExecToolConfig, files: GatewayFiles) -> ExecAccess:
    if not config.enabled:
        return ExecAccess("disabled", "agent.tools.exec.enabled is false")
    if config.dangerously_run_unsandboxed:
        return ExecAccess("unsandboxed", "agent.tools.exec.dangerously_run_unsandboxed is "
                          "true: commands run as the gateway's user and can read its config, "
                          "keys and data", HostRunner())
    found = await find_sandbox(SandboxSpec.from_config(config.sandbox, files.paths()))
    if isinstance(found, NoSandbox):
        return ExecAccess("off", found.reason)
    network = "has the network" if config.sandbox.network else "has no network"
    about = (f"In a sandbox: only the workspace (also HOME) is writable, /tmp is fresh, it "
             f"{network}.")
    return ExecAccess("sandboxed", found.describe(), found, about)
