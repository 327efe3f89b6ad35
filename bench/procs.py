"""Subprocesses the benchmark drives, and what /proc says about them.

CPU time is utime+stime of every thread of the process (``/proc/<pid>/stat``), in clock ticks
(10 ms on Linux), so it is only read as deltas over many turns. Memory is ``VmRSS`` and the
peak ``VmHWM`` from ``/proc/<pid>/status``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from bench import MODEL

_TICK = os.sysconf("SC_CLK_TCK")
BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parents[1]


def _pythonpath() -> str:
    """Children import the code this ``bench`` sits beside (a checkout or an exported
    snapshot), not whatever the virtual environment's editable install points at."""
    rest = os.environ.get("PYTHONPATH")
    return f"{ROOT}{os.pathsep}{rest}" if rest else str(ROOT)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds the process used so far, to the nanosecond: the scheduler's
    own count of each thread's time on a CPU (``/proc/<pid>/task/*/schedstat``; a process's
    ``utime`` and ``stime`` come in clock ticks, 10 ms, ±3 % of a 200-turn series' CPU). A
    thread that ended is no longer counted: the processes measured keep theirs (their
    database and executor threads live as long as they do). Where there is no schedstat,
    the ticks."""
    total = 0
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/schedstat", encoding="ascii") as fh:
                    total += int(fh.read().split()[0])
            except FileNotFoundError:  # the thread ended meanwhile
                continue
    except OSError:
        total = 0
    if total:
        return total / 1e9
    with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
        rest = fh.read().rsplit(")", 1)[1].split()
    return (int(rest[11]) + int(rest[12])) / _TICK  # fields 14 and 15: utime, stime


def memory_kb(pid: int) -> dict[str, int]:
    """``{"rss": VmRSS, "hwm": VmHWM}`` in KiB."""
    out: dict[str, int] = {}
    with open(f"/proc/{pid}/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith(("VmRSS:", "VmHWM:")):
                key, value = line.split(":", 1)
                out[key[2:].lower()] = int(value.split()[0])
    return out


def machine_cpu_seconds() -> tuple[float, float]:
    """(busy, all) CPU seconds of the whole machine so far, summed over its CPUs. Busy is user,
    nice and system time, the columns processes are charged in; interrupt time (loopback
    traffic's softirqs, ours too) is left out. Other work on a shared machine shows as busy
    time that none of our processes used."""
    with open("/proc/stat", encoding="ascii") as fh:
        values = [int(v) for v in fh.readline().split()[1:]]
    return sum(values[:3]) / _TICK, sum(values[:8]) / _TICK


def own_cpu_seconds() -> float:
    return time.process_time()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _terminate(proc: subprocess.Popen[Any], timeout: float = 15.0) -> float:
    """SIGTERM, wait; SIGKILL if it does not stop. Returns the seconds it took."""
    if proc.poll() is not None:
        return 0.0
    started = time.perf_counter()
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    return time.perf_counter() - started


# -- CPU placement --------------------------------------------------------------------------------

PINNING: dict[str, set[int]] = {}
"""``--pin``: role ("gateway", "helpers") → CPUs. Empty: the scheduler places everything."""


def pin(pid: int, role: str) -> None:
    cpus = PINNING.get(role)
    if cpus:
        os.sched_setaffinity(pid, cpus)


def plan_pinning() -> dict[str, set[int]]:
    """The gateway alone on the last CPU, the model server and the client on the others: a
    turn hands off between three processes, and where the scheduler puts each (same core or
    not) moves a sequential turn's latency by ±0.5 ms in steps mid-run."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return {}
    return {"gateway": {cpus[-1]}, "helpers": set(cpus[:-1])}


# -- the scripted model server -------------------------------------------------------------------

@dataclass
class ModelServer:
    """``bench.llm_server`` in its own process."""

    proc: subprocess.Popen[str]
    base_url: str
    control: str

    @classmethod
    def start(cls) -> ModelServer:
        proc = subprocess.Popen([sys.executable, "-m", "bench.llm_server"],
                                stdout=subprocess.PIPE, text=True, cwd=ROOT,
                                env={**os.environ, "PYTHONPATH": _pythonpath()})
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line:
            proc.wait()
            raise RuntimeError("bench.llm_server did not start")
        info = json.loads(line)
        pin(proc.pid, "helpers")
        return cls(proc, info["base_url"], info["control"])

    @property
    def pid(self) -> int:
        return self.proc.pid

    def last_request(self) -> dict[str, Any]:
        """``{"body": <parsed JSON>, "bytes": Content-Length, "count": requests so far}``."""
        with urllib.request.urlopen(f"{self.control}/last", timeout=5) as resp:
            return dict(json.loads(resp.read()))

    def recent_requests(self, n: int) -> list[dict[str, Any]]:
        """The last ``n`` requests (``{"body", "bytes"}``), oldest first."""
        with urllib.request.urlopen(f"{self.control}/recent?n={n}", timeout=5) as resp:
            return list(json.loads(resp.read())["requests"])

    def stop(self) -> None:
        _terminate(self.proc, 5.0)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


# -- the gateway ---------------------------------------------------------------------------------

def write_config(root: Path, port: int, transport: str = "auto") -> Path:
    """The config ``parley onboard`` writes, with the local channel on ``port``, and the
    workspace seeded from the templates (as onboard does); ``agent.transport`` when it is not
    the default."""
    from gateway.cli import ONBOARD_CONFIG
    from workspace.bootstrap import seed_workspace

    data = yaml.safe_load(ONBOARD_CONFIG.format(workspace=root / "workspace",
                                                data_dir=root / "data"))
    data["channels"]["local"]["port"] = port
    data["channels"]["webchat"]["enabled"] = False  # onboard turns it on; not what is measured
    if transport != "auto":
        data["agent"]["transport"] = transport
    # Every tool available (web_search needs a provider; it is never reached here), so the
    # first "hello" is measured with all of them offered or named.
    tools = data["agent"].setdefault("tools", {}) or {}
    data["agent"]["tools"] = tools
    tools.setdefault("web", {})["search"] = {"provider": "searxng",
                                             "base_url": "http://127.0.0.1:9"}
    seed_workspace(root / "workspace")
    path = root / "config.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


class GatewayProcess:
    """``parley gateway --config FILE`` with the model and API base from the environment, as
    the README shows (``PARLEY_MODEL``, ``PARLEY_API_BASE``)."""

    transport = "auto"
    """``agent.transport`` of every gateway of this run (``--transport``)."""

    def __init__(self, root: Path, api_base: str, *, tracemalloc_prefix: Path | None = None,
                 ) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.tracemalloc_prefix = tracemalloc_prefix
        self.root = root
        self.port = free_port()
        self.config = write_config(root, self.port, self.transport)
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log_path = root / "gateway.log"
        self.env = {**os.environ, "PYTHONPATH": _pythonpath(), "PARLEY_MODEL": MODEL,
                    "PARLEY_API_BASE": api_base, "PARLEY_API_KEY": "bench-key",
                    "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def spawn(self) -> None:
        log = open(self.log_path, "ab")  # handed to the child, closed here
        self.started_at = time.perf_counter()
        command = [str(BIN / "parley"), "gateway", "--config", str(self.config)]
        harness: list[str] = []  # bench.harness: the same command, instrumented
        if self.tracemalloc_prefix is not None:
            harness += ["--tracemalloc", str(self.tracemalloc_prefix)]
        if harness:
            command = [sys.executable, "-m", "bench.harness", *harness, "--", *command[1:]]
        self.proc = subprocess.Popen(command, stdout=log, stderr=log, env=self.env)
        pin(self.proc.pid, "gateway")
        log.close()

    def wait_healthy(self, timeout: float = 30.0) -> float:
        """Seconds from spawn until ``GET /v1/health`` answers 200 with the gateway running."""
        deadline = time.perf_counter() + timeout
        url = f"{self.base_url}/v1/health"
        while time.perf_counter() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(
                    f"gateway exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(url, timeout=1) as resp:
                    if resp.status == 200 and json.loads(resp.read()).get("gateway") == "running":
                        return time.perf_counter() - self.started_at
            except OSError:
                pass
            time.sleep(0.005)
        raise TimeoutError(f"gateway not healthy within {timeout} s:\n{self.log_tail()}")

    def start(self) -> float:
        self.spawn()
        return self.wait_healthy()

    def stop(self) -> float:
        """Seconds SIGTERM took to stop the gateway (it drains)."""
        return _terminate(self.proc) if self.proc is not None else 0.0

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def cpu(self) -> float:
        return cpu_seconds(self.pid)

    def memory(self) -> dict[str, int]:
        return memory_kb(self.pid)


class SkeletonProcess:
    """``bench.skeleton`` (the gateway's I/O and nothing else) in its own process, pinned
    where the gateway is, for item 3's row beside the gateway's."""

    def __init__(self, root: Path, api_base: str) -> None:
        root.mkdir(parents=True, exist_ok=True)
        port = free_port()
        self.base_url = f"http://127.0.0.1:{port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.skeleton", api_base, str(port),
             str(root / "skeleton.db")],
            stdout=subprocess.PIPE, text=True, cwd=ROOT,
            env={**os.environ, "PYTHONPATH": _pythonpath()})
        pin(self.proc.pid, "gateway")
        assert self.proc.stdout is not None
        if not self.proc.stdout.readline():
            self.proc.wait()
            raise RuntimeError("bench.skeleton did not start")

    @property
    def pid(self) -> int:
        return self.proc.pid

    def cpu(self) -> float:
        return cpu_seconds(self.pid)

    def stop(self) -> None:
        _terminate(self.proc, 5.0)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
