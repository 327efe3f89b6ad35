"""Tools are typed async functions; ``@tool`` builds their JSON schema from the signature.

The first parameter is always the ``TurnContext``; the others become the schema's properties,
described by the ``Args:`` section of the docstring. A failure goes back to the model as text
(never a traceback to the user); ``ToolRetry`` says "your arguments were wrong, try again".
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import re
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, get_type_hints

from pydantic import ConfigDict, Field, ValidationError, create_model

from agent.trust import ALL_TOOLS, ToolFilter
from agent.turn import TurnContext
from gateway.kernel.secrets import SECRETS

_log = logging.getLogger(__name__)

ToolFunc = Callable[..., Awaitable[str]]

class ToolError(Exception):
    """A tool failed in a way the model should hear about (not a bug in the tool)."""

class ToolRetry(ToolError):
    """The model's call was wrong (bad path, bad arguments); it may fix it and call again."""

@dataclass(frozen=True, slots=True)
class ToolResult:
    text: str
    is_error: bool = False

def _parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """Split a Google-style docstring into (summary, {arg: description})."""
    doc = inspect.cleandoc(doc or "")
    parts = re.split(r"^\s*Args:\s*$", doc, maxsplit=1, flags=re.M)
    summary = " ".join(parts[0].split())
    args: dict[str, str] = {}
    if len(parts) == 2:
        current = None
        for line in parts[1].splitlines():
            match = re.match(r"^\s*(\w+)(?:\s*\([^)]*\))?:\s*(.*)$", line)
            if match and (current is None or line.startswith(" " * 4) and
                          not line.startswith(" " * 8)):
                current = match.group(1)
                args[current] = match.group(2).strip()
            elif current and line.strip():
                args[current] += " " + line.strip()
    return summary, args

class Tool:
    def __init__(self, func: ToolFunc, *, name: str | None = None, group: str = "misc") -> None:
        if not inspect.iscoroutinefunction(func):
            raise TypeError(f"tool {func.__name__} must be an async function")
        self.func = func
        self.name = name or func.__name__
        self.group = group
        self.description, arg_docs = _parse_docstring(func.__doc__ or "")
        hints = get_type_hints(func)
        params = list(inspect.signature(func).parameters.values())
        if not params:
            raise TypeError(f"tool {self.name} must take the TurnContext first")
        fields: dict[str, Any] = {}
        for param in params[1:]:
            annotation = hints.get(param.name, str)
            default = ... if param.default is inspect.Parameter.empty else param.default

            fields[param.name] = (annotation, Field(default, description=arg_docs.get(param.name)))
        self.args_model = create_model(  # type: ignore[call-overload]
            f"{self.name}_args", __config__=ConfigDict(extra="forbid"), **fields)
        schema = self.args_model.model_json_schema()
        schema.pop("title", None)
        for name, prop in schema.get("properties", {}).items():
            prop.pop("title", None)
            schema["properties"][name] = _plain_optional(prop)
        schema.setdefault("properties", {})
        # Unknown arguments are refused by args_model (extra="forbid") with a message the model
        # can act on; saying so in the schema too costs ~5 tokens a tool on every call, and
        # some OpenAI-compatible servers (vLLM with guided decoding) refuse the keyword.
        schema.pop("additionalProperties", None)
        self.parameters: dict[str, Any] = schema

    def schema(self) -> dict[str, Any]:
        return {"type": "function",
                "function": {"name": self.name, "description": self.description,
                             "parameters": self.parameters}}

    async def __call__(self, ctx: TurnContext, arguments: dict[str, Any]) -> str:
        try:
            parsed = self.args_model.model_validate(arguments)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'arguments'}: {e['msg']}"
                for e in exc.errors())
            raise ToolRetry(f"invalid arguments for {self.name}: {problems}") from None
        return await self.func(ctx, **parsed.model_dump())

def _plain_optional(prop: dict[str, Any]) -> dict[str, Any]:
    """``x: T | None = None`` as ``T``: leaving the argument out already means None (and an
    explicit null is still accepted), while ``anyOf [T, null]`` plus ``"default": null`` costs
    ~12 tokens per optional argument on every request."""
    options = prop.get("anyOf")
    if not isinstance(options, list) or prop.get("default", 0) is not None:
        return prop
    kept = [o for o in options if o != {"type": "null"}]
    if len(kept) != 1 or len(options) != 2:
        return prop
    rest = {k: v for k, v in prop.items() if k not in ("anyOf", "default")}
    return {**kept[0], **rest}


def tool(func: ToolFunc | None = None, *, name: str | None = None,
         group: str = "misc") -> Any:
    """Decorator: turn an async function into a ``Tool``."""
    if func is None:
        return lambda f: Tool(f, name=name, group=group)
    return Tool(func, name=name, group=group)

class ToolRegistry:
    """The tools the agent has. Each turn sees only those its audience allows
    (``agent/trust.py``): the others are neither offered nor run."""

    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        self._schemas: dict[ToolFilter, list[dict[str, Any]]] = {}
        for t in tools:
            self.register(t)

    def register(self, t: Tool) -> None:
        if t.name in self._tools:
            raise ValueError(f"tool {t.name} registered twice")
        self._tools[t.name] = t
        self._schemas = {}

    def unregister(self, name: str) -> None:
        """Drop a tool (an MCP server's tool list changed); unknown names are ignored."""
        if self._tools.pop(name, None) is not None:
            self._schemas = {}

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    @property
    def names(self) -> list[str]:
        return list(self._tools)

    def __len__(self) -> int:
        return len(self._tools)

    def schemas(self, allowed: ToolFilter = ALL_TOOLS) -> list[dict[str, Any]]:
        """The tool list sent to the model for an audience, built once per filter (the same
        list object until tools come or go, so its token count is cached too)."""
        found = self._schemas.get(allowed)
        if found is None:
            found = self._schemas[allowed] = [t.schema() for t in self._tools.values()
                                              if allowed.allows(t.name)]
        return found

    async def execute(self, name: str, raw_args: str | dict[str, Any] | None,
                      ctx: TurnContext) -> ToolResult:
        allowed = ctx.access.tools
        t = self._tools.get(name)
        if t is not None and not allowed.allows(name):
            _log.warning("tool %s refused: not allowed for a %s in %s", name,
                         ctx.access.trust, ctx.session_key)
            return ToolResult(f"Error: {name} is not available in this conversation (the "
                              f"sender is a {ctx.access.trust}); do not try it another way.",
                              True)
        if t is None:
            known = ", ".join(n for n in self._tools if allowed.allows(n)) or "none"
            return ToolResult(f"Error: unknown tool {name!r}. Available tools: {known}.", True)
        if isinstance(raw_args, dict):
            args = raw_args
        else:
            try:
                args = json.loads(raw_args or "{}")
            except json.JSONDecodeError as exc:
                return ToolResult(f"Error: arguments for {name} are not valid JSON ({exc.msg} "
                                  f"at position {exc.pos}). Send a JSON object.", True)
            if not isinstance(args, dict):
                return ToolResult(f"Error: arguments for {name} must be a JSON object.", True)
        try:
            result = ToolResult(await t(ctx, args))
        except asyncio.CancelledError:
            raise
        except ToolError as exc:
            result = ToolResult(f"Error: {exc}", True)
        except Exception as exc:
            _log.exception("tool %s failed", name)
            result = ToolResult(f"Error: {name} failed: {type(exc).__name__}: {exc}", True)
        # Whatever a tool read or a library put in an error, the gateway's secrets (and their
        # encodings) never reach the model, the history or the chat.
        text = SECRETS.redact(result.text)
        return result if text is result.text else ToolResult(text, result.is_error)
