"""Item 10: a live reply's latency, from the model's first token to the first visible text.

A gateway with ``channels.local.streaming`` on (no throttle) answers N questions; the scripted
model writes its first piece and then holds the rest. Measured twice: end to end, from the
moment the model server has written the first piece to the moment a client following the
local channel's long poll (``GET /v1/messages``, over HTTP on loopback) holds the ``partial``
record; and inside the gateway, from the first text the stream received to the channel's
``show`` returning (``StreamDesk.first_shown_ms``). Everything runs in this process: the
model server, the gateway and the client share one event loop, as on a small host.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import aiohttp

from bench.stats import summary_ms
from gateway.app import Gateway
from gateway.kernel.config import parse_config
from tests.fakes.openai_server import Gate, ScriptedLLM


class _Stamp(Gate):
    """An open gate that notes when the server first looked at it: right before it writes
    the first piece."""

    def __init__(self) -> None:
        super().__init__()
        self.reached: float | None = None

    @property
    def released(self) -> bool:
        if self.reached is None:
            self.reached = time.perf_counter()
        return True


async def measure(root: Path, n: int) -> dict[str, Any]:
    samples: list[float] = []
    async with ScriptedLLM() as llm:
        config = parse_config({
            "workspace": str(root / "workspace"), "data_dir": str(root / "data"),
            "agent": {"model": "openai/test-model", "api_base": llm.base_url,
                      "api_key": "k"},
            "channels": {"local": {"port": 0, "streaming": {
                "enabled": True, "interval": 0, "min_chars": 0}}}}, env={})
        async with Gateway(config, grace=1.0) as gw, aiohttp.ClientSession() as http:
            base = gw.local.base_url
            for i in range(n + 3):  # three to warm up; a chat each (no compaction)
                chat, after = f"bench-{i}", 0
                stamp, gate = _Stamp(), Gate()
                llm.reply("First words, then the rest.", pieces=["First words,", " then the "
                          "rest."], pauses={1: stamp, 2: gate})
                body = {"chat_id": chat, "sender_id": "u1", "text": f"question {i}"}
                async with http.post(f"{base}/v1/messages", json=body) as resp:
                    assert resp.status == 202, await resp.text()
                seen = None
                while seen is None:
                    params = {"chat_id": chat, "after": str(after), "wait": "20"}
                    async with http.get(f"{base}/v1/messages", params=params) as resp:
                        data = await resp.json()
                    after = data["next"]
                    if any(r["kind"] == "partial" for r in data["messages"]):
                        seen = time.perf_counter()
                gate.release()
                while True:  # the final, before the next question
                    params = {"chat_id": chat, "after": str(after), "wait": "20"}
                    async with http.get(f"{base}/v1/messages", params=params) as resp:
                        data = await resp.json()
                    after = data["next"]
                    if any(r["kind"] == "reply" for r in data["messages"]):
                        break
                if i >= 3 and stamp.reached is not None:
                    samples.append(seen - stamp.reached)
            inside = [ms / 1000 for ms in gw.manager.streams.first_shown_ms[3:]]
    return {"first_text_ms": summary_ms(samples), "gateway_first_shown_ms": summary_ms(inside)}
