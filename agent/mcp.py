"""MCP: the tools of the servers in ``agent.mcp.servers``, offered to the model as its own.

Each server gets one owned task that connects (stdio: ``mcp.client.stdio.stdio_client`` runs
the command; HTTP: ``mcp.client.streamable_http.streamable_http_client`` over the guarded
client of ``agent.net``), lists the server's tools and holds the connection until it drops.
Each tool becomes a registry tool named ``mcp_<server>_<tool>`` with the server's own input
schema. A server that fails to start, or crashes or disconnects later, is reconnected with
exponential backoff; meanwhile its tools answer "unavailable (reconnecting)" and the rest of
the gateway carries on. A stdio server's stderr goes to ``<data_dir>/mcp/<server>.log``.

The SDK runs on anyio: a connection is entered and left inside its server's task, while tool
calls come from the turns' tasks over the connection's memory streams.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import hashlib
import json
import logging
import os
import re
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from types import TracebackType
from typing import IO, Any, TextIO, cast

import anyio
import httpx2
from mcp import Client, MCPError, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp_types import (
    CONNECTION_CLOSED,
    REQUEST_TIMEOUT,
    CallToolResult,
    Implementation,
    ListToolsResult,
)
from mcp_types import Tool as RemoteTool

from agent.net import Guard, guarded_httpx_client, url_endpoint
from agent.tools.base import Tool, ToolError, ToolRegistry
from agent.turn import TurnContext
from gateway.kernel.backoff import BackoffPolicy
from gateway.kernel.config import MCPConfig, MCPServerConfig
from gateway.kernel.tasks import closing_to_thread

_log = logging.getLogger(__name__)

NAME_LIMIT = 64
DESCRIPTION_LIMIT = 1024
"""A server's tool descriptions are sent with every request: a long one is cut here."""
INITIAL_BACKOFF = 1.0
_MAX_PAGES = 20
_CLIENT_INFO = Implementation(name="parley", version="0.1.0")
_GUARD_HINT = "an MCP server's client reaches only the configured host and port"


def tool_name(server: str, remote: str) -> str:
    """``mcp_<server>_<tool>`` in the characters providers accept, at most 64 of them (a
    longer name keeps its start and gets a short hash, so two long names stay apart)."""
    name = re.sub(r"[^a-zA-Z0-9_-]", "_", f"mcp_{server}_{remote}")
    if len(name) > NAME_LIMIT:
        digest = hashlib.sha1(name.encode()).hexdigest()[:8]
        name = f"{name[:NAME_LIMIT - 9]}_{digest}"
    return name


def input_schema(raw: dict[str, Any] | None) -> dict[str, Any]:
    """The server's schema as a function's parameters (titles dropped: they cost tokens; the
    top-level ``additionalProperties``: some OpenAI-compatible servers refuse it)."""
    schema = copy.deepcopy(raw) if isinstance(raw, dict) else {}
    for key in ("title", "$schema", "additionalProperties"):  # see agent/tools/base.py
        schema.pop(key, None)
    if schema.get("type") != "object":
        schema = {"type": "object", "properties": {}}
    props = schema.setdefault("properties", {})
    for prop in props.values() if isinstance(props, dict) else ():
        if isinstance(prop, dict):
            prop.pop("title", None)
    return schema


def result_text(result: CallToolResult) -> str:
    parts: list[str] = []
    for block in result.content:
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(block.text)  # type: ignore[union-attr]
        elif kind in ("image", "audio"):
            size = len(getattr(block, "data", "")) * 3 // 4
            parts.append(f"[{kind} {getattr(block, 'mime_type', '')}, {size:,} bytes, not shown]")
        elif kind == "resource":
            resource = block.resource  # type: ignore[union-attr]
            text = getattr(resource, "text", None)
            parts.append(text if text is not None else f"[binary resource {resource.uri}]")
        elif kind == "resource_link":
            parts.append(f"[resource link: {getattr(block, 'uri', '')}]")
        else:
            parts.append(f"[{kind or 'unknown'} content]")
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False))
    return "\n".join(parts) or "(no output)"


class MCPTool(Tool):
    """A server's tool in our registry: the schema is the server's, the call goes to it."""

    def __init__(self, server: _Server, remote: RemoteTool) -> None:
        self.server = server
        self.remote = remote.name
        self.name = tool_name(server.name, remote.name)
        self.group = "mcp"
        description = " ".join((remote.description or remote.title or remote.name).split())
        if len(description) > DESCRIPTION_LIMIT:
            description = description[:DESCRIPTION_LIMIT - 1] + "…"
        self.description = description
        self.parameters = input_schema(remote.input_schema)
        self.func = self._call

    async def _call(self, ctx: TurnContext, **arguments: Any) -> str:
        return await self.server.call(self.remote, arguments)

    async def __call__(self, ctx: TurnContext, arguments: dict[str, Any]) -> str:
        return await self.server.call(self.remote, arguments)


class _WatchedRead:
    """The transport's read stream, calling ``on_close`` when it ends: how a crashed server
    or a dropped connection is noticed before the next call fails on it."""

    def __init__(self, inner: Any, on_close: Callable[[], None]) -> None:
        self._inner = inner
        self._on_close = on_close

    @property
    def last_context(self) -> Any:
        return getattr(self._inner, "last_context", None)

    async def receive(self) -> Any:
        try:
            return await self._inner.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
            self._on_close()
            raise

    def __aiter__(self) -> _WatchedRead:
        return self

    async def __anext__(self) -> Any:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> _WatchedRead:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self._inner.aclose()


class _Server:
    def __init__(self, config: MCPServerConfig, manager: MCPManager) -> None:
        self.config = config
        self.name = config.name
        self.manager = manager
        self.state = "connecting"
        self.error: str | None = None
        self.connects = 0
        self.client: Client | None = None
        self.tools: dict[str, MCPTool] = {}
        self.tried = asyncio.Event()
        """Set once the first connection attempt ended, either way."""
        self._lost = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    @property
    def transport(self) -> str:
        return "stdio" if self.config.command else "http"

    async def run(self) -> None:
        backoff = BackoffPolicy(self.manager.initial_backoff, self.manager.config.max_backoff,
                                jitter=0.0).counter()
        while not self.manager.stopping:
            self._lost = asyncio.Event()
            try:
                await self._connection()
                backoff.reset()  # it was up: start the backoff afresh
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.error = _describe(exc)
                if self.manager.stopping:  # a cancel the SDK's connect turned into an error
                    return
                _log.warning("MCP server %s: %s; retrying in %.1fs", self.name, self.error,
                             delay := backoff.next())
            else:
                delay = backoff.next()
            finally:
                self.client = None
            if self.manager.stopping:
                return
            self._set_state("reconnecting")
            self.tried.set()
            await asyncio.sleep(delay)

    async def _connection(self) -> None:
        async with contextlib.AsyncExitStack() as stack:
            async with asyncio.timeout(self.manager.config.connect_timeout):
                transport = await self._transport(stack)
                client = await stack.enter_async_context(
                    Client(transport, client_info=_CLIENT_INFO))
                listing = await _list_tools(client)
            self.client = client
            self.connects += 1
            self.error = None
            self.manager._install(self, listing)
            self._set_state("connected")
            self.tried.set()
            _log.info("MCP server %s connected (%s): %d tool(s)", self.name, self.transport,
                      len(self.tools))
            await self._lost.wait()
            self.client = None
            self.error = self.error or "disconnected"
            _log.warning("MCP server %s disconnected", self.name)

    async def _transport(self, stack: contextlib.AsyncExitStack) -> Any:
        cfg = self.config
        if cfg.command is not None:
            errlog = await closing_to_thread(self.manager.open_log, self.name)
            stack.callback(errlog.close)
            params = StdioServerParameters(command=cfg.command, args=cfg.args,
                                           env=cfg.env or None)
            inner: Any = stdio_client(params, errlog=cast(TextIO, errlog))
        else:
            assert cfg.url is not None
            # The owner configured this URL: its host is trusted at its port, even on
            # loopback; any other address the client is led to passes web_fetch's guard.
            guard = Guard(endpoints=[url_endpoint(cfg.url)], hint=_GUARD_HINT)
            http = await stack.enter_async_context(guarded_httpx_client(
                guard, headers=cfg.headers, timeout=httpx2.Timeout(30.0, read=300.0)))
            inner = streamable_http_client(cfg.url, http_client=http)
        return _watched(inner, self.lost)

    def lost(self, reason: str | None = None) -> None:
        """The connection is gone: tools answer "unavailable" at once; ``run`` reconnects."""
        if reason:
            self.error = reason
        if self.state == "connected":
            self._set_state("reconnecting")
        self._lost.set()

    def _set_state(self, state: str) -> None:
        self.state = state
        self.manager._changed()

    async def call(self, remote: str, arguments: dict[str, Any]) -> str:
        client = self.client
        if client is None or self.state != "connected":
            raise ToolError(f"MCP server {self.name} is unavailable (reconnecting)")
        timeout = self.config.tool_timeout
        try:
            async with asyncio.timeout(timeout + 1):
                result = await client.call_tool(remote, arguments, read_timeout_seconds=timeout)
        except TimeoutError:
            raise ToolError(f"{remote} on MCP server {self.name} did not answer within "
                            f"{timeout:g}s") from None
        except MCPError as exc:
            if exc.code == CONNECTION_CLOSED:
                self.lost("disconnected during a call")
                raise ToolError(f"MCP server {self.name} disconnected during the call; it is "
                                "being reconnected") from None
            if exc.code == REQUEST_TIMEOUT:
                raise ToolError(f"{remote} on MCP server {self.name} did not answer within "
                                f"{timeout:g}s") from None
            raise ToolError(f"MCP server {self.name}: {exc.message}") from None
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, httpx2.HTTPError,
                OSError) as exc:
            self.lost(_describe(exc))
            raise ToolError(f"MCP server {self.name} is unavailable ({_describe(exc)}); it is "
                            "being reconnected") from None
        text = result_text(result)
        if result.is_error:
            raise ToolError(f"{remote} (MCP server {self.name}): {text}")
        return text


@contextlib.asynccontextmanager
async def _watched(inner: Any, on_close: Callable[[], None]) -> AsyncIterator[Any]:
    async with inner as (read, write):
        yield _WatchedRead(read, on_close), write


async def _list_tools(client: Client) -> list[RemoteTool]:
    tools: list[RemoteTool] = []
    cursor: str | None = None
    for _ in range(_MAX_PAGES):
        page: ListToolsResult = await client.list_tools(cursor=cursor)
        tools += page.tools
        cursor = page.next_cursor
        if not cursor:
            break
    return tools


def _describe(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        return _describe(exc.exceptions[0])
    if isinstance(exc, TimeoutError):
        return "timed out connecting"
    if isinstance(exc, MCPError):
        return exc.message
    text = str(exc) or type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."


class MCPManager:
    """Owns one task per enabled server; ``status()`` is what /v1/health and
    ``parley status`` show."""

    def __init__(self, config: MCPConfig, *, log_dir: Path | None = None,
                 initial_backoff: float = INITIAL_BACKOFF) -> None:
        self.config = config
        self.log_dir = log_dir
        self.initial_backoff = initial_backoff
        self.servers = {s.name: _Server(s, self) for s in config.servers}
        self._registry: ToolRegistry | None = None
        self._event = asyncio.Event()
        self.stopping = False
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        """Start every enabled server and wait (up to ``connect_timeout``) for each first
        attempt; a server that is not up by then joins when it is. Never raises for a
        server's failure."""
        for server in self.servers.values():
            if not server.config.enabled:
                server.state = "disabled"
                continue
            task = asyncio.create_task(server.run(), name=f"mcp:{server.name}")
            server.task = task
            self._tasks.add(task)
            task.add_done_callback(self._done)
        tried = [asyncio.create_task(s.tried.wait(), name=f"mcp-wait:{s.name}")
                 for s in self.servers.values() if s.task is not None]
        if tried:
            _, pending = await asyncio.wait(tried, timeout=self.config.connect_timeout + 1)
            for waiter in pending:
                waiter.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            _log.error("MCP task %s ended: %r", task.get_name(), task.exception())

    def open_log(self, name: str) -> IO[str]:
        """Where a stdio server's stderr goes (blocking: call it in a thread)."""
        if self.log_dir is None:
            return open(os.devnull, "w")  # closed with the connection
        self.log_dir.mkdir(parents=True, exist_ok=True)
        return open(self.log_dir / f"{name}.log", "a", encoding="utf-8")

    def attach(self, registry: ToolRegistry) -> None:
        """Offer the servers' tools in ``registry``, now and whenever a server (re)connects."""
        self._registry = registry
        for server in self.servers.values():
            for t in server.tools.values():
                if registry.get(t.name) is None:
                    registry.register(t)

    def _install(self, server: _Server, remote: list[RemoteTool]) -> None:
        wanted = set(server.config.tools)
        fresh: dict[str, MCPTool] = {}
        for r in remote:
            if wanted and r.name not in wanted:
                continue
            t = MCPTool(server, r)
            if t.name in fresh:
                _log.warning("MCP server %s: tools %s and %s share the name %s; the second is "
                             "left out", server.name, fresh[t.name].remote, r.name, t.name)
                continue
            fresh[t.name] = t
        old, server.tools = server.tools, fresh
        registry = self._registry
        if registry is None:
            return
        for name, t in old.items():
            if registry.get(name) is t:
                registry.unregister(name)
        for name, t in fresh.items():
            if registry.get(name) is None:
                registry.register(t)
            else:
                _log.warning("MCP tool %s clashes with another tool; left out", name)

    def _changed(self) -> None:
        self._event.set()
        self._event = asyncio.Event()

    async def wait_for(self, predicate: Callable[[], bool]) -> None:
        """Wait until ``predicate()`` holds, checking after each change of a server's state
        (bound it with a timeout)."""
        while True:
            event = self._event
            if predicate():
                return
            await event.wait()

    def state(self, name: str) -> str:
        return self.servers[name].state

    def tool_names(self) -> list[str]:
        return [n for s in self.servers.values() for n in s.tools]

    async def stop(self) -> None:
        """Close every connection (a stdio server's process ends with it); idempotent.

        Besides the cancel, a flag and the lost-connection event end each server's loop:
        anyio's connect can turn a task's cancellation into a connection error."""
        self.stopping = True
        tasks = [s.task for s in self.servers.values() if s.task is not None]
        for server in self.servers.values():
            server.lost()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for server in self.servers.values():
            server.task = None
            if server.state != "disabled":
                server.state = "stopped"

    def status(self) -> dict[str, dict[str, Any]]:
        return {s.name: {"transport": s.transport, "state": s.state, "error": s.error,
                         "connects": s.connects, "tools": sorted(s.tools)}
                for s in self.servers.values()}
