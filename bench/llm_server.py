"""The scripted model server in its own process: ``python -m bench.llm_server``.

Prints one JSON line ``{"base_url", "control"}`` and serves until SIGTERM. Answers:

- the last message is a tool result → a short text answer (the end of a one-tool turn);
- the last user text starts with ``tool:`` → one ``list_dir {"path": "."}`` call;
- anything else → ``echo: <last user text>``, cut to ``MAX_ANSWER_CHARS`` as a model that
  follows a prompt's length limit would (the gateway's compaction asks for a summary of at
  most N words; an echo of the whole transcript would grow the summary with every compaction).

``GET <control>/last`` returns the last request's parsed body, its size in bytes
(``Content-Length``) and the number of requests so far; ``GET <control>/recent?n=`` the last
``n`` (≤ 8) of them, oldest first. Only the last few bodies are kept:
``ScriptedLLM`` records every request, which over ten thousand turns would be hundreds of MB.
"""

from __future__ import annotations

import asyncio
import json
import signal
from typing import Any

from aiohttp import web

from tests.fakes.openai_server import ScriptedLLM

TOOL_PREFIX = "tool:"
KEEP = 8
MAX_ANSWER_CHARS = 2000


def _text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def answer(body: dict[str, Any]) -> str | dict[str, Any]:
    messages = body.get("messages") or [{}]
    last = messages[-1]
    if last.get("role") == "tool":
        return f"done: the folder listing had {len(_text(last))} characters"
    text = _text(last)
    if text.startswith(TOOL_PREFIX):
        return {"tool_calls": [{"function": {"name": "list_dir", "arguments": {"path": "."}}}]}
    return f"echo: {text[:MAX_ANSWER_CHARS]}"


async def serve() -> None:
    count = 0
    llm = ScriptedLLM(models=("bench-model",))

    def respond(body: dict[str, Any]) -> str | dict[str, Any]:
        nonlocal count
        count += 1
        if len(llm.requests) > 4 * KEEP:
            del llm.requests[:-KEEP]
            del llm.request_headers[:-KEEP]
        return answer(body)

    async def last(request: web.Request) -> web.Response:
        if not llm.requests:
            return web.json_response({"body": None, "bytes": 0, "count": count})
        size = int(llm.request_headers[-1].get("content-length", "0"))
        return web.json_response({"body": llm.requests[-1], "bytes": size, "count": count})

    async def recent(request: web.Request) -> web.Response:
        n = min(int(request.query.get("n", "2")), KEEP)
        pairs = list(zip(llm.requests, llm.request_headers, strict=True))[-n:]
        return web.json_response({"requests": [
            {"body": body, "bytes": int(headers.get("content-length", "0"))}
            for body, headers in pairs], "count": count})

    llm.respond_with(respond)
    await llm.start()
    control = web.Application()
    control.router.add_get("/last", last)
    control.router.add_get("/recent", recent)
    runner = web.AppRunner(control, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    print(json.dumps({"base_url": llm.base_url, "control": f"http://127.0.0.1:{port}"}),
          flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()
        await llm.stop()


if __name__ == "__main__":
    asyncio.run(serve())
