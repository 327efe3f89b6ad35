"""``make bench`` item 11's CPU budget per gateway process (``bench/cpu_budget.py``): a process
confined to a cgroup of its own with the quota asked for, the groups removed after; where no
cgroup can be made, a reason and the rows reported as not measured."""

from __future__ import annotations

import subprocess
import sys

from bench.cpu_budget import PERIOD_US, CpuBudget
from bench.report import checks


def test_a_process_gets_its_own_cgroup_with_the_budget_and_it_is_removed_after() -> None:
    budget = CpuBudget(0.25)
    problem = budget.problem()
    if problem is not None:  # no writable cgroup (not root): said, and nothing made
        assert "cgroup" in problem
        return
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        budget.confine(child.pid)
        [group] = budget._groups
        assert str(child.pid) in (group / "cgroup.procs").read_text().split()
        if budget.kind == "v1":
            assert int((group / "cpu.cfs_quota_us").read_text()) == PERIOD_US // 4
            assert int((group / "cpu.cfs_period_us").read_text()) == PERIOD_US
        else:
            assert (group / "cpu.max").read_text().split() == [str(PERIOD_US // 4),
                                                               str(PERIOD_US)]
        assert budget.throttled_s() >= 0.0
    finally:
        child.kill()
        child.wait()
    budget.release()
    assert not group.exists()


def test_budgeted_rows_not_measured_are_said_so_and_judged_on_nothing() -> None:
    results = {"postgres": {"throughput": {"1": {"turns_per_s": 100.0}},
                            "speedup": {"2": 0.9},
                            "budgeted": {"cpus_per_process": 0.3,
                                         "not_measured": "cannot create a cgroup"}}}
    rows = {c.figure: c for c in checks(results) if c.item == "11"}
    ratio = rows["postgres: 2 processes' throughput / 1 process's, 0.3 CPU each"]
    assert ratio.shown == "not measured" and ratio.ok is None
    shared = rows["postgres: 2 processes' throughput / 1 process's, sharing the machine"]
    assert shared.shown == "0.90x" and shared.ok is None

    results["postgres"]["budgeted"] = {"cpus_per_process": 0.3, "speedup": {"2": 1.83}}
    rows = {c.figure: c for c in checks(results) if c.item == "11"}
    assert rows["postgres: 2 processes' throughput / 1 process's, 0.3 CPU each"].ok is True
