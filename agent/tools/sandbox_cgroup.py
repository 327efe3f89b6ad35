"""A pids cgroup per sandboxed command: how commands run by root are held to a process limit.

The kernel ignores RLIMIT_NPROC for root, so for root the limit is a cgroup's ``pids.max``
(which counts threads too). One folder per command under ``parley-sandbox/`` in the cgroup v2
hierarchy when it offers the pids controller, else in the v1 pids hierarchy; the command's
first process enters it before it forks, and everything it starts stays in it. Needs a
writable cgroup file system, which root usually has and other users usually do not (they are
limited through their user namespace instead, ``agent/tools/sandbox.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import re
import signal
from pathlib import Path
from typing import Literal

from gateway.kernel.frozen import frozen

_log = logging.getLogger(__name__)

BASE_NAME = "parley-sandbox"
_SEQUENCE = itertools.count(1)
_REMOVE_TRIES = 100


@frozen
class CommandCgroup:
    """One command's cgroup: enter it through ``procs``, then ``kill_and_remove()``."""

    path: Path
    version: Literal[1, 2]

    @property
    def procs(self) -> Path:
        return self.path / "cgroup.procs"

    def _pids(self) -> list[int]:
        try:
            return [int(p) for p in self.procs.read_text().split()]
        except (OSError, ValueError):
            return []

    async def kill_and_remove(self) -> None:
        """SIGKILL whatever is still inside, then remove the folder (left for the next start's
        clean-up if a process will not leave it in about a second)."""
        if self.version == 2:
            with contextlib.suppress(OSError):
                (self.path / "cgroup.kill").write_text("1")
        for _ in range(_REMOVE_TRIES):
            for pid in self._pids():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                await asyncio.sleep(0.01)
        _log.warning("sandbox cgroup %s still busy; left for the next start", self.path)


@frozen
class PidsCgroups:
    """Where the per-command cgroups go: ``<hierarchy>/parley-sandbox``."""

    base: Path
    version: Literal[1, 2]

    def create(self, limit: int) -> CommandCgroup:
        path = self.base / f"{os.getpid()}-{next(_SEQUENCE)}"
        path.mkdir()
        try:
            (path / "pids.max").write_text(str(limit))
        except BaseException:
            path.rmdir()
            raise
        return CommandCgroup(path, self.version)

    def describe(self) -> str:
        return f"pids cgroup{' v1' if self.version == 1 else ''}"


def _mounts() -> list[tuple[Path, str, set[str]]]:
    """(mount point, file system type, super options) of every mount, from mountinfo."""
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        fields, rest = left.split(), right.split()
        if len(fields) < 5 or len(rest) < 3:
            continue
        point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])  # \040
        out.append((Path(point), rest[0], set(rest[2].split(","))))
    return out


def _candidates() -> list[tuple[Path, Literal[1, 2]]]:
    found: list[tuple[Path, Literal[1, 2]]] = []
    mounts = _mounts()
    for point, fstype, _ in mounts:
        if fstype == "cgroup2":
            with contextlib.suppress(OSError):
                if "pids" in (point / "cgroup.controllers").read_text().split():
                    found.append((point, 2))
    found += [(point, 1) for point, fstype, options in mounts
              if fstype == "cgroup" and "pids" in options]
    return found


def _remove_stale(base: Path) -> None:
    """Folders a gateway that is no longer running left behind (a crash mid-command)."""
    for child in base.iterdir():
        owner = child.name.partition("-")[0]
        if child.is_dir() and owner.isdigit() and not Path(f"/proc/{owner}").exists():
            with contextlib.suppress(OSError):
                child.rmdir()


def find_pids_cgroups() -> PidsCgroups | str:
    """A place for per-command pids cgroups, tried once for real; else why there is none."""
    try:
        candidates = _candidates()
    except OSError as exc:
        return f"cannot read the mounts ({exc.strerror})"
    if not candidates:
        return "no cgroup hierarchy with the pids controller is mounted"
    problems = []
    for point, version in candidates:
        base = point / BASE_NAME
        try:
            base.mkdir(exist_ok=True)
            if version == 2:
                (base / "cgroup.subtree_control").write_text("+pids")
            _remove_stale(base)
            cgroups = PidsCgroups(base, version)
            trial = cgroups.create(8)
            trial.path.rmdir()
            return cgroups
        except OSError as exc:
            problems.append(f"{base}: {exc.strerror or exc}")
    return "no pids cgroup can be made (" + "; ".join(problems) + ")"
