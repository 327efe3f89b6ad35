"""Can a sandbox be made here? Asked once per process, answered by trying.

Linux, bubblewrap and prlimit found, and — for the host's root, for whom the kernel ignores
RLIMIT_NPROC — a pids cgroup it may create (``sandbox_cgroup.py``); then one command really
run in the sandbox. The first failure is the reason ``parley status`` gives.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import tempfile
from pathlib import Path

from agent.tools.base import ToolError
from agent.tools.sandbox import SANDBOX_PATH, Sandbox, SandboxSpec
from agent.tools.sandbox_cgroup import find_pids_cgroups
from gateway.kernel.frozen import frozen

_TRIAL_TIMEOUT = 10.0


@frozen
class NoSandbox:
    reason: str


_FOUND: dict[SandboxSpec, Sandbox | NoSandbox] = {}


async def find_sandbox(spec: SandboxSpec) -> Sandbox | NoSandbox:
    """The sandbox for ``spec`` if one can be made here — tried for real, by running a command
    in it — else why not. Asked once per process: the answer does not change while we run."""
    if spec not in _FOUND:
        _FOUND[spec] = await _find(spec)
    return _FOUND[spec]


def _host_root() -> bool:
    """Is our real uid the host's root (uid 0 of the initial user namespace), for whom the
    kernel ignores RLIMIT_NPROC? Root of a rootless container is another uid outside."""
    if os.getuid() != 0:
        return False
    try:
        fields = [int(x) for x in Path("/proc/self/uid_map").read_text().split()]
    except (OSError, ValueError):
        return True
    for inside, outside, count in zip(fields[0::3], fields[1::3], fields[2::3], strict=False):
        if inside == 0 and count > 0:
            return outside == 0
    return True


async def _output(*argv: str) -> str:
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT)
    except OSError:
        return ""
    try:
        async with asyncio.timeout(_TRIAL_TIMEOUT):
            out, _ = await proc.communicate()
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return ""
    return out.decode(errors="replace")


async def _find(spec: SandboxSpec) -> Sandbox | NoSandbox:
    if not sys.platform.startswith("linux"):
        return NoSandbox(f"no sandbox on {sys.platform}: exec needs Linux and bubblewrap")
    bwrap = shutil.which(spec.bwrap)
    if bwrap is None:
        return NoSandbox(f"bubblewrap not found ({spec.bwrap!r} is not a program on PATH); "
                         "install it (Debian, Ubuntu: apt install bubblewrap)")
    prlimit = shutil.which("prlimit", path=SANDBOX_PATH)
    if prlimit is None:
        return NoSandbox("prlimit (util-linux) not found: it sets the sandbox's limits")
    version = (await _output(bwrap, "--version")).strip().removeprefix("bubblewrap ")
    usage = await _output(bwrap, "--help")
    cgroups = None
    if _host_root():
        found = await asyncio.to_thread(find_pids_cgroups)
        if isinstance(found, str):
            return NoSandbox("running as root, whose processes the kernel does not count, and "
                             f"{found}; run the gateway as an ordinary user, or give it a "
                             "writable /sys/fs/cgroup")
        cgroups = found
    sandbox = Sandbox(spec=spec, bwrap=bwrap, prlimit=prlimit, version=version or "?",
                      tmpfs_size="--size" in usage, disable_userns="--disable-userns" in usage,
                      cgroups=cgroups)
    problem = await _trial(sandbox)
    if problem:
        return NoSandbox(f"bubblewrap cannot make a sandbox here: {problem}")
    return sandbox


async def _trial(sandbox: Sandbox) -> str | None:
    """Run one command in the sandbox; None when it worked, else what went wrong."""
    with tempfile.TemporaryDirectory(prefix="parley-probe-") as workspace:
        read, write = os.pipe()
        try:
            try:
                cmd = await sandbox.start("echo sandbox-ok", cwd=Path(workspace), stdout=write,
                                          stderr=write)
            except (OSError, ToolError) as exc:
                return str(exc)
            finally:
                os.close(write)
            try:
                async with asyncio.timeout(_TRIAL_TIMEOUT):
                    code: int | None = await cmd.wait()
            except TimeoutError:
                code = None
            finally:
                await cmd.kill()
            text = os.read(read, 65536).decode(errors="replace").strip()  # its writers are gone
        finally:
            os.close(read)
    if code == 0 and text == "sandbox-ok":
        return None
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else f"exit status {code}"
