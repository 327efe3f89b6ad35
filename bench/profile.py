"""``--profile``: where the gateway's CPU goes, sampled with py-spy from outside the process.

py-spy is not a dependency of the project; install it into the virtual environment for this
(``.venv/bin/pip install py-spy``). Profiles are taken in passes of their own, after the
measurements, so sampling never slows a figure that is reported. Raw collapsed stacks go to
``bench/results/profile-<phase>.txt`` (open them with speedscope or flamegraph.pl); the JSON
report gets, per phase, the share of samples by package (innermost frame), the functions with
the most self time, and the functions of ours with the most inclusive time.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.client import LocalClient
from bench.load import concurrent_chats
from bench.procs import BIN, ROOT, GatewayProcess, ModelServer
from bench.turns import series

RATE = 250
OURS = ("gateway/", "agent/", "channels/", "workspace/")
_FRAME = re.compile(r"^(?P<func>.*) \((?P<file>[^()]*):(?P<line>\d+)\)$")
_BUCKETS = (
    ("litellm", "/litellm/"), ("openai", "/openai/"), ("httpx", "/httpx/"),
    ("httpcore", "/httpcore/"), ("aiohttp", "/aiohttp/"), ("pydantic", "/pydantic"),
    ("tiktoken", "/tiktoken"), ("aiosqlite", "/aiosqlite/"), ("yaml", "/yaml/"),
    ("asyncio", "/asyncio/"), ("json", "/json/"), ("logging", "/logging/"),
)


def py_spy() -> str | None:
    found = BIN / "py-spy"
    return str(found) if found.exists() else shutil.which("py-spy")


@contextmanager
def recording(pid: int, out: Path) -> Iterator[None]:
    exe = py_spy()
    if exe is None:
        raise RuntimeError("py-spy is not installed: .venv/bin/pip install py-spy")
    proc = subprocess.Popen([exe, "record", "--pid", str(pid), "--format", "raw", "--function",
                             "--full-filenames", "--gil", "--threads", "--rate", str(RATE),
                             "--output", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _where(path: str) -> str:
    """A short name: ``agent/loop.py`` for ours, ``litellm/main.py`` for a library."""
    for marker in ("/site-packages/", "/lib/python3."):
        if marker in path:
            tail = path.split(marker, 1)[1]
            return tail.split("/", 1)[1] if marker == "/lib/python3." else tail
    root = str(ROOT) + "/"
    return path[len(root):] if path.startswith(root) else path


def _bucket(path: str) -> str:
    short = _where(path)
    if short.startswith(OURS):
        return "ours (" + short.split("/", 1)[0] + ")"
    for name, marker in _BUCKETS:
        if marker in path:
            return name
    if "sqlite3" in path:
        return "sqlite3"
    return "other stdlib" if "/lib/python3." in path else "other"


def summarize(raw: Path, top: int = 25) -> dict[str, Any]:
    """Shares of the samples that held the GIL (the gateway is one busy Python thread), by
    thread, by package (innermost frame) and by function."""
    total = 0
    by_bucket: Counter[str] = Counter()
    self_time: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    inclusive_all: Counter[str] = Counter()
    threads: Counter[str] = Counter()
    for line in raw.read_text(encoding="utf-8", errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = []
        parts = stack.split(";")
        thread = "?"
        if parts[0].startswith("thread ("):
            thread = parts.pop(0).split(": ", 1)[-1]
            thread = re.sub(r"[-_ ]?\d+$", "", thread) or thread  # one name per pool
        for part in parts:
            m = _FRAME.match(part)
            if m:
                frames.append((m["func"], m["file"], m["line"]))
        if not frames:
            continue
        total += count
        threads[thread] += count
        func, path, lineno = frames[-1]
        by_bucket[_bucket(path)] += count
        self_time[f"{func} ({_where(path)}:{lineno})"] += count
        seen = set()
        for func, path, lineno in frames:
            short = _where(path)
            key = f"{func} ({short}:{lineno})"
            if key in seen or "asyncio/" in short or short.startswith(("typer/", "click/")):
                continue  # the event loop and the command line sit under everything
            seen.add(key)
            inclusive_all[key] += count
            if short.startswith(OURS):
                inclusive[key] += count

    def shares(counter: Counter[str], n: int) -> list[tuple[str, float]]:
        return [(k, round(v / total * 100, 1)) for k, v in counter.most_common(n)]

    return {"samples": total, "rate_hz": RATE, "by_thread_pct": shares(threads, 10),
            "by_package_pct": shares(by_bucket, 20),
            "top_self_pct": shares(self_time, top), "ours_inclusive_pct": shares(inclusive, top),
            "top_inclusive_pct": shares(inclusive_all, top),
            "raw": str(raw)}


def _wait_file(path: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no tracemalloc snapshot at {path}")
        time.sleep(0.05)


def _signal_and_wait(gateway: GatewayProcess, path: Path) -> None:
    os.kill(gateway.pid, signal.SIGUSR1)
    _wait_file(path)


async def memory_profile(server: ModelServer, root: Path, *, sessions: int,
                         turns: int) -> dict[str, Any]:
    """Which lines hold the memory that sessions add. The gateway runs under
    ``bench.harness``; tracing starts once it is warm; ``sessions`` sessions fill the pools
    and caches that do not grow with sessions (snapshot 1); ``sessions`` more follow
    (snapshot 2). What grew from 1 to 2, divided by ``sessions``, is the cost of a session."""
    import tracemalloc

    from bench.load import many_sessions
    from bench.memory import _ready

    prefix = root / "tracemalloc" / "snap"
    gateway = GatewayProcess(root / "tracemalloc", server.base_url, tracemalloc_prefix=prefix)
    gateway.start()
    failed = 0
    rss: list[int] = []
    try:
        async with LocalClient(gateway.base_url) as client:
            await _ready(client, gateway)
            await asyncio.to_thread(_signal_and_wait, gateway, Path(f"{prefix}-started"))
            for stage in (1, 2):
                load = await many_sessions(client, gateway, server, sessions=sessions,
                                           turns=turns, concurrency=min(sessions, 50),
                                           tag=f"tm{stage}")
                failed += load["turns_failed"]
                await asyncio.sleep(0.5)
                await asyncio.to_thread(_signal_and_wait, gateway, Path(f"{prefix}-{stage}.snap"))
                rss.append(gateway.memory()["rss"])
    finally:
        gateway.stop()
    first = tracemalloc.Snapshot.load(f"{prefix}-1.snap")
    second = tracemalloc.Snapshot.load(f"{prefix}-2.snap")
    lines = second.compare_to(first, "lineno")
    grown = sum(d.size_diff for d in lines)
    return {
        "sessions_per_stage": sessions, "turns_per_session": turns, "turns_failed": failed,
        "traced_growth_kb_per_session": round(grown / 1024 / sessions, 2),
        "rss_growth_kb_per_session_under_tracemalloc": round((rss[1] - rss[0]) / sessions, 2),
        "top_lines": [{"where": f"{_where(d.traceback[0].filename)}:{d.traceback[0].lineno}",
                       "kb_per_session": round(d.size_diff / 1024 / sessions, 2),
                       "blocks_per_session": round(d.count_diff / sessions, 1)}
                      for d in lines[:15]],
        "top_tracebacks": [{"kb_per_session": round(d.size_diff / 1024 / sessions, 2),
                            "stack": [f"{_where(f.filename)}:{f.lineno}" for f in d.traceback]}
                           for d in second.compare_to(first, "traceback")[:10]],
    }


async def gateway_profiles(client: LocalClient, gateway: GatewayProcess, server: ModelServer,
                           root: Path, sizes: Any) -> dict[str, Any]:
    out_dir = ROOT / "bench" / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    phases: dict[str, Any] = {}
    plans = (
        ("plain", lambda: series(client, gateway, server, "profile-plain", "plain",
                                 sizes.turns)),
        ("tool", lambda: series(client, gateway, server, "profile-tool", "tool:",
                                max(20, sizes.turns // 2))),
        ("load100", lambda: concurrent_chats(client, gateway, server, chats=100,
                                             seconds=sizes.load_seconds, tag="profile100")),
    )
    for name, run in plans:
        print(f"profiling: {name}", file=sys.stderr)
        raw = out_dir / f"profile-{name}.txt"
        with recording(gateway.pid, raw):
            await asyncio.sleep(0.5)  # py-spy attaching
            await run()
        phases[name] = summarize(raw)
    return phases
