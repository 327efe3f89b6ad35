"""``make bench`` item 10 still runs: a live reply's first text is measured end to end and
inside the gateway."""

from __future__ import annotations

from pathlib import Path

from bench import stream_latency


async def test_the_stream_latency_probe_runs(tmp_path: Path) -> None:
    figures = await stream_latency.measure(tmp_path, 2)
    assert figures["first_text_ms"]["n"] == 2
    assert figures["gateway_first_shown_ms"]["n"] == 2
