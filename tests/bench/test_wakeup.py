"""``bench/wakeup.py``: the round trips it times really happen (the peer answers each request
after its work), on the CPUs it was given, and the report shows the figure."""

from __future__ import annotations

import os
import sys

import pytest

from bench import wakeup
from bench.report import checks


def test_the_round_trips_run_on_the_cpus_given_and_are_reported() -> None:
    cpus = sorted(os.sched_getaffinity(0))
    out = wakeup.run_apart(30)
    assert out is not None
    assert out["round_trips"] == 30 and out["peer_work_ms"] == wakeup.PEER_WORK * 1000
    apart = out["other_cpu"]
    if len(cpus) > 1:  # CI's machine has two
        assert apart is not None and apart["cpu_us"] > 0
    for figures in (apart, out["same_cpu"]):
        if figures is not None:
            # each round trip waited for the peer's work: the wall time says it answered
            # after it, not at once (what a peer that skipped it would show)
            assert figures["wall_us"] >= wakeup.PEER_WORK * 1e6
    rows = [row for row in checks({"wakeup": out}) if "loopback round trip" in row.figure]
    assert len(rows) == 1
    assert f"the same CPU: {out['same_cpu']['cpu_us']} µs" in rows[0].figure
    assert rows[0].value == (apart["cpu_us"] if apart is not None else None)


def test_a_failed_measurement_is_none_not_a_crash(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "executable", "/nonexistent/python")
    assert wakeup.run_apart(5) is None
