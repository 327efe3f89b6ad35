"""A fixed CPU budget per process (``bench/postgres.py``): "a core per process" emulated on a
small machine, so that N gateway processes are measured as N equal machines would run them,
not as N processes fighting for the two cores PostgreSQL, the model server and the client use.

Each confined process gets its own cgroup with a CFS quota of ``budget`` × the period (cgroup
v1's ``cpu`` controller: ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``; cgroup v2's
``cpu.max``). The quota is a ceiling: a process never uses more than its budget, and the
budget is chosen so that every confined process can have it at once next to the rest. On a
machine shared with other work a ceiling alone is no "core of its own" (the others may take
the CPU first), so each group also gets a large CPU weight (``SHARES``; v2 ``cpu.weight``):
runnable, it is served before the rest up to its quota and never beyond, a reservation.
Creating cgroups needs root (or a delegated hierarchy); where it cannot be done ``problem()``
says why and the rows are reported as not measured.
"""

from __future__ import annotations

import os
from pathlib import Path

V1 = Path("/sys/fs/cgroup/cpu")
V2 = Path("/sys/fs/cgroup")
PERIOD_US = 100_000
SHARES = 10 * 1024
"""Ten times an ordinary process's weight (v1 ``cpu.shares`` 1024; v2 ``cpu.weight`` 100)."""


def _root() -> tuple[Path, str] | None:
    if (V1 / "cpu.cfs_quota_us").exists():
        return V1, "v1"
    if "cpu" in _read(V2 / "cgroup.subtree_control").split():
        return V2, "v2"
    return None


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="ascii")
    except OSError:
        return ""


class CpuBudget:
    """``confine(pid)`` puts a process (and the threads it starts later) in a cgroup of its own
    limited to ``cpus`` CPUs; ``release()`` removes the groups once their processes ended."""

    def __init__(self, cpus: float) -> None:
        self.cpus = cpus
        self._groups: list[Path] = []
        found = _root()
        self.root, self.kind = found if found else (V1, "none")

    def problem(self) -> str | None:
        """Why processes cannot be confined here (None: they can): tried once, undone."""
        if self.kind == "none":
            return ("no cgroup cpu controller (cgroup v1 /sys/fs/cgroup/cpu or v2 with cpu "
                    "in cgroup.subtree_control)")
        probe = self.root / f"parley-bench-probe-{os.getpid()}"
        try:
            probe.mkdir()
            try:
                self._limit(probe)
            finally:
                probe.rmdir()
        except OSError as exc:
            return f"cannot create a cgroup under {self.root}: {exc.strerror or exc}"
        return None

    def _limit(self, group: Path) -> None:
        quota = int(self.cpus * PERIOD_US)
        if self.kind == "v1":
            (group / "cpu.cfs_period_us").write_text(str(PERIOD_US), encoding="ascii")
            (group / "cpu.cfs_quota_us").write_text(str(quota), encoding="ascii")
            (group / "cpu.shares").write_text(str(SHARES), encoding="ascii")
        else:
            (group / "cpu.max").write_text(f"{quota} {PERIOD_US}", encoding="ascii")
            (group / "cpu.weight").write_text(str(SHARES * 100 // 1024), encoding="ascii")

    def confine(self, pid: int) -> None:
        group = self.root / f"parley-bench-{os.getpid()}-{len(self._groups)}"
        group.mkdir()
        self._groups.append(group)
        self._limit(group)
        (group / "cgroup.procs").write_text(str(pid), encoding="ascii")

    def throttled_s(self) -> float:
        """Seconds the confined processes were held back by their quota so far (v1:
        ``cpu.stat`` ``throttled_time`` in ns; v2: ``throttled_usec``)."""
        total = 0.0
        for group in self._groups:
            for line in _read(group / "cpu.stat").splitlines():
                key, _, value = line.partition(" ")
                if key == "throttled_time":
                    total += int(value) / 1e9
                elif key == "throttled_usec":
                    total += int(value) / 1e6
        return total

    def release(self) -> None:
        """Remove the groups (their processes have stopped; a group still in use stays)."""
        for group in self._groups:
            try:
                group.rmdir()
            except OSError:
                pass
        self._groups.clear()
