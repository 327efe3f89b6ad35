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
from typing import Any, get_type_hints

from pydantic import ConfigDict, Field, ValidationError, create_model

from agent.trust import ALL_TOOLS, ToolFilter
from agent.turn import TurnContext
from gateway.kernel.frozen import frozen
from gateway.kernel.secrets import SECRETS

_log = logging.getLogger(__name__)

ToolFunc = Callable[..., Awaitable[str]]

class ToolError(Exception):
    """A tool failed in a way the model should hear about (not a bug in the tool)."""

class ToolRetry(ToolError):
    """The model's call was wrong (bad path, bad arguments); it may fix it and call again."""

@frozen
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

LOAD_TOOLS = "load_tools"
"""Offered when some allowed tools are not: the model loads them by name for the turn."""
NO_LOADED: frozenset[str] = frozenset()


def _hint(description: str) -> str:
    """A tool's description shortened to its first clause, for the one line of the rest."""
    first = re.split(r"[.,;:(]", description, maxsplit=1)[0].strip()
    return first if len(first) <= 48 else first[:47].rsplit(" ", 1)[0] + "…"


class ToolRegistry:
    """The tools the agent has. Each turn sees only those its audience allows
    (``agent/trust.py``): the others are neither offered nor run.

    With ``core`` (names and patterns) only those are offered in full at first; the other
    allowed tools are named in one line, in ``load_tools``, whose call offers them from the
    next model call of the turn on (``TurnNotes.loaded``). A call to an allowed tool runs
    whether its schema was offered or not."""

    def __init__(self, tools: Iterable[Tool] = (), *,
                 core: tuple[str, ...] | None = None) -> None:
        self._tools: dict[str, Tool] = {}
        self.core = ToolFilter(core) if core is not None else None
        self._schemas: dict[tuple[ToolFilter, frozenset[str]], list[dict[str, Any]]] = {}
        self._deferred: dict[ToolFilter, list[str]] = {}
        for t in tools:
            self.register(t)

    def register(self, t: Tool) -> None:
        if t.name in self._tools:
            raise ValueError(f"tool {t.name} registered twice")
        self._tools[t.name] = t
        self._schemas, self._deferred = {}, {}

    def unregister(self, name: str) -> None:
        """Drop a tool (an MCP server's tool list changed); unknown names are ignored."""
        if self._tools.pop(name, None) is not None:
            self._schemas, self._deferred = {}, {}

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    @property
    def names(self) -> list[str]:
        return list(self._tools)

    def __len__(self) -> int:
        return len(self._tools)

    def schemas(self, allowed: ToolFilter = ALL_TOOLS,
                loaded: frozenset[str] = NO_LOADED) -> list[dict[str, Any]]:
        """The tool list sent to the model for an audience (and the tools loaded in the
        turn), built once per pair (the same list object until tools come or go, so its
        token count is cached too)."""
        key = (allowed, loaded)
        found = self._schemas.get(key)
        if found is None:
            if len(self._schemas) >= 4096:
                self._schemas = {}
            offered = [t for t in self._tools.values() if allowed.allows(t.name)]
            core = self.core
            rest = [] if core is None else [
                t for t in offered if not core.allows(t.name) and t.name not in loaded]
            found = [t.schema() for t in offered if t not in rest]
            if rest:
                found.append(self._load_schema(rest))
            self._schemas[key] = found
        return found

    def deferred(self, allowed: ToolFilter) -> list[str]:
        """The allowed tools not offered at first (named by ``load_tools``)."""
        found = self._deferred.get(allowed)
        if found is None:  # per audience, until tools come or go (MCP)
            core = self.core
            found = [] if core is None else [n for n in self._tools
                                             if allowed.allows(n) and not core.allows(n)]
            if len(self._deferred) >= 4096:
                self._deferred = {}
            self._deferred[allowed] = found
        return found

    @staticmethod
    def _load_schema(rest: list[Tool]) -> dict[str, Any]:
        names = "; ".join(f"{t.name} ({_hint(t.description)})" for t in rest)
        return {"type": "function", "function": {
            "name": LOAD_TOOLS,
            "description": f"Load more tools for this task, then call them: {names}.",
            "parameters": {"properties": {"names": {"type": "array",
                                                    "items": {"type": "string"}}},
                           "required": ["names"], "type": "object"}}}

    def _load(self, raw_args: str | dict[str, Any] | None, ctx: TurnContext) -> ToolResult:
        """``load_tools``: the named tools (allowed for this sender) join the turn's list."""
        try:
            args = raw_args if isinstance(raw_args, dict) else json.loads(raw_args or "{}")
            names = [str(n) for n in args["names"]]
        except (ValueError, KeyError, TypeError):
            return ToolResult('Error: send {"names": ["tool", ...]}.', True)
        loadable = self.deferred(ctx.access.tools)
        unknown = [n for n in names if n not in loadable]
        if unknown:
            return ToolResult(f"Error: cannot load {', '.join(unknown)}; loadable here: "
                              f"{', '.join(loadable) or 'none'}.", True)
        ctx.notes.loaded = ctx.notes.loaded | frozenset(names)
        return ToolResult(f"Loaded {', '.join(names)}: call them now.")

    async def execute(self, name: str, raw_args: str | dict[str, Any] | None,
                      ctx: TurnContext) -> ToolResult:
        allowed = ctx.access.tools
        t = self._tools.get(name)
        if t is None and name == LOAD_TOOLS and self.core is not None:
            return self._load(raw_args, ctx)
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
