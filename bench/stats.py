"""Small statistics over latency samples (seconds in, milliseconds out)."""

from __future__ import annotations

import statistics
from typing import Any


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def summary_ms(samples: list[float]) -> dict[str, Any]:
    ms = [s * 1000 for s in samples]
    return {"n": len(ms), "p50_ms": round(percentile(ms, 0.5), 3),
            "p95_ms": round(percentile(ms, 0.95), 3),
            "p99_ms": round(percentile(ms, 0.99), 3),
            "mean_ms": round(statistics.fmean(ms), 3) if ms else None,
            "min_ms": round(min(ms), 3) if ms else None,
            "max_ms": round(max(ms), 3) if ms else None}
