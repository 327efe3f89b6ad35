"""The floor: what the same model call costs without the gateway.

A bare ``litellm.acompletion`` from this process to the same scripted server, replaying
requests the gateway really sent (same messages, same tool schemas, the keyword arguments
``agent/provider.py`` passes): its first "hello" (also streamed), the last request of the
plain-turn series (a full history window, what a median turn sends) and both requests of a
one-tool turn. Beside them: a one-message request (the issue's "bare litellm call") and a bare
aiohttp POST of the hello body and of the plain series' last request (the HTTP round trip under
it all, which is what the direct route does: the raw floor). Each after a warm-up.

Why replay: the OpenAI SDK under litellm's ``openai/`` provider transforms every message of
a request in Python, so a call's cost grows with the history it carries; a floor measured
with a three-message request would charge that growth to the gateway.
"""

from __future__ import annotations

import os
import time
from typing import Any

import aiohttp

from bench import MODEL
from bench.stats import summary_ms


def _litellm() -> Any:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    litellm.suppress_debug_info = True
    return litellm


async def bare_calls(api_base: str, messages: list[dict[str, Any]],
                     tools: list[dict[str, Any]] | None, n: int, *, stream: bool = False,
                     warmup: int = 20) -> list[float]:
    lib = _litellm()
    kwargs: dict[str, Any] = {"model": MODEL, "api_base": api_base, "api_key": "x",
                              "messages": messages, "num_retries": 0, "max_tokens": 4096,
                              "timeout": 120.0}
    if tools:
        kwargs["tools"] = tools
    if stream:
        kwargs["stream"] = True
        kwargs["stream_options"] = {"include_usage": True}
    out: list[float] = []
    for i in range(warmup + n):
        started = time.perf_counter()
        response = await lib.acompletion(**kwargs)
        if stream:
            async for _ in response:
                pass
        if i >= warmup:
            out.append(time.perf_counter() - started)
    return out


async def bare_http(api_base: str, body: dict[str, Any], n: int, warmup: int = 20) -> list[float]:
    out: list[float] = []
    async with aiohttp.ClientSession() as session:
        for i in range(warmup + n):
            started = time.perf_counter()
            async with session.post(f"{api_base}/chat/completions", json=body) as resp:
                await resp.read()
            if i >= warmup:
                out.append(time.perf_counter() - started)
    return out


async def measure(api_base: str, *, hello: dict[str, Any], plain: dict[str, Any],
                  tool: list[dict[str, Any]], n: int) -> dict[str, Any]:
    """Floors for the gateway's own requests, replayed as they were sent: the first "hello",
    the last request of the plain series (a full history window) and the two requests of the
    last one-tool turn."""
    tiny = [{"role": "user", "content": "hello"}]

    async def replay(body: dict[str, Any], stream: bool = False) -> dict[str, Any]:
        return summary_ms(await bare_calls(api_base, body["messages"], body.get("tools"), n,
                                           stream=stream))

    tool_floors = [await replay(body) for body in tool]
    return {
        "hello_request": await replay(hello),
        "hello_request_streamed": await replay(hello, stream=True),
        "one_message": summary_ms(await bare_calls(api_base, tiny, None, n)),
        "one_message_streamed": summary_ms(await bare_calls(api_base, tiny, None, n,
                                                            stream=True)),
        "bare_http_hello": summary_ms(await bare_http(api_base, hello, n)),
        "bare_http_plain_turn": summary_ms(await bare_http(api_base, plain, n)),
        "plain_turn_request": {**await replay(plain), "messages": len(plain["messages"])},
        "tool_turn_requests": [{**f, "messages": len(b["messages"])}
                               for f, b in zip(tool_floors, tool, strict=True)],
        "tool_turn_p50_sum_ms": round(sum(f["p50_ms"] for f in tool_floors), 3),
    }
