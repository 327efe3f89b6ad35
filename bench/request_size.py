"""What the first "hello" with the default workspace costs on the wire (item 7).

The body is the one the scripted server received (its size is the request's
``Content-Length``); tokens are counted with the gateway's own ``TokenCounter`` (cl100k for the
benchmark model) and, beside it, with o200k (the default ``openai/gpt-4o-mini``).
"""

from __future__ import annotations

import json
from typing import Any

from agent.budget import TokenCounter
from bench import MODEL


def measure(body: dict[str, Any], size_bytes: int) -> dict[str, Any]:
    messages = body["messages"]
    tools = body.get("tools") or []
    tools_json = json.dumps(tools, separators=(",", ":"))
    out: dict[str, Any] = {
        "bytes": size_bytes,
        "messages": len(messages),
        "tools": len(tools),
        "tool_names": [t.get("function", {}).get("name") for t in tools],
        "tools_json_bytes": len(tools_json.encode()),
        "system_chars": len(messages[0].get("content") or "") if messages else 0,
        "prompt_chars": sum(len(str(m.get("content") or "")) for m in messages),
        "keys": sorted(body),
    }
    for label, model in (("cl100k", MODEL), ("o200k", "openai/gpt-4o-mini")):
        counter = TokenCounter(model)
        parts = {"system": counter.count_message(messages[0]),
                 "history": sum(counter.count_message(m) for m in messages[1:-2]),
                 "runtime": counter.count_message(messages[-2]),
                 "user": counter.count_message(messages[-1])}
        parts["tools"] = counter.count_tools(tools)
        out[f"tokens_{label}"] = {**parts, "total": sum(parts.values())}
    return out
