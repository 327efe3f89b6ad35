"""The tool loop: ask the model, run the tools it calls, feed the results back, repeat.

Independent tool calls of one answer run concurrently. Unknown tools and bad arguments go
back to the model as errors it can correct. A guard stops a model that repeats the same call
with the same arguments, and ``max_iterations`` bounds the loop.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agent.deltas import ThinkFilter
from agent.llm_types import EncodedSpan
from agent.provider import LLMResponse, Provider, ToolCall
from agent.tools.base import ToolRegistry, ToolResult
from agent.turn import TurnContext

_log = logging.getLogger(__name__)

REPEAT_WARN = 3
"""The third identical call gets a warning instead of a result; the fifth ends the loop."""
REPEAT_STOP = 5

@dataclass(slots=True)
class TurnBudget:
    """Tokens the turn may use; ``used`` starts at the built context's size."""

    limit: int
    used: int
    count: Callable[[dict[str, Any]], int]


ONE_LINE = 120


def shortened_result(message: dict[str, Any]) -> dict[str, Any]:
    """A tool result as the one line it is shortened to (a replay does the same)."""
    content = str(message.get("content") or "").strip()
    first = content.splitlines()[0] if content else ""
    line = first if len(first) <= ONE_LINE else first[:ONE_LINE] + "…"
    return {**message, "content": f"[shortened to fit the context window] {line}"}


def shorten_old_tool_results(convo: list[dict[str, Any]], budget: TurnBudget) -> int:
    """Replace tool results, oldest first and never the latest round's, by one line until the
    conversation fits; returns how many were shortened."""
    last_assistant = max((i for i, m in enumerate(convo) if m["role"] == "assistant"),
                         default=-1)
    shortened = 0
    for i, m in enumerate(convo[:last_assistant]):
        if budget.used <= budget.limit:
            break
        content = m.get("content")
        if m["role"] != "tool" or not isinstance(content, str) or content.startswith("[shortened"):
            continue
        new = shortened_result(m)
        budget.used += budget.count(new) - budget.count(m)
        convo[i] = new
        shortened += 1
    return shortened


@dataclass(slots=True)
class RunResult:
    text: str
    new_messages: list[dict[str, Any]] = field(default_factory=list)
    responses: list[LLMResponse] = field(default_factory=list)
    stop_reason: str = "done"
    shortened: int = 0
    """Old tool results shortened to one line during the turn to stay in the window."""

    def complete_messages(self) -> list[dict[str, Any]]:
        """``new_messages`` without a trailing tool call whose result never came (a cancelled
        turn): what can be kept in history and replayed to the model."""
        msgs = self.new_messages
        for i in range(len(msgs) - 1, -1, -1):
            calls = msgs[i].get("tool_calls") if msgs[i]["role"] == "assistant" else None
            if calls:
                answered = {m.get("tool_call_id") for m in msgs[i + 1:] if m["role"] == "tool"}
                if not {c["id"] for c in calls} <= answered:
                    return msgs[:i]
                break
        return list(msgs)


def cut_result(text: str, max_chars: int) -> str:
    """Keep the head and tail of a long tool result, with a visible marker between."""
    if len(text) <= max_chars:
        return text
    head = text[: int(max_chars * 0.7)]
    tail = text[len(text) - int(max_chars * 0.2):]
    return (f"{head}\n\n[… {len(text) - len(head) - len(tail):,} characters of this tool "
            f"result cut; {len(text):,} in all …]\n\n{tail}")


def _signature(call: ToolCall) -> str:
    try:
        args = json.dumps(json.loads(call.arguments or "{}"), sort_keys=True)
    except json.JSONDecodeError:
        args = call.arguments
    return f"{call.name}:{args}"


class RunHooks:
    """What the caller of ``Runner.run`` sees while the loop goes, and may add to it. Every
    hook does nothing by default; override the ones you need."""

    def on_request(self, messages: list[dict[str, Any]],
                   tools: list[dict[str, Any]] | None) -> None:
        """The model is about to be asked with exactly these (each call; for snapshots)."""

    def on_response(self, response: LLMResponse) -> None:
        """The model answered (each call, before its message joins the conversation)."""

    def on_message(self, message: dict[str, Any]) -> None:
        """A message joined the conversation: the model's, a tool result, a steered one."""

    async def progress(self, text: str) -> None:
        """Tools are about to run (``running web_fetch, exec``)."""

    def steer(self) -> list[dict[str, Any]]:
        """User messages that arrived meanwhile, handed to the model after a tool round."""
        return []

    wants_text = False
    """Set to have the model's answer streamed into ``on_text`` as it is written."""

    def on_text(self, visible: str) -> None:
        """More of the answer's text (reasoning left out), as the model writes it."""

    def on_text_reset(self) -> None:
        """Take back the text shown so far: a retry writes it again, or the model's
        message turned out to be tool calls rather than the answer."""


class _AnswerText:
    """The ``TextDeltas`` of one run: raw pieces through a ``ThinkFilter`` to the hooks."""

    __slots__ = ("_filter", "_hooks", "_shown")

    def __init__(self, hooks: RunHooks) -> None:
        self._hooks = hooks
        self._filter = ThinkFilter()
        self._shown = False

    def text(self, piece: str) -> None:
        restart, visible = self._filter.feed(piece)
        if restart:
            self.reset()
        if visible:
            self._shown = True
            self._hooks.on_text(visible)

    def restart(self) -> None:
        self._filter = ThinkFilter()
        self.reset()

    def reset(self) -> None:
        if self._shown:
            self._shown = False
            self._hooks.on_text_reset()


class Transcript(RunHooks):
    """Hooks that keep what the run did so far: when a run is cancelled, times out or fails,
    its caller still has the model calls and the messages (``so_far.complete_messages()``)."""

    def __init__(self) -> None:
        self.so_far = RunResult(text="")

    def on_response(self, response: LLMResponse) -> None:
        self.so_far.responses.append(response)

    def on_message(self, message: dict[str, Any]) -> None:
        self.so_far.new_messages.append(message)


NO_HOOKS = RunHooks()


class Runner:
    def __init__(self, provider: Provider, registry: ToolRegistry, *, max_iterations: int,
                 max_result_chars: int) -> None:
        self.provider = provider
        self.registry = registry
        self.max_iterations = max_iterations
        self.max_result_chars = max_result_chars

    async def run(self, *, messages: list[dict[str, Any]], ctx: TurnContext,
                  hooks: RunHooks = NO_HOOKS, budget: TurnBudget | None = None,
                  encoded: EncodedSpan | None = None) -> RunResult:
        """Run the loop from ``messages`` until the model answers without tools (or a limit
        stops it). ``budget``: shorten old tool results to stay within the window.
        ``encoded``: messages already written as JSON (``BuiltContext.encoded``), handed to
        each model call until a message in that span is shortened."""
        result = RunResult(text="")
        convo = list(messages)

        def add(message: dict[str, Any]) -> None:
            convo.append(message)
            result.new_messages.append(message)
            hooks.on_message(message)

        seen: dict[str, int] = {}  # calls by signature (a Counter costs ~2 µs to make)
        counted = len(convo)
        deltas = _AnswerText(hooks) if hooks.wants_text else None
        for _ in range(self.max_iterations):
            tools = self.registry.schemas(ctx.access.tools, ctx.notes.loaded) or None
            if budget is not None:
                budget.used += sum(budget.count(m) for m in convo[counted:])
                counted = len(convo)
                if budget.used > budget.limit:
                    result.shortened += shorten_old_tool_results(convo, budget)
                    if result.shortened:
                        encoded = None  # it may have replaced a message of the span
            hooks.on_request(convo, tools)
            response = await self.provider.complete(convo, tools, alias=ctx.model,
                                                    deltas=deltas, encoded=encoded)
            result.responses.append(response)
            hooks.on_response(response)
            add(response.assistant_message())
            if not response.tool_calls:
                result.text = (response.content or "").strip()
                if not result.text:
                    result.text = "(The model returned an empty answer.)"
                    result.stop_reason = "empty"
                return result
            if deltas is not None:
                deltas.restart()  # text written beside tool calls is not the answer
            await hooks.progress(f"running {', '.join(c.name for c in response.tool_calls)}")
            outputs = await asyncio.gather(
                *(self._run_one(call, ctx, seen) for call in response.tool_calls))
            for call, output in zip(response.tool_calls, outputs, strict=True):
                add({"role": "tool", "tool_call_id": call.id, "name": call.name,
                     "content": output.text})
            for user_msg in hooks.steer():
                add(user_msg)
            if max(seen.values(), default=0) >= REPEAT_STOP:
                result.stop_reason = "repeated_calls"
                result.text = ("I stopped because I kept repeating the same tool call with the "
                               "same arguments without making progress.")
                return result
        result.stop_reason = "max_iterations"
        result.text = (f"I stopped after {self.max_iterations} tool steps without finishing. "
                       "Ask me to continue if you want me to go on.")
        return result

    async def _run_one(self, call: ToolCall, ctx: TurnContext,
                       seen: dict[str, int]) -> ToolResult:
        sig = _signature(call)
        seen[sig] = seen.get(sig, 0) + 1
        if seen[sig] >= REPEAT_WARN:
            return ToolResult(
                f"Error: you already called {call.name} with exactly these arguments "
                f"{seen[sig] - 1} times in this turn; the result will not change. Use the "
                "earlier result, change the arguments, or answer the user.", True)
        output = await self.registry.execute(call.name, call.arguments, ctx)
        return ToolResult(cut_result(output.text, self.max_result_chars), output.is_error)
