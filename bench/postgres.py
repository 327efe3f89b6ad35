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
from bench.load import _Tally
from bench.procs import PINNING, GatewayProcess, ModelServer
from bench.stats import summary_ms

CHATS = 100
PROCESSES = (1, 2, 4)
LEASE_S = 3.0


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

    def fresh(self) -> str:
        assert self.url is not None
        self._n += 1
        name = f"parley_bench_{os.getpid()}_{self._n}"
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url.rsplit("/", 1)[0] + "/" + name


def _gateways(root: Path, api_base: str, url: str, n: int) -> list[GatewayProcess]:
    """``n`` gateways on ``url``, started one after the other, each healthy."""
    out: list[GatewayProcess] = []
    for i in range(n):
        gw = GatewayProcess(root / f"gw{i}", api_base)
        data = yaml.safe_load(gw.config.read_text(encoding="utf-8"))
        data["database"] = url
        data["cluster"] = {"lease": f"{LEASE_S:g}s"}
        data["cron"] = {"enabled": False}
        data["heartbeat"] = {"enabled": False}
        gw.config.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
        out.append(gw)
    for gw in out:
        gw.start()
    return out


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
                     seconds: float) -> dict[str, Any]:
    with ExitStack() as stack:
        gateways = _gateways(root / f"n{n}", server.base_url, db.fresh(), n)
        for gw in gateways:
            stack.callback(gw.stop)
        clients = [LocalClient(gw.base_url) for gw in gateways]
        for client in clients:
            await client.__aenter__()
        try:
            await _load(clients, min(seconds, 2.0), f"warm{n}")  # leases taken, code warm
            return await _load(clients, seconds, f"load{n}")
        finally:
            for client in clients:
                await client.__aexit__(None, None, None)


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
        one = out["throughput"]["1"]["turns_per_s"] or 0.0
        out["speedup"] = {n: round((r["turns_per_s"] or 0.0) / one, 2) if one else None
                          for n, r in out["throughput"].items()}
        say(f"postgres: failover after kill -9 of one of two processes (lease {LEASE_S:g} s)")
        out["failover"] = await failover(root, server, db)
        return out
    finally:
        PINNING.update(pinned)
        db.stop()
