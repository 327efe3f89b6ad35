"""``python -m bench [--quick] [--profile] [--only SECTION ...]``: every measurement, a table
with targets, and ``bench/results/latest.json``."""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from rich.console import Console

from bench import (
    context_build,
    exec_cost,
    floor,
    media_cost,
    memory,
    request_size,
    startup,
    stream_latency,
    wakeup,
)
from bench.client import LocalClient, expect
from bench.gateway_db import llm_latencies, split_by_compaction, table_bytes
from bench.load import concurrent_chats
from bench.procs import (
    PINNING,
    ROOT,
    GatewayProcess,
    ModelServer,
    SkeletonProcess,
    pin,
    plan_pinning,
)
from bench.report import checks, noise, print_table, write_json
from bench.turns import kept_per_turn, repeat_summary, series, split_by_model_call

SECTIONS = ("context", "startup", "turns", "memory", "exec", "media", "stream", "postgres",
            "instructions")
console = Console(stderr=True)


@dataclass(frozen=True)
class Sizes:
    turns: int
    series_repeats: int
    floor_calls: int
    load_seconds: float
    mem_sessions: int
    mem_turns: int
    ctx_iterations: int
    startup_runs: int
    exec_commands: int
    stream_replies: int = 100
    cg_turns: int = 200


FULL = Sizes(turns=200, series_repeats=5, floor_calls=200, load_seconds=10.0,
             mem_sessions=1000, mem_turns=10, ctx_iterations=200, startup_runs=3,
             exec_commands=200)
QUICK = Sizes(turns=60, series_repeats=2, floor_calls=60, load_seconds=3.0, mem_sessions=200,
              mem_turns=5, ctx_iterations=50, startup_runs=1, exec_commands=50,
              stream_replies=30, cg_turns=200)


def _say(text: str) -> None:
    console.print(f"[dim]{datetime.now(UTC).strftime('%H:%M:%S')}[/dim] {text}", highlight=False)


_AUTOGROUP = Path("/proc/self/autogroup")


def _autogroup_nice() -> int | None:
    try:
        return int(_AUTOGROUP.read_text(encoding="ascii").split("nice")[1])
    except (OSError, IndexError, ValueError):
        return None


def _set_autogroup_nice(nice: int) -> None:
    try:
        _AUTOGROUP.write_text(str(nice), encoding="ascii")
    except OSError as exc:
        console.print(f"[yellow]could not set the autogroup's nice value: {exc}[/yellow]")


def _renice(nice: int) -> int | None:
    """Our processes at ``nice``; children (model server, gateways, py-spy) inherit it. With
    autogroup scheduling (Linux's default for desktop and container sessions) niceness only
    weighs within a session's group, so the group's nice value is set too; it is shared with
    the shell that started us, so the old value is returned, to be put back."""
    os.nice(nice)
    before = _autogroup_nice()
    if before is not None:
        _set_autogroup_nice(nice)
    return before


def _loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def reference_ms() -> float:
    """How fast this machine runs plain Python today: the best of five runs of a fixed
    workload (a loop, a dict, a JSON round trip), in ms. Absolute figures (CPU a turn,
    turns/s) scale with it: the same commit's gateway CPU a turn was 2.4 times as much on
    2026-11-27's machine as on 2026-11-25's, so runs of different days compare by it."""
    import json

    def work() -> None:
        total, seen = 0, {}
        for i in range(200_000):
            total += i
            seen[i & 1023] = total
        for _ in range(200):
            json.loads(json.dumps(seen))

    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        work()
        best = min(best, time.perf_counter() - t)
    return round(best * 1000, 1)


def machine() -> dict[str, Any]:
    def version(name: str) -> str | None:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None

    model = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            model = next((ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")),
                         "")
    except OSError:
        pass
    return {"cpus": os.cpu_count(), "cpu_model": model, "python": platform.python_version(),
            "reference_ms": reference_ms(),
            "platform": platform.platform(), "code": str(ROOT),
            "versions": {n: version(n) for n in ("litellm", "aiohttp", "openai", "httpx",
                                                 "aiosqlite", "tiktoken")}}


async def turns_section(root: Path, server: ModelServer, sizes: Sizes,
                        results: dict[str, Any], profile: bool) -> None:
    gateway = GatewayProcess(root / "gateway", server.base_url)
    gateway.start()
    try:
        async with LocalClient(gateway.base_url) as client:
            _say("7: the first \"hello\" of a fresh gateway")
            _, record = await client.turn("hello", "hello")
            expect(record, "hello")
            last = server.last_request()
            results["request"] = request_size.measure(last["body"], last["bytes"])
            hello = results["request"]
            _say(f"first \"hello\": {hello['tokens_cl100k']['total']:,} tokens (cl100k), "
                 f"{hello['tokens_o200k']['total']:,} (o200k); tool schemas "
                 f"{hello['tokens_cl100k']['tools']:,} for {', '.join(hello['tool_names'])}")
            _say("warm-up: 20 turns")
            for i in range(10):
                for text in (f"warm-up {i}", f"tool: warm-up {i}"):
                    _, record = await client.turn("warm-up", text)
                    expect(record, text)
            turns: dict[str, Any] = {}
            replays: dict[str, Any] = {}
            for kind, prefix in (("plain", "plain"), ("tool", "tool:")):
                _say(f"1, 2: {sizes.turns} {kind} turns in one session")
                chat = f"series-{kind}"
                turns[kind] = await series(client, gateway, server, chat, prefix, sizes.turns)
                calls = llm_latencies(gateway.root / "data" / "parley.db", f"local:{chat}")
                turns[kind]["gateway_llm_call"] = calls
                turns[kind]["compaction_split"] = split_by_compaction(
                    turns[kind]["samples_ms"], calls.pop("per_turn_calls") if calls else None,
                    plain_calls=1 if kind == "plain" else 2)
                turns[kind]["first_vs_last_split"] = split_by_model_call(
                    turns[kind], calls.pop("per_turn_ms") if calls else None)
                # Item 2 again in fresh sessions: on a shared machine a burst of someone
                # else's work can sit on 10 of the last 20 turns of one series; the median
                # of several series' changes is what the target is read against.
                _say(f"2: {sizes.series_repeats - 1} more {kind} series of {sizes.turns}")
                db = gateway.root / "data" / "parley.db"
                before = table_bytes(db)
                more = [await series(client, gateway, server, f"{chat}-{i}", prefix,
                                     sizes.turns) for i in range(1, sizes.series_repeats)]
                turns[kind]["kept_bytes_long"] = kept_per_turn(
                    before, table_bytes(db), (sizes.series_repeats - 1) * sizes.turns)
                turns[kind]["first_vs_last_repeats"] = repeat_summary(
                    [turns[kind], *more])
                replays[kind] = [r["body"] for r in server.recent_requests(
                    1 if kind == "plain" else 2)]
            results["turns"] = turns
            _say(f"1: the floor, {sizes.floor_calls} bare litellm calls per variant")
            results["floor"] = await floor.measure(
                server.base_url, hello=last["body"], plain=replays["plain"][0],
                tool=replays["tool"], n=sizes.floor_calls)
            results["throughput"] = {}
            for chats in (1, 10, 100):
                _say(f"3: {chats} concurrent chat(s) for {sizes.load_seconds:g} s")
                results["throughput"][str(chats)] = await concurrent_chats(
                    client, gateway, server, chats=chats, seconds=sizes.load_seconds,
                    tag=f"load{chats}")
                wal = gateway.root / "data" / "parley.db-wal"  # bounded: it starts over
                results["throughput"][str(chats)]["wal_bytes_after"] = \
                    wal.stat().st_size if wal.exists() else 0
            _say("3: the same 100 chats, then one, on bench/skeleton.py (the gateway's I/O, "
                 "nothing else)")
            results["throughput"]["skeleton"], results["throughput"]["skeleton_1"] = \
                await skeleton_chats(root, server, sizes)
            if profile:
                from bench import profile as prof

                results["profile"] = await prof.gateway_profiles(client, gateway, server, root,
                                                                 sizes)
        results["gateway_memory_after_turns_kb"] = gateway.memory()
    finally:
        gateway.stop()
    _say("1: a loopback round trip's CPU, the other side on another CPU and on the same")
    results["wakeup"] = wakeup.run_apart(sizes.floor_calls * 10)


async def skeleton_chats(root: Path, server: ModelServer,
                         sizes: Sizes) -> tuple[dict[str, Any], dict[str, Any]]:
    """``bench.skeleton`` at 100 chats, then at one: what the same I/O costs a turn with
    nothing else, where the process never sleeps and where it sleeps twice a turn."""
    skeleton = SkeletonProcess(root / "skeleton", server.base_url)
    try:
        async with LocalClient(skeleton.base_url) as client:
            for i in range(200):
                await client.turn(f"warm-{i % 100}", f"warm {i}")
            many = await concurrent_chats(client, skeleton, server, chats=100,
                                          seconds=sizes.load_seconds, tag="skeleton")
            one = await concurrent_chats(client, skeleton, server, chats=1,
                                         seconds=sizes.load_seconds, tag="skeleton-one")
            return many, one
    finally:
        skeleton.stop()


async def main_async(args: argparse.Namespace) -> int:
    sizes = QUICK if args.quick else FULL
    only = set(args.only or SECTIONS)
    started = time.perf_counter()
    results: dict[str, Any] = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"), "mode":
        "quick" if args.quick else "full", "sizes": sizes.__dict__, "machine": machine(),
        "nice": os.getpriority(os.PRIO_PROCESS, 0), "transport": args.transport,
        "pinning": {role: sorted(cpus) for role, cpus in PINNING.items()},
        "setup": {"model_server": "separate process (bench.llm_server: httptools, uvloop)",
                  "gateway": "separate process (parley gateway, onboard config)",
                  "client": "this process (bench.client: httptools; the long poll is "
                            "written before each POST)"}}
    results["loadavg_start"] = _loadavg()
    section_s: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="parley-bench-") as tmp:
        root = Path(tmp)
        server = ModelServer.start()
        try:
            if "context" in only:
                _say("4: context build, 10 / 1,000 / 10,000 stored messages")
                t = time.perf_counter()
                results["context"] = await context_build.measure(
                    root / "context", (10, 1000, 10_000), sizes.ctx_iterations)
                section_s["context"] = time.perf_counter() - t
            if "startup" in only:
                _say(f"6: start → healthy, {sizes.startup_runs} run(s)")
                t = time.perf_counter()
                results["startup"] = await startup.measure(root, server, sizes.startup_runs)
                section_s["startup"] = time.perf_counter() - t
            if "turns" in only:
                t = time.perf_counter()
                await turns_section(root, server, sizes, results, args.profile)
                section_s["turns"] = time.perf_counter() - t
            if "memory" in only:
                _say(f"5: RSS, {sizes.mem_sessions:,} sessions × {sizes.mem_turns} turns, "
                     "100 concurrent chats")
                t = time.perf_counter()
                gateway = GatewayProcess(root / "memory", server.base_url)
                gateway.start()
                try:
                    results["memory"] = await memory.measure(
                        gateway, server, sessions=sizes.mem_sessions, turns=sizes.mem_turns,
                        concurrency=100)
                finally:
                    gateway.stop()
                section_s["memory"] = time.perf_counter() - t
                if args.profile:
                    from bench import profile as prof

                    _say("profiling memory: tracemalloc in the gateway")
                    t = time.perf_counter()
                    results["memory_profile"] = await prof.memory_profile(
                        server, root, sessions=max(20, sizes.mem_sessions // 20),
                        turns=sizes.mem_turns)
                    section_s["memory_profile"] = time.perf_counter() - t
            if "exec" in only:
                _say(f"8: exec, {sizes.exec_commands} × `echo hi`, sandboxed and on the host")
                t = time.perf_counter()
                results["exec"] = await exec_cost.measure(root, sizes.exec_commands)
                section_s["exec"] = time.perf_counter() - t
            if "media" in only:
                _say(f"9: media, documents read {sizes.ctx_iterations} times, an inbox sweep")
                t = time.perf_counter()
                results["media"] = media_cost.measure(root, sizes.ctx_iterations)
                section_s["media"] = time.perf_counter() - t
            if "stream" in only:
                _say(f"10: live replies, {sizes.stream_replies} × first token → first text")
                t = time.perf_counter()
                results["stream"] = await stream_latency.measure(root / "stream",
                                                                 sizes.stream_replies)
                section_s["stream"] = time.perf_counter() - t
            if "instructions" in only:
                from bench import instructions

                _say(f"12: instructions a turn under callgrind, {sizes.cg_turns} plain turns, "
                     "then 100 chats")
                t = time.perf_counter()
                results["instructions"] = await instructions.measure(
                    root / "instructions", server, turns=sizes.cg_turns)
                section_s["instructions"] = time.perf_counter() - t
            if "postgres" in only:  # issue 19: several processes on one PostgreSQL
                from bench import postgres

                t = time.perf_counter()
                results["postgres"] = await postgres.measure(root / "postgres", server,
                                                             sizes.load_seconds, _say)
                section_s["postgres"] = time.perf_counter() - t
        finally:
            server.stop()
    results["loadavg_end"] = _loadavg()
    results["section_seconds"] = {k: round(v, 1) for k, v in section_s.items()}
    results["total_seconds"] = round(time.perf_counter() - started, 1)
    found = checks(results)
    results["checks"] = [c.as_dict() for c in found]
    out = Path(args.out)
    write_json(out, results)
    title = (f"Parley benchmarks ({results['mode']}, {results['machine']['cpus']} CPUs, "
             f"reference workload {results['machine']['reference_ms']} ms, "
             f"{results['total_seconds']} s"
             + (f", transport {args.transport}" if args.transport != "auto" else "")
             + (", pinned: gateway on CPU " + ",".join(map(str, sorted(PINNING["gateway"])))
                if PINNING else ", not pinned") + ")")
    print_table(found, Console(width=max(Console().width, 130)), title)
    for line in noise(results):
        console.print(f"[yellow]noisy:[/yellow] {line}", highlight=False)
    console.print(f"JSON report: {out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer turns and sessions")
    parser.add_argument("--profile", action="store_true",
                        help="also profile the gateway with py-spy (needs py-spy installed)")
    parser.add_argument("--only", nargs="+", choices=SECTIONS, help="run only these sections")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "latest.json"))
    parser.add_argument("--pin", action=argparse.BooleanOptionalAction, default=True,
                        help="pin the gateway to one CPU and the model server and this client "
                             "to the others (default; --no-pin lets the scheduler place them: "
                             "sequential latencies then move in ±0.5 ms steps mid-run)")
    parser.add_argument("--transport", choices=("auto", "litellm"), default="auto",
                        help="agent.transport of the gateways: auto (the default: the model "
                             "server is called directly) or litellm (every call via litellm)")
    parser.add_argument("--nice", type=int, default=0, metavar="N",
                        help="run the benchmark, model server and gateways at this niceness "
                             "(negative, as root, to measure on a machine others are using)")
    args = parser.parse_args(argv)
    GatewayProcess.transport = args.transport
    if args.pin:
        PINNING.update(plan_pinning())
        pin(os.getpid(), "helpers")
    autogroup = _renice(args.nice) if args.nice else None
    try:
        return asyncio.run(main_async(args))
    finally:
        if autogroup is not None:
            _set_autogroup_nice(autogroup)


if __name__ == "__main__":
    sys.exit(main())
