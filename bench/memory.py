"""RSS of the gateway (item 5): after start, then after many sessions of a few turns.

Baselines: right after ``/v1/health`` first answers, and "ready" after one answered turn and a
short settle (with ``--transport litellm`` litellm is imported in a thread at start, ~160 MB, and
the first figure alone would charge that import to the sessions). Growth per idle session is (RSS
at the end, idle − ready RSS) / sessions; the slope between the first and the last tenth of the run
is given beside it, since it leaves out one-time costs (client buffers, caches filling up).
"""

from __future__ import annotations

import asyncio
from typing import Any

from bench.client import LocalClient, expect
from bench.load import many_sessions
from bench.procs import GatewayProcess, ModelServer

SETTLE_S = 1.5


async def _ready(client: LocalClient, gateway: GatewayProcess) -> None:
    """One turn answered and the warm-up import finished (RSS stops moving)."""
    _, record = await client.turn("mem-warm-up", "hello")
    expect(record, "hello")
    last = -1
    for _ in range(40):
        rss = gateway.memory()["rss"]
        if rss == last:
            return
        last = rss
        await asyncio.sleep(0.25)


async def measure(gateway: GatewayProcess, server: ModelServer, *, sessions: int, turns: int,
                  concurrency: int) -> dict[str, Any]:
    after_healthy = gateway.memory()
    async with LocalClient(gateway.base_url) as client:
        await _ready(client, gateway)
        ready = gateway.memory()
        samples: dict[int, int] = {}
        step = max(1, sessions // 10)

        def progress(done: int) -> None:
            if done % step == 0:
                samples[done] = gateway.memory()["rss"]

        load = await many_sessions(client, gateway, server, sessions=sessions, turns=turns,
                                   concurrency=concurrency, tag="mem", on_progress=progress)
    await asyncio.sleep(SETTLE_S)
    end = gateway.memory()
    growth = (end["rss"] - ready["rss"]) / sessions
    marks = sorted(samples)
    slope = None
    if len(marks) >= 2:
        a, b = marks[0], marks[-1]
        slope = round((samples[b] - samples[a]) / (b - a), 2)
    return {
        "sessions": sessions, "turns_per_session": turns, "concurrency": concurrency,
        "rss_after_healthy_kb": after_healthy["rss"], "rss_ready_kb": ready["rss"],
        "rss_end_kb": end["rss"], "peak_rss_kb": end["hwm"],
        "growth_kb_per_session": round(growth, 2),
        "slope_kb_per_session": slope,
        "rss_by_sessions_done_kb": {str(k): samples[k] for k in marks},
        "load": load,
    }
