"""Turn latency in one long session (items 1 and 2) and the gateway's CPU per turn.

Turns run one after another in one chat, so each figure is one turn's latency with nothing
else in flight. CPU per turn is the gateway process's utime+stime over the series divided by
its turns (the model server's and this client's CPU are reported beside it), and
``others_cpu_cores`` the machine's busy CPU that none of them used (see ``bench.load``).
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

from bench.client import LocalClient, expect
from bench.gateway_db import TRANSIENT, stored_bytes, table_bytes
from bench.procs import (
    GatewayProcess,
    ModelServer,
    cpu_seconds,
    machine_cpu_seconds,
    own_cpu_seconds,
)
from bench.stats import percentile, summary_ms


async def series(client: LocalClient, gateway: GatewayProcess, server: ModelServer,
                 chat_id: str, prefix: str, n: int) -> dict[str, Any]:
    latencies: list[float] = []
    db = gateway.root / "data" / "parley.db"
    sizes = [stored_bytes(db)]
    tables: list[dict[str, int] | None] = [None]
    cpu0, srv0, own0 = gateway.cpu(), cpu_seconds(server.pid), own_cpu_seconds()
    busy0 = machine_cpu_seconds()[0]
    started = time.perf_counter()
    for i in range(n):
        text = f"{prefix} turn {i} of the benchmark"
        seconds, record = await client.turn(chat_id, text)
        expect(record, text)
        latencies.append(seconds)
        if i == n // 2 - 1:
            sizes.append(stored_bytes(db))
            tables = [table_bytes(db)]
    sizes.append(stored_bytes(db))
    tables.append(table_bytes(db))
    wall = time.perf_counter() - started
    gw, srv, own = gateway.cpu() - cpu0, cpu_seconds(server.pid) - srv0, own_cpu_seconds() - own0
    others = max(machine_cpu_seconds()[0] - busy0 - gw - srv - own, 0.0) / wall
    edge = max(1, min(20, n // 5))
    first, last = latencies[:edge], latencies[-edge:]
    first_p50, last_p50 = percentile(first, 0.5), percentile(last, 0.5)
    settled = None
    if n >= 30 + 2 * edge:  # once the history window (50 messages) is full
        mid_p50 = percentile(latencies[30:30 + edge], 0.5)
        settled = {"turns": f"{31}-{30 + edge}", "p50_ms": round(mid_p50 * 1000, 3),
                   "last_p50_ms": round(last_p50 * 1000, 3),
                   "change": round(last_p50 / mid_p50 - 1, 4)}
    return {
        "chat_id": chat_id, "turns": n, "wall_s": round(wall, 3),
        "latency": summary_ms(latencies),
        "first_vs_last": {"edge": edge, "first_p50_ms": round(first_p50 * 1000, 3),
                          "last_p50_ms": round(last_p50 * 1000, 3),
                          "change": round(last_p50 / first_p50 - 1, 4)},
        "settled_vs_last": settled,
        "cpu_ms_per_turn": {"gateway": round(gw / n * 1000, 2),
                            "model_server": round(srv / n * 1000, 2),
                            "client": round(own / n * 1000, 2)},
        "others_cpu_cores": round(others, 2),
        "loadavg_1m": round(os.getloadavg()[0], 2),
        "stored_bytes_per_turn": _growth(sizes, n, tables),
        "samples_ms": [round(s * 1000, 3) for s in latencies],
    }


def _growth(sizes: list[int | None], n: int,
            tables: list[dict[str, int] | None]) -> dict[str, Any] | None:
    """Database growth over the series per turn, and over its second half (steady state: the
    history window full, compactions recurring); the second half per table, and without the
    tables retention empties within hours (``kept``)."""
    if None in sizes or n < 2:
        return None
    start, mid, end = (int(x or 0) for x in sizes)
    half = n - n // 2
    out: dict[str, Any] = {"all": round((end - start) / n),
                           "second_half": round((end - mid) / half), "db_bytes_end": end}
    before, after = tables
    if before and after:
        per = {t: round((after.get(t, 0) - before.get(t, 0)) / half) for t in after}
        out["tables_second_half"] = {t: v for t, v in sorted(per.items(), key=lambda x: -x[1])
                                     if v}
        out["kept_second_half"] = sum(v for t, v in per.items() if t not in TRANSIENT)
    return out


def kept_per_turn(before: dict[str, int] | None, after: dict[str, int] | None,
                  n: int) -> dict[str, Any] | None:
    """Bytes kept past retention's hours per turn over ``n`` turns (the repeated series): at
    4 KiB a page, a 100-turn window moves in steps of 41 B for each of the ~13 b-trees a turn
    writes, a window of 800 in steps of 5 B."""
    if not before or not after or n <= 0:
        return None
    per = {t: (after.get(t, 0) - before.get(t, 0)) / n for t in after if t not in TRANSIENT}
    return {"turns": n, "kept": round(sum(per.values())),
            "tables": {t: round(v) for t, v in sorted(per.items(), key=lambda x: -x[1]) if v}}


def split_by_model_call(series_result: dict[str, Any], model_ms: list[float] | None
                        ) -> dict[str, Any] | None:
    """Item 2 taken apart: each turn's latency minus its model call (as the gateway timed
    it), first vs last turns. What grows in the model call is the request's own size (the
    history window filling); what grows outside it is the gateway's."""
    samples = series_result["samples_ms"]
    if not model_ms or len(model_ms) != len(samples):
        return None
    edge = series_result["first_vs_last"]["edge"]
    outside = [max(s - m, 0.0) for s, m in zip(samples, model_ms, strict=True)]

    def change(values: list[float]) -> dict[str, float]:
        first, last = percentile(values[:edge], 0.5), percentile(values[-edge:], 0.5)
        return {"first_p50_ms": round(first, 3), "last_p50_ms": round(last, 3),
                "change": round(last / first - 1, 4) if first else 0.0}

    return {"outside_model_call": change(outside), "model_call": change(model_ms)}


def repeat_summary(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Item 2 over several series of the same length, each in a fresh session: every
    series' last-vs-first change and their median."""
    changes = [r["first_vs_last"]["change"] for r in results]
    return {"series": len(results), "changes": changes,
            "median_change": round(statistics.median(changes), 4),
            "first_p50_ms": [r["first_vs_last"]["first_p50_ms"] for r in results],
            "last_p50_ms": [r["first_vs_last"]["last_p50_ms"] for r in results]}
