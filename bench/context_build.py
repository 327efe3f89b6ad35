"""Context build time and prompt tokens by stored session size (item 4), in-process.

Sessions of 10, 1,000 and 10,000 stored messages are written through
``gateway.kernel.store.Store`` into a fresh database; then each iteration does what a turn
(``agent/turn_flow.py``) does before calling the model:
``HistoryCache.history`` (``agent/history.py``: the rows since the session's last turn) and
``ContextBuilder.build``, with the config ``parley onboard`` writes, the default workspace
and the default tools.

The history is a plausible chat: a short question and a longer answer per turn, and every
fifth turn a ``read_file`` call with a ~1,500-character result.

Last, the 1,000-message session again with three years of daily memory logs (1,095 files)
in the workspace: memory recall searches them on every build.
"""

from __future__ import annotations

import inspect
import time
from pathlib import Path
from typing import Any

import yaml

from agent.budget import TokenCounter
from bench import MODEL
from bench.stats import summary_ms

QUESTION = ("Could you look at item {i} again and tell me whether the numbers from last week "
            "still add up, and what I should change before Friday?")
ANSWER = ("Item {i} still adds up: the totals match the figures you sent last week, with one "
          "exception. The shipping line is counted twice in the second table, which inflates "
          "the sum by about four percent. Before Friday, remove the duplicate row, re-run the "
          "summary and send the corrected sheet to the team; nothing else needs to change.")
FILE_TEXT = "\n".join(f"line {n}: the quarterly figures for region {n % 7} are on track"
                      for n in range(1, 26))


def _turn_messages(i: int) -> list[dict[str, Any]]:
    user = {"role": "user", "content": QUESTION.format(i=i)}
    if i % 5:
        return [user, {"role": "assistant", "content": ANSWER.format(i=i)}]
    call_id = f"call_{i}"
    return [user,
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": call_id, "type": "function",
                 "function": {"name": "read_file", "arguments": '{"path": "notes.md"}'}}]},
            {"role": "tool", "tool_call_id": call_id, "name": "read_file", "content": FILE_TEXT},
            {"role": "assistant", "content": ANSWER.format(i=i)}]


def _history(n: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    i = 0
    while len(out) < n:
        out += _turn_messages(i)
        i += 1
    return out[:n]


def _config(root: Path) -> Any:
    from gateway.cli import ONBOARD_CONFIG
    from gateway.kernel.config import parse_config
    from workspace.bootstrap import seed_workspace

    data = yaml.safe_load(ONBOARD_CONFIG.format(workspace=root / "workspace",
                                                data_dir=root / "data"))
    seed_workspace(root / "workspace")
    env = {"PARLEY_MODEL": MODEL, "PARLEY_API_BASE": "http://127.0.0.1:9/v1"}
    return parse_config(data, env=env, path=root / "config.yaml")


def _registry_options(build_registry: Any, config: Any) -> dict[str, Any]:
    """The keyword options ``build_registry`` takes that the agent config has (``memory``,
    ``timezone``, ...), so this follows the gateway as its signature grows."""
    names = list(inspect.signature(build_registry).parameters)[1:]
    return {n: getattr(config.agent, n) for n in names if hasattr(config.agent, n)}


async def _fill(store: Any, counter: TokenCounter, session_id: int, n: int) -> None:
    from gateway.kernel.store import NewMessage

    counts: dict[str, int] = {}

    def tokens(m: dict[str, Any]) -> int:  # counted once per distinct body, as stored
        key = repr(sorted(m.items()))
        if key not in counts:
            counts[key] = counter.count_message(m)
        return counts[key]

    history = _history(n)
    for start in range(0, n, 1000):
        chunk = [NewMessage(m, tokens(m)) for m in history[start:start + 1000]]
        await store.save_turn(session_id=session_id, turn_id=f"fill-{session_id}-{start}",
                              inbound_id=None, messages=chunk)


async def measure(root: Path, sizes: tuple[int, ...], iterations: int) -> dict[str, Any]:
    from agent.context import ContextBuilder
    from agent.history import HistoryCache
    from agent.provider import context_window
    from agent.tools import build_registry
    from agent.tools.exec_access import GatewayFiles, resolve_exec_access
    from channels.local import LocalChannel, make_inbound
    from gateway.kernel.store import Store

    config = _config(root)
    counter = TokenCounter(config.agent.model)
    access = await resolve_exec_access(config.agent.tools.exec, GatewayFiles.of(config))
    registry = build_registry(config.agent.tools, **_registry_options(build_registry, config),
                              exec_access=access)
    tools_tokens = counter.count_tools(registry.schemas())
    window = None
    if config.agent.context.max_context_tokens is None:
        window = context_window(config.agent.model)
    builder = ContextBuilder(config, counter, window=window)
    limit = config.agent.context.max_recent_messages
    store = await Store.open(config.store_target)
    reader = HistoryCache(store, limit)  # what a turn reads: new rows only, after the first
    out: dict[str, Any] = {"max_recent_messages": limit,
                           "max_context_tokens": builder.max_context_tokens, "sizes": {}}
    try:
        for size in sizes:
            key = f"local:ctx-{size}"
            session = await store.active_session(key)
            await _fill(store, counter, session.id, size)
            fetch: list[float] = []
            build: list[float] = []
            total: list[float] = []
            built = None
            for i in range(iterations + 10):
                inbound = make_inbound(f"ctx-{size}", f"hello again, message {i}")
                t0 = time.perf_counter()
                history, _ = await reader.history(session.id, None)
                t1 = time.perf_counter()
                built = builder.build(inbound=inbound, history=history,
                                      hints=LocalChannel.hints, tools_tokens=tools_tokens,
                                      session_key=key, turn_id=f"t{i}")
                t2 = time.perf_counter()
                if i >= 10:  # the first builds read the workspace files
                    fetch.append(t1 - t0)
                    build.append(t2 - t1)
                    total.append(t2 - t0)
            assert built is not None
            out["sizes"][str(size)] = _figures(size, fetch, build, total, built)
        size = sorted(sizes)[len(sizes) // 2]
        _daily_logs(config.workspace_path / "memory", days=1095)
        builder = ContextBuilder(config, counter, window=window)  # a fresh recall index
        session = await store.active_session(f"local:ctx-{size}")
        build = []
        for i in range(iterations + 10):
            inbound = make_inbound(f"ctx-{size}", f"what did we say about the lighthouse {i}")
            t0 = time.perf_counter()
            history, _ = await reader.history(session.id, None)
            built = builder.build(inbound=inbound, history=history, hints=LocalChannel.hints,
                                  tools_tokens=tools_tokens, session_key=f"local:ctx-{size}",
                                  turn_id=f"m{i}")
            if i >= 10:
                build.append(time.perf_counter() - t0)
        assert built is not None
        out["with_daily_logs"] = {"stored_messages": size, "daily_logs": 1095,
                                  "total": summary_ms(build),
                                  "memory_recalled": built.snapshot["sources"]["memory_recalled"]}
    finally:
        await store.close()
    return out


def _daily_logs(folder: Path, days: int) -> None:
    """One log a day, a few entries each; now and then the word the queries look for."""
    from datetime import date, timedelta

    folder.mkdir(parents=True, exist_ok=True)
    first = date(2023, 1, 1)
    for n in range(days):
        day = first + timedelta(days=n)
        extra = f"\n\n[17:30] walked to the lighthouse, day {n}" if n % 97 == 0 else ""
        (folder / f"{day}.md").write_text(
            f"# {day}\n\n[09:10] stand-up: planning item {n}, review of ticket {n * 7}\n\n"
            f"[13:00] lunch with the team, talked about release {n % 12}{extra}\n")


def _figures(size: int, fetch: list[float], build: list[float], total: list[float],
             built: Any) -> dict[str, Any]:
    snap = built.snapshot
    return {
        "stored_messages": size,
        "recent_messages": summary_ms(fetch), "build": summary_ms(build),
        "total": summary_ms(total),
        "prompt_tokens": snap.get("total_tokens"),
        "messages_in_prompt": len(built.messages),
        "history_kept": snap.get("sources", {}).get("history_kept"),
        "trimmed": snap.get("trimmed"),
    }
