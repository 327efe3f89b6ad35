"""Time from ``parley gateway`` start to healthy (item 6), and what follows it.

Each run is a fresh directory (config, seeded workspace, no database yet). Healthy means ``GET
/v1/health`` answers 200 with ``"gateway": "running"``, polled every 5 ms. Beside it: the time
until a first "hello" is answered (with ``--transport litellm``, litellm is still being imported in
a thread when the gateway reports healthy), RSS at that point, and how long SIGTERM takes to stop
it.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

from bench.client import LocalClient, expect
from bench.procs import GatewayProcess, ModelServer


async def measure(root: Path, server: ModelServer, runs: int) -> dict[str, Any]:
    out: list[dict[str, Any]] = []
    for i in range(runs):
        gateway = GatewayProcess(root / f"startup-{i}", server.base_url)
        try:
            healthy = gateway.start()
            rss_healthy = gateway.memory()["rss"]
            async with LocalClient(gateway.base_url) as client:
                _, record = await client.turn("startup", "hello")
                expect(record, "hello")
            first_reply = time.perf_counter() - gateway.started_at
            rss_first_reply = gateway.memory()["rss"]
        finally:
            stop = gateway.stop()
        out.append({"healthy_s": round(healthy, 3), "first_reply_s": round(first_reply, 3),
                    "stop_s": round(stop, 3), "rss_healthy_kb": rss_healthy,
                    "rss_first_reply_kb": rss_first_reply})
    return {
        "runs": out,
        "healthy_s_median": statistics.median(r["healthy_s"] for r in out),
        "first_reply_s_median": statistics.median(r["first_reply_s"] for r in out),
        "stop_s_median": statistics.median(r["stop_s"] for r in out),
    }
