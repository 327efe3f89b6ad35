"""Item 12: the gateway's own work per turn as machine instructions, counted by valgrind's
callgrind: the same figure whatever else the machine is doing and however fast it runs that
day, so two commits (or two days) compare within a fraction of a percent where CPU seconds
move by ±20 % (issue 24; measured: the same commit 5.403 and 5.394 M instructions a turn in
two runs, its CPU a turn 3.3 to 4.1 ms in three).

The gateway runs under ``valgrind --tool=callgrind`` (about 50× slower, so turns wait on it,
not on the model): a warm-up, then the counters are zeroed, the turns run, and the counters
are dumped (``callgrind_control``); shutdown is not counted. Two phases: turns one after
another in one chat (item 1's plain turn), and 100 chats at once (item 3's load, where the
group commit and the long polls share work between turns); each chat's first turn (a new
session) runs before the counting. The same run simulates the caches (``CACHES``) and
reports the misses a turn beside the instructions: on this machine they, more than the
instructions, set a turn's CPU. Valgrind hides the CPU's SHA instructions, so OpenSSL's SHA-256
runs its software path here (28 instructions a byte, against 1.8 GB/s on the machine): a
change that hashes less looks several times larger in these counts than in CPU seconds
(``bench/RESULTS.md``, round twenty). Without valgrind the section says so (``apt-get install
valgrind``); it never runs in the tests.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

from bench.client import LocalClient, expect
from bench.procs import BIN, GatewayProcess, ModelServer


def available() -> str | None:
    """None when valgrind and callgrind_control are installed, else why not."""
    missing = [t for t in ("valgrind", "callgrind_control") if shutil.which(t) is None]
    return f"{', '.join(missing)} not installed (apt-get install valgrind)" if missing else None


async def _turns(client: LocalClient, chats: int, per_chat: int, tag: str,
                 first: int = 0) -> None:
    """``per_chat`` turns in each of the chats ``tag-0`` … (numbered from ``first``)."""
    async def chat(j: int) -> None:
        for i in range(first, first + per_chat):
            text = f"{tag} turn {i} in chat {j}"
            _, record = await client.turn(f"{tag}-{j}", text)
            expect(record, text)

    await asyncio.gather(*(chat(j) for j in range(chats)))


CACHES = ("--I1=32768,8,64", "--D1=32768,8,64", "--LL=1048576,16,64")
"""The caches callgrind simulates for the misses a turn (``measure``): 32 KiB first-level
instruction and data caches, a 1 MiB last level, fixed so the figures compare across machines
(valgrind would otherwise take the host's). Why they matter: the gateway runs ~1.1
instructions a nanosecond where a small hot loop runs ~6; a turn's CPU follows the code and
data it touches more than the instructions it runs (``bench/RESULTS.md``, round twelve)."""


def _spawn(gateway: GatewayProcess, out: Path, *, caches: bool = False) -> None:
    """``parley gateway`` under callgrind, as ``GatewayProcess.spawn`` starts it otherwise;
    ``caches``: with the cache simulator (about twice as slow)."""
    log = open(gateway.log_path, "ab")  # handed to the child, closed here
    sim = ["--cache-sim=yes", *CACHES] if caches else []
    gateway.proc = subprocess.Popen(
        ["valgrind", "--tool=callgrind", *sim, f"--callgrind-out-file={out}",
         str(BIN / "parley"), "gateway", "--config", str(gateway.config)],
        stdout=log, stderr=log, env=gateway.env)
    log.close()


def _control(flag: str, pid: int) -> None:
    subprocess.run(["callgrind_control", flag, str(pid)], check=True, capture_output=True,
                   timeout=120)


def _counts(out: Path, before: set[Path]) -> dict[str, int]:
    """Each event's total in the dump ``callgrind_control -d`` just wrote (its ``events:``
    and ``totals:`` lines): ``Ir`` (instructions), and with the cache simulator the misses
    (``I1mr``, ``D1mr``, ``D1mw``, ``ILmr``, ``DLmr``, ``DLmw``)."""
    new = sorted(set(out.parent.glob(out.name + ".*")) - before)
    if not new:
        raise RuntimeError("callgrind wrote no dump")
    events: list[str] = ["Ir"]
    for line in new[-1].read_text(errors="replace").splitlines():
        if line.startswith("events:"):
            events = line.split()[1:]
        elif line.startswith(("totals:", "summary:")):
            return dict(zip(events, map(int, line.split()[1:]), strict=False))
    raise RuntimeError(f"no totals in {new[-1]}")


def _dumped(out: Path, before: set[Path]) -> int:
    """Instructions in the dump ``callgrind_control -d`` just wrote."""
    return _counts(out, before)["Ir"]


async def measure(root: Path, server: ModelServer, *, turns: int) -> dict[str, Any]:
    why = available()
    if why is not None:
        return {"skipped": why}
    gateway = GatewayProcess(root, server.base_url)
    out = root / "callgrind.out"
    _spawn(gateway, out, caches=True)
    results: dict[str, Any] = {"turns": turns}
    try:
        gateway.wait_healthy(timeout=600)
        async with LocalClient(gateway.base_url, wait=600) as client:
            await _turns(client, 10, 4, "warm")
            for phase, chats in (("plain", 1), ("load100", 100)):
                per_chat = max(1, turns // chats)
                await _turns(client, chats, 1, phase)  # each chat's first turn not counted
                before = set(root.glob(out.name + ".*"))
                await asyncio.to_thread(_control, "-z", gateway.pid)
                await _turns(client, chats, per_chat, phase, first=1)
                await asyncio.to_thread(_control, "-d", gateway.pid)
                counts = _counts(out, before)
                n = chats * per_chat
                results[phase] = {
                    "turns": n, "instructions_per_turn_m": round(counts["Ir"] / n / 1e6, 3),
                    # misses a turn, in thousands: first-level instruction, data (reads and
                    # writes), and the last level's (both)
                    "i1_misses_k": round(counts.get("I1mr", 0) / n / 1e3, 1),
                    "d1_misses_k": round((counts.get("D1mr", 0) + counts.get("D1mw", 0))
                                         / n / 1e3, 1),
                    "ll_misses_k": round(sum(counts.get(k, 0) for k in ("ILmr", "DLmr", "DLmw"))
                                         / n / 1e3, 1)}
    finally:
        gateway.stop()
    return results


# -- several processes on one PostgreSQL (issue 19) ------------------------------------------

CLUSTER_LEASE = "120s"
"""Under valgrind a process runs ~50× slower: a lease this long is never missed by its
renewals, so no process is given up for dead while it is being measured."""


async def measure_cluster(root: Path, server: ModelServer, url_for: Any,
                          config: Any, *, turns: int) -> dict[str, Any]:
    """Instructions a turn on PostgreSQL with one process and with two clustered processes
    (100 chats, chat j talking to process j mod N, each chat's first turn not counted):
    ``2 × one / two`` is the throughput two processes would have over one where each has a
    core (or a machine) of its own, the machine's contention left out (the budgeted rows
    measure it with it). ``url_for()``: a fresh database; ``config(data)`` adjusts a gateway's
    config (``bench.postgres``)."""
    why = available()
    if why is not None:
        return {"skipped": why}
    out: dict[str, Any] = {"turns": turns}
    for n in (1, 2):
        url = url_for()
        gateways = []
        for i in range(n):
            gw = GatewayProcess(root / f"n{n}-gw{i}", server.base_url)
            data = yaml.safe_load(gw.config.read_text(encoding="utf-8"))
            config(data)
            data["database"] = url
            data["cluster"] = {"lease": CLUSTER_LEASE}
            gw.config.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
            gateways.append(gw)
        outs = [gw.root / "callgrind.out" for gw in gateways]
        try:
            for gw, cg in zip(gateways, outs, strict=True):
                _spawn(gw, cg)
                gw.wait_healthy(timeout=600)
            clients = [LocalClient(gw.base_url, wait=600) for gw in gateways]
            for client in clients:
                await client.__aenter__()
            try:
                await _spread(clients, 100, 1, "c", 0)
                before = [set(cg.parent.glob(cg.name + ".*")) for cg in outs]
                for gw in gateways:
                    await asyncio.to_thread(_control, "-z", gw.pid)
                per_chat = max(1, turns // 100)
                await _spread(clients, 100, per_chat, "c", 1)
                for gw in gateways:
                    await asyncio.to_thread(_control, "-d", gw.pid)
                count = sum(_dumped(cg, b) for cg, b in zip(outs, before, strict=True))
                out[str(n)] = {"turns": 100 * per_chat, "instructions_per_turn_m": round(
                    count / (100 * per_chat) / 1e6, 3)}
            finally:
                for client in clients:
                    await client.__aexit__(None, None, None)
        finally:
            for gw in gateways:
                if gw.proc is not None:
                    gw.stop()
    one, two = (out.get(k, {}).get("instructions_per_turn_m") for k in ("1", "2"))
    out["projected_speedup_2"] = round(2 * one / two, 2) if one and two else None
    return out


async def _spread(clients: list[LocalClient], chats: int, per_chat: int, tag: str,
                  first: int) -> None:
    """``per_chat`` turns in each of ``chats`` chats, chat j on process j mod N."""
    async def chat(j: int) -> None:
        client = clients[j % len(clients)]
        for i in range(first, first + per_chat):
            text = f"{tag} turn {i} in chat {j}"
            _, record = await client.turn(f"{tag}-{j}", text)
            expect(record, text)

    await asyncio.gather(*(chat(j) for j in range(chats)))
