"""The one-line explanations of start-up failures, from the real errors SQLite and the
socket layer raise."""

from __future__ import annotations

import socket
import sqlite3
from pathlib import Path

import pytest

from gateway.kernel.config import parse_config
from gateway.preflight import disk_problem, explain, free_bytes


def _config(tmp_path: Path, port: int = 0):  # type: ignore[no-untyped-def]
    return parse_config({"workspace": str(tmp_path / "ws"), "data_dir": str(tmp_path / "data"),
                         "channels": {"local": {"port": port}}}, env={})


def test_a_full_database_is_explained(tmp_path: Path) -> None:
    config = _config(tmp_path)
    with sqlite3.connect(tmp_path / "full.db") as db:
        db.execute("CREATE TABLE t (x)")
        db.execute("PRAGMA max_page_count = 2")  # SQLite's own "database or disk is full"
        try:
            db.execute("INSERT INTO t VALUES (?)", ("x" * 100_000,))
        except sqlite3.OperationalError as exc:
            error = exc
    line = explain(error, config)
    assert line is not None and line.startswith(f"data_dir: the disk holding {config.db_path}")
    assert "free some space" in line


def test_a_port_in_use_names_its_key(tmp_path: Path) -> None:
    with socket.socket() as taken, socket.socket() as second:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        try:
            second.bind(("127.0.0.1", port))
        except OSError as exc:
            error = exc
        line = explain(error, _config(tmp_path, port))  # while it is still taken
    assert line is not None
    assert line.startswith(f"channels.local.port: 127.0.0.1:{port} is already in use")


def test_too_little_disk_space(tmp_path: Path) -> None:
    config = _config(tmp_path)
    assert disk_problem(config, minimum=1) is None
    problem = disk_problem(config, minimum=free_bytes(tmp_path) * 2 + 1)
    assert problem is not None and problem.key == "data_dir" and "MB free" in problem.message


def test_unknown_failures_are_not_explained(tmp_path: Path) -> None:
    assert explain(ValueError("a bug"), _config(tmp_path)) is None


def test_the_gateway_runs_on_uvloop_unless_told_otherwise(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio

    import uvloop

    from gateway.cli_common import loop_factory, run_sync

    async def which() -> str:
        return type(asyncio.get_running_loop()).__module__

    monkeypatch.delenv("PARLEY_EVENT_LOOP", raising=False)
    assert loop_factory() is uvloop.new_event_loop
    assert run_sync(which(), fast_loop=True).startswith("uvloop")
    assert run_sync(which()).startswith("asyncio")  # the other commands: the standard loop
    monkeypatch.setenv("PARLEY_EVENT_LOOP", "asyncio")
    assert run_sync(which(), fast_loop=True).startswith("asyncio")


def test_a_started_gateway_settles_the_collector() -> None:
    """``parley gateway`` once started: start-up's objects frozen out of the collector's
    sight, the young generation collected less often (bench/RESULTS.md, round seven)."""
    import gc

    from gateway.app import GC_THRESHOLD, settle_gc

    before = gc.get_threshold()
    try:
        settle_gc()
        assert gc.get_threshold() == GC_THRESHOLD
        assert gc.get_freeze_count() > 10_000
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
