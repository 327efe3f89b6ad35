"""Several gateway processes on one PostgreSQL (issue 19): ``python -m bench --only postgres``.

- throughput: 100 chats, each sending its next message once the last was answered, spread over
  1, 2 and 4 ``parley gateway`` processes on one PostgreSQL (chat j talks to process j mod N,
  posting and reading there; its turns run wherever its chat's lease is). Answered turns per
  second of wall time; every answer is checked (the scripted model echoes).
- failover: two processes, a share of the chats held by each; the holder of half of them is
  killed with SIGKILL, then every chat gets one message through the survivor. The failover time
  is from the kill until the last of the dead process's chats is answered: at most its lease
  (``cluster.lease``, set short here and reported) plus a claim and a turn.

The database is ``PARLEY_BENCH_POSTGRES`` (a ``postgresql://`` URL; each run makes its own
databases there) or, without it, a throwaway cluster from Debian's ``postgresql`` package
(``tests/fakes/postgres.py``: fsync and synchronous commit off, so its figures are an upper
bound). Gateways are not pinned to one CPU here (several of them share the machine).

Throughput is measured twice: unconstrained (the gateways share the machine's cores with
PostgreSQL, the model server and the client, so on a 2-core machine more processes cannot do
more), and with a fixed CPU budget per gateway process (``bench/cpu_budget.py``: a cgroup each,
``BUDGET_CPUS`` CPU), which emulates a machine per process: the ratio of 2 processes to 1 is
then what the cluster's own costs (claims, leases, wake-ups, contention in PostgreSQL) leave of
2×. Each row also says the CPU a turn cost each side (gateways, PostgreSQL when it is the
throwaway cluster, the model server, the client).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import psycopg
import yaml

from bench.client import LocalClient
from bench.cpu_budget import CpuBudget
from bench.load import _Tally
from bench.procs import PINNING, GatewayProcess, ModelServer, cpu_seconds, own_cpu_seconds
from bench.stats import summary_ms

CHATS = 100
PROCESSES = (1, 2, 4)
LEASE_S = 3.0
BUDGET_ORDER = ("1", "2", "2-separate", "4", "2-separate", "2", "1")
"""The budgeted rows' order: each measured before and after the others (ABBA), so a drift of
the shared machine's speed over the run (other work on the host: the same CPU time buys less
work) weighs on all alike. ``2-separate``: two gateways each on a database of its own, no
cluster between them: what two processes cost each other on this machine without the
cluster, the yardstick for the cluster's own cost (clustered 2 / separate 2)."""
BUDGET_CPUS = 0.3
"""CPU per gateway process in the budgeted rows. Two of them (0.6) leave 1.4 of a 2-core
machine to PostgreSQL, the model server and the client (together ~2.5 ms of CPU a turn, so
~0.5 CPU at the ~200 turns/s two budgeted processes do) and to other work on the machine:
every budgeted process can have its whole budget for 1 and 2 processes. Four (1.2) do not fit
next to the rest on 2 cores: that row is reported, but it measures the machine."""


class _Database:
    """Fresh databases on ``PARLEY_BENCH_POSTGRES`` or on a throwaway cluster."""

    def __init__(self) -> None:
        self.url = os.environ.get("PARLEY_BENCH_POSTGRES")
        self.cluster: Any = None
        self.kind = "PARLEY_BENCH_POSTGRES" if self.url else "throwaway (fsync off)"
        self._n = 0

    def start(self) -> None:
        if self.url:
            return
        from tests.fakes.postgres import PostgresCluster, find_bin_dir

        bin_dir = find_bin_dir()
        if bin_dir is None:
            raise RuntimeError("PostgreSQL is not installed (make system-deps installs it), "
                               "and PARLEY_BENCH_POSTGRES is not set")
        self.cluster = PostgresCluster(bin_dir)
        self.cluster.start()
        self.url = self.cluster.url()

    def stop(self) -> None:
        if self.cluster is not None:
            self.cluster.stop()

    def cpu(self) -> float | None:
        """CPU seconds the throwaway cluster's processes used so far (None: a server of
        ``PARLEY_BENCH_POSTGRES``, not ours to read)."""
        if self.cluster is None:
            return None
        try:
            first = (self.cluster.data / "postmaster.pid").read_text().split("\n", 1)[0]
        except OSError:
            return None
        return sum(cpu_seconds(pid) for pid in _family(int(first)))

    def fresh(self) -> str:
        assert self.url is not None
        self._n += 1
        name = f"parley_bench_{os.getpid()}_{self._n}"
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url.rsplit("/", 1)[0] + "/" + name


def _family(parent: int) -> list[int]:
    """``parent`` and its children (PostgreSQL's backends are the postmaster's)."""
    out = [parent]
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat", encoding="ascii") as fh:
                    if int(fh.read().rsplit(")", 1)[1].split()[1]) == parent:
                        out.append(int(entry.name))
            except (OSError, ValueError, IndexError):
                pass
    return out


def _safe_cpu(pid: int) -> float:
    try:
        return cpu_seconds(pid)
    except OSError:  # ended meanwhile
        return 0.0


def _gateways(root: Path, api_base: str, url: str, n: int,
              budget: CpuBudget | None = None) -> list[GatewayProcess]:
    """``n`` gateways on ``url``, started one after the other, each healthy; each confined
    to ``budget`` once started (its start is not what is measured)."""
    out: list[GatewayProcess] = []
    for i in range(n):
        gw = GatewayProcess(root / f"gw{i}", api_base)
        data = yaml.safe_load(gw.config.read_text(encoding="utf-8"))
        data["database"] = url
        data["cluster"] = {"lease": f"{LEASE_S:g}s"}
        _quiet(data)
        gw.config.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
        out.append(gw)
    for gw in out:
        gw.start()
        if budget is not None:
            budget.confine(gw.pid)
    return out


def _quiet(data: dict[str, Any]) -> None:
    """No schedules: only the turns are measured."""
    data["cron"] = {"enabled": False}
    data["heartbeat"] = {"enabled": False}


async def _load(clients: list[LocalClient], seconds: float, tag: str) -> dict[str, Any]:
    tally = _Tally()
    deadline = time.perf_counter() + seconds

    async def chat(j: int) -> None:
        client, i = clients[j % len(clients)], 0
        while time.perf_counter() < deadline:
            await tally.turn(client, f"{tag}-{j}", f"load {i} from chat {j}")
            i += 1

    started = time.perf_counter()
    await asyncio.gather(*(chat(j) for j in range(CHATS)))
    wall = time.perf_counter() - started
    return {"processes": len(clients), "chats": CHATS, "turns_done": tally.done,
            "turns_failed": tally.failed, "errors": tally.errors, "wall_s": round(wall, 2),
            "turns_per_s": round(tally.done / wall, 1) if wall else None,
            "latency": summary_ms(tally.latencies), "loadavg_1m": round(os.getloadavg()[0], 2)}


async def throughput(root: Path, server: ModelServer, db: _Database, n: int,
                     seconds: float, budget: CpuBudget | None = None,
                     separate: bool = False) -> dict[str, Any]:
    """``separate``: each gateway on a database of its own (no cluster between them)."""
    with ExitStack() as stack:
        if separate:
            gateways = [gw for i in range(n) for gw in _gateways(
                root / f"n{n}-{i}", server.base_url, db.fresh(), 1, budget)]
        else:
            gateways = _gateways(root / f"n{n}", server.base_url, db.fresh(), n, budget)
        for gw in gateways:
            stack.callback(gw.stop)
        clients = [LocalClient(gw.base_url) for gw in gateways]
        for client in clients:
            await client.__aenter__()
        try:
            await _load(clients, min(seconds, 2.0), f"warm{n}")  # leases taken, code warm

            def cpu() -> tuple[float, float | None, float, float, float]:
                return (sum(_safe_cpu(gw.pid) for gw in gateways), db.cpu(),
                        _safe_cpu(server.pid), own_cpu_seconds(),
                        budget.throttled_s() if budget else 0.0)

            before = cpu()
            out = await _load(clients, seconds, f"load{n}")
            after = cpu()
        finally:
            for client in clients:
                await client.__aexit__(None, None, None)
    turns = out["turns_done"] or 1
    spent = {name: None if a is None or b is None else round((b - a) * 1000 / turns, 2)
             for name, a, b in zip(("gateways", "postgres", "model_server", "client"),
                                   before, after, strict=False)}
    out["cpu_ms_per_turn"] = spent
    if budget is not None:
        out["throttled_s"] = round(after[4] - before[4], 2)
    return out


async def failover(root: Path, server: ModelServer, db: _Database) -> dict[str, Any]:
    """Seconds from ``kill -9`` of one of two processes until each of its chats answered."""
    url = db.fresh()
    [victim] = _gateways(root / "failover-a", server.base_url, url, 1)
    gateways = [victim]
    try:
        async with LocalClient(victim.base_url) as to_victim:
            tally = _Tally()
            chats = [f"fo-{j}" for j in range(20)]
            # the first ten chats while the victim runs alone: it holds them
            await asyncio.gather(*(tally.turn(to_victim, chat, f"before {j}")
                                   for j, chat in enumerate(chats[:10])))
            [survivor] = _gateways(root / "failover-b", server.base_url, url, 1)
            gateways.append(survivor)
            to_survivor = LocalClient(survivor.base_url)
            await to_survivor.__aenter__()
            await asyncio.gather(*(tally.turn(to_survivor, chat, f"before {j}")
                                   for j, chat in enumerate(chats[10:], 10)))
            with psycopg.connect(url) as conn:
                rows = conn.execute(
                    "SELECT l.chat_id FROM chat_leases l JOIN cluster_processes p "
                    "ON p.id = l.holder WHERE p.pid = %s", (victim.pid,)).fetchall()
            held = {r[0] for r in rows}
            to_survivor.after.update(to_victim.after)
            assert victim.proc is not None
            killed = time.perf_counter()
            os.kill(victim.pid, signal.SIGKILL)
            victim.proc.wait()
            answered: dict[str, float] = {}

            async def one(j: int, chat: str) -> None:
                await tally.turn(to_survivor, chat, f"after {j}")
                answered[chat] = time.perf_counter() - killed

            await asyncio.gather(*(one(j, chat) for j, chat in enumerate(chats)))
            await to_survivor.__aexit__(None, None, None)
    finally:
        for gw in gateways:
            gw.stop()
    theirs = [answered[c] for c in held if c in answered]
    mine = [answered[c] for c in chats if c not in held and c in answered]
    return {"lease_s": LEASE_S, "victim_chats": len(held), "turns_failed": tally.failed,
            "errors": tally.errors,
            "failover_s": round(max(theirs), 2) if theirs else None,
            "survivor_chats_max_s": round(max(mine), 2) if mine else None}


async def measure(root: Path, server: ModelServer, seconds: float,
                  say: Any) -> dict[str, Any]:
    db = _Database()
    db.start()
    pinned = dict(PINNING)
    PINNING.clear()  # several gateways: the scheduler places them
    try:
        out: dict[str, Any] = {"database": db.kind, "lease_s": LEASE_S, "throughput": {}}
        for n in PROCESSES:
            say(f"postgres: {CHATS} chats over {n} process(es) for {seconds:g} s")
            out["throughput"][str(n)] = await throughput(root, server, db, n, seconds)
        out["speedup"] = _speedup(out["throughput"])
        budget = CpuBudget(BUDGET_CPUS)
        budgeted: dict[str, Any] = {"cpus_per_process": BUDGET_CPUS, "cgroup": budget.kind}
        out["budgeted"] = budgeted
        problem = budget.problem()
        if problem is not None:
            say(f"postgres: a CPU budget per process is not measured: {problem}")
            budgeted["not_measured"] = problem
        else:
            runs: dict[str, list[dict[str, Any]]] = {}
            try:
                for k, row in enumerate(BUDGET_ORDER):
                    n, separate = int(row[0]), row.endswith("separate")
                    say(f"postgres: {CHATS} chats over {n} process(es) of {BUDGET_CPUS:g} CPU "
                        f"each{' (a database each)' if separate else ''} for {seconds:g} s")
                    runs.setdefault(row, []).append(await throughput(
                        root / f"budgeted{k}", server, db, n, seconds, budget, separate))
                    budget.release()
            finally:
                budget.release()
            budgeted["throughput"] = {n: _combined(r) for n, r in runs.items()}
            budgeted["speedup"] = _speedup(budgeted["throughput"])
            rows = budgeted["throughput"]
            clustered, apart = rows["2"]["turns_per_s"], rows["2-separate"]["turns_per_s"]
            budgeted["cluster_vs_separate"] = (round(clustered / apart, 2)
                                               if clustered and apart else None)
        say(f"postgres: failover after kill -9 of one of two processes (lease {LEASE_S:g} s)")
        out["failover"] = await failover(root, server, db)
        from bench import instructions

        say("postgres: instructions a turn under callgrind, one process and two")
        out["instructions"] = await instructions.measure_cluster(
            root / "instructions", server, db.fresh, _quiet, turns=200)
        return out
    finally:
        PINNING.update(pinned)
        db.stop()


def _speedup(rows: dict[str, Any]) -> dict[str, float | None]:
    """Each row's turns/s over the one-process row's."""
    one = rows["1"]["turns_per_s"] or 0.0
    return {n: round((r["turns_per_s"] or 0.0) / one, 2) if one else None
            for n, r in rows.items()}


def _combined(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Several runs of one row as one: turns over wall time, CPU a turn weighted by turns,
    the mean load; each run's turns/s kept."""
    if len(runs) == 1:
        return runs[0]
    turns = sum(r["turns_done"] for r in runs) or 1
    wall = sum(r["wall_s"] for r in runs)
    out = dict(runs[-1])
    out.update(turns_done=turns, turns_failed=sum(r["turns_failed"] for r in runs),
               wall_s=round(wall, 2), turns_per_s=round(turns / wall, 1) if wall else None,
               runs_turns_per_s=[r["turns_per_s"] for r in runs],
               loadavg_1m=round(sum(r["loadavg_1m"] for r in runs) / len(runs), 2),
               throttled_s=round(sum(r.get("throttled_s", 0.0) for r in runs), 2),
               errors=[e for r in runs for e in r["errors"]])
    out["cpu_ms_per_turn"] = {
        side: None if any(r["cpu_ms_per_turn"][side] is None for r in runs) else round(
            sum(r["cpu_ms_per_turn"][side] * r["turns_done"] for r in runs) / turns, 2)
        for side in runs[0]["cpu_ms_per_turn"]}
    return out
