"""The OpenAI-compatible endpoint's live streaming: from the model's first token to the first
text chunk the official ``openai`` client holds (``stream: true``), on loopback.

The scripted model writes its first piece and holds the rest; the stamp is taken right before
it writes that piece (``stream_latency._Stamp``). Model server, gateway and client share one
event loop, as on a small host. Run on its own: ``.venv/bin/python -m bench.openai_stream``.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import openai

from bench.stats import summary_ms
from bench.stream_latency import _Stamp
from gateway.app import Gateway
from gateway.kernel.config import parse_config
from tests.fakes.openai_server import Gate, ScriptedLLM


async def measure(root: Path, n: int) -> dict[str, Any]:
    samples: list[float] = []
    async with ScriptedLLM() as llm:
        config = parse_config({
            "workspace": str(root / "workspace"), "data_dir": str(root / "data"),
            "agent": {"model": "openai/test-model", "api_base": llm.base_url, "api_key": "k"},
            "channels": {"openai": {"enabled": True, "port": 0}}}, env={})
        async with Gateway(config, grace=1.0) as gw:
            api = gw.manager.channels["openai"]
            async with openai.AsyncOpenAI(base_url=api.base_url,  # type: ignore[attr-defined]
                                          api_key="unused", max_retries=0) as client:
                for i in range(n + 3):  # three to warm up; a session each
                    stamp, gate = _Stamp(), Gate()
                    llm.reply("First words, then the rest.", pieces=[
                        "First words,", " then the rest."], pauses={1: stamp, 2: gate})
                    stream = await client.chat.completions.create(
                        model="parley", user=f"bench-{i}", stream=True,
                        messages=[{"role": "user", "content": f"question {i}"}])
                    seen = None
                    async for c in stream:
                        if seen is None and c.choices and c.choices[0].delta.content:
                            seen = time.perf_counter()
                            gate.release()
                    if i >= 3 and seen is not None and stamp.reached is not None:
                        samples.append(seen - stamp.reached)
    return {"first_chunk_ms": summary_ms(samples)}


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        print(json.dumps(asyncio.run(measure(Path(tmp), 50)), indent=2))
