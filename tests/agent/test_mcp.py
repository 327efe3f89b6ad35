"""MCPManager against the test MCP server (``tests/fakes/mcp_server.py``), run as a real
stdio subprocess and over streamable HTTP: tools, schemas, errors, timeouts, a crash and
the reconnect, servers that never come up."""

from __future__ import annotations

import asyncio
import io
import socket
import sys
import threading
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

import pytest
from mcp_types import CallToolResult, EmbeddedResource, ImageContent, TextContent
from mcp_types import TextResourceContents as TextResource
from mcp_types import Tool as RemoteTool

from agent.mcp import MCPManager, input_schema, result_text, tool_name
from agent.tools.base import ToolRegistry
from agent.turn import TurnContext
from gateway.kernel.config import ConfigError, MCPConfig, parse_config
from gateway.kernel.events import InboundMessage
from gateway.kernel.tasks import closing_to_thread

FAKE = str(Path(__file__).resolve().parents[1] / "fakes" / "mcp_server.py")
WAIT = 20.0


def stdio(name: str = "fake", **extra: Any) -> dict[str, Any]:
    return {"name": name, "command": sys.executable, "args": [FAKE], **extra}


def ctx(tmp_path: Path) -> TurnContext:
    return TurnContext(message=InboundMessage(channel="local", chat_id="c1", sender_id="u1",
                                              trust="owner",
                                              text="", received_at=datetime.now(UTC)),
                       session_id=1, workspace=tmp_path)


@pytest.fixture
async def managers(tmp_path: Path) -> AsyncIterator[Callable[..., MCPManager]]:
    made: list[MCPManager] = []

    def make(*servers: dict[str, Any], **config: Any) -> MCPManager:
        cfg = MCPConfig.model_validate({"servers": list(servers), "max_backoff": "0.2s",
                                        **config})
        manager = MCPManager(cfg, log_dir=tmp_path / "mcp", initial_backoff=0.05)
        made.append(manager)
        return manager

    try:
        yield make
    finally:
        for manager in made:
            await manager.stop()


async def until(manager: MCPManager, predicate: Callable[[], bool]) -> None:
    async with asyncio.timeout(WAIT):
        await manager.wait_for(predicate)


# pure pieces ------------------------------------------------------------------------------

def test_tool_names_are_sanitised_and_bounded() -> None:
    assert tool_name("fs", "read_file") == "mcp_fs_read_file"
    assert tool_name("my-server", "a.b/c d") == "mcp_my-server_a_b_c_d"
    long = tool_name("server", "x" * 100)
    assert len(long) == 64 and long.startswith("mcp_server_xxx")
    assert long != tool_name("server", "x" * 99 + "y")


def test_input_schema_keeps_the_servers_schema_without_titles() -> None:
    raw = {"type": "object", "title": "echoArguments", "$schema": "x",
           "properties": {"text": {"type": "string", "title": "Text"}}, "required": ["text"]}
    assert input_schema(raw) == {"type": "object", "properties": {"text": {"type": "string"}},
                                 "required": ["text"]}
    assert input_schema({}) == {"type": "object", "properties": {}}
    assert raw["title"] == "echoArguments"  # the server's copy is untouched


def test_result_text_flattens_content_blocks() -> None:
    result = CallToolResult(content=[
        TextContent(text="hello"), ImageContent(data="AAAA", mime_type="image/png"),
        EmbeddedResource(resource=TextResource(uri="file:///a.txt", text="inside"))])
    assert result_text(result) == "hello\n[image image/png, 3 bytes, not shown]\ninside"
    assert result_text(CallToolResult(content=[], structured_content={"a": 1})) == '{"a": 1}'


def test_server_config_is_checked() -> None:
    for server, message in (({"name": "x"}, "either command"),
                            ({"name": "x", "command": "a", "url": "http://h"}, "either command"),
                            ({"name": "x", "url": "ftp://h"}, "must start with http"),
                            ({"name": "x", "url": "http://h", "env": {"A": "1"}}, "stdio"),
                            ({"name": "bad name", "command": "a"}, "pattern")):
        with pytest.raises(ConfigError, match=message):
            parse_config({"agent": {"mcp": {"servers": [server]}}}, env={})
    with pytest.raises(ConfigError, match="unique"):
        parse_config({"agent": {"mcp": {"servers": [{"name": "a", "command": "x"},
                                                    {"name": "a", "command": "y"}]}}}, env={})


def test_a_changed_tool_list_updates_the_registry(managers: Callable[..., MCPManager]) -> None:
    manager = managers(stdio())
    server = manager.servers["fake"]
    registry = ToolRegistry()
    manager.attach(registry)

    def listing(*names: str) -> list[RemoteTool]:
        return [RemoteTool(name=n, input_schema={"type": "object", "properties": {}})
                for n in names]

    manager._install(server, listing("a", "b"))
    assert registry.names == ["mcp_fake_a", "mcp_fake_b"]
    before = registry.schemas()
    manager._install(server, listing("b", "c"))
    assert sorted(registry.names) == ["mcp_fake_b", "mcp_fake_c"]
    assert registry.schemas() is not before


# a real stdio server ----------------------------------------------------------------------

async def test_tools_are_listed_with_schemas_and_called(
        managers: Callable[..., MCPManager], tmp_path: Path) -> None:
    manager = managers(stdio())
    await manager.start()
    assert manager.state("fake") == "connected"
    registry = ToolRegistry()
    manager.attach(registry)
    assert sorted(registry.names) == ["mcp_fake_add", "mcp_fake_crash", "mcp_fake_echo",
                                      "mcp_fake_fail", "mcp_fake_slow"]
    echo = registry.get("mcp_fake_echo")
    assert echo is not None and echo.schema()["function"] == {
        "name": "mcp_fake_echo", "description": "Echo the text back.",
        "parameters": {"type": "object", "properties": {"text": {"type": "string"}},
                       "required": ["text"]}}
    c = ctx(tmp_path)
    # Calls come from other tasks than the one that holds the connection, as turns do.
    results = await asyncio.gather(
        registry.execute("mcp_fake_echo", '{"text": "hi"}', c),
        registry.execute("mcp_fake_add", {"a": 2, "b": 3}, c))
    assert [(r.text, r.is_error) for r in results] == [("echo: hi", False), ("5", False)]
    failed = await registry.execute("mcp_fake_fail", {"reason": "no luck"}, c)
    assert failed.is_error and "no luck" in failed.text and "MCP server fake" in failed.text
    status = manager.status()["fake"]
    assert status["state"] == "connected" and status["transport"] == "stdio"
    assert "mcp_fake_echo" in status["tools"]


async def test_per_tool_timeout(managers: Callable[..., MCPManager], tmp_path: Path) -> None:
    manager = managers(stdio(tool_timeout="0.3s"))
    await manager.start()
    registry = ToolRegistry()
    manager.attach(registry)
    slow = await registry.execute("mcp_fake_slow", {"seconds": 30}, ctx(tmp_path))
    assert slow.is_error and "did not answer within 0.3s" in slow.text
    quick = await registry.execute("mcp_fake_echo", {"text": "still here"}, ctx(tmp_path))
    assert quick.text == "echo: still here"


async def test_only_the_configured_tools_are_offered(
        managers: Callable[..., MCPManager]) -> None:
    manager = managers(stdio(tools=["echo"]))
    await manager.start()
    registry = ToolRegistry()
    manager.attach(registry)
    assert registry.names == ["mcp_fake_echo"]


async def test_a_crash_is_reconnected_and_tools_report_it_meanwhile(
        managers: Callable[..., MCPManager], tmp_path: Path) -> None:
    down = tmp_path / "down"
    manager = managers(stdio(env={"FAKE_MCP_DOWN": str(down)}))
    await manager.start()
    registry = ToolRegistry()
    manager.attach(registry)
    c = ctx(tmp_path)

    crashed = await registry.execute("mcp_fake_crash", {"stay_down": True}, c)
    assert crashed.is_error and "disconnected during the call" in crashed.text
    assert down.exists()
    meanwhile = await registry.execute("mcp_fake_echo", {"text": "x"}, c)
    assert meanwhile.text == "Error: MCP server fake is unavailable (reconnecting)"
    # The restarted server exits at once while the marker is there: the loop keeps trying.
    await until(manager, lambda: manager.status()["fake"]["error"] not in (
        None, "disconnected during a call"))
    assert manager.state("fake") == "reconnecting"
    assert "mcp_fake_echo" in registry.names  # still offered, answering with the error

    down.unlink()
    await until(manager, lambda: manager.state("fake") == "connected")
    back = await registry.execute("mcp_fake_echo", {"text": "back"}, c)
    assert back.text == "echo: back"
    assert manager.status()["fake"]["connects"] == 2
    assert "crashing on purpose" in (tmp_path / "mcp" / "fake.log").read_text()


async def test_servers_that_never_start_do_not_stop_the_others(
        managers: Callable[..., MCPManager], tmp_path: Path) -> None:
    manager = managers(stdio(), {"name": "missing", "command": str(tmp_path / "nope")},
                       {"name": "quits", "command": sys.executable,
                        "args": ["-c", "import sys; sys.exit(2)"]},
                       {"name": "off", "command": "never-run", "enabled": False})
    await manager.start()
    status = manager.status()
    assert status["fake"]["state"] == "connected"
    assert status["missing"]["state"] == "reconnecting"
    assert "No such file" in (status["missing"]["error"] or "")
    assert status["quits"]["state"] == "reconnecting" and status["quits"]["error"]
    assert status["off"]["state"] == "disabled"
    registry = ToolRegistry()
    manager.attach(registry)
    assert all(n.startswith("mcp_fake_") for n in registry.names)
    await manager.stop()
    assert {s["state"] for s in manager.status().values()} == {"stopped", "disabled"}
    assert not [t for t in asyncio.all_tasks() if t.get_name().startswith("mcp")]


async def test_a_log_opened_while_the_server_task_is_cancelled_is_closed(
        tmp_path: Path) -> None:
    """The stop (or the connect timeout) can cancel a server's task while its log file is
    being opened on a worker thread: the file is closed when the open lands, not leaked."""
    release, entered = threading.Event(), threading.Event()
    closed = asyncio.Event()

    class Log(io.StringIO):
        def close(self) -> None:
            super().close()
            closed.set()  # called on the loop, by the open's done callback

    files: list[IO[str]] = []

    def slow_open(name: str) -> IO[str]:
        entered.set()
        release.wait(WAIT)
        files.append(Log())
        return files[-1]

    task = asyncio.create_task(closing_to_thread(slow_open, "fake"))
    await asyncio.to_thread(entered.wait, WAIT)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not files  # still opening
    release.set()
    await asyncio.wait_for(closed.wait(), WAIT)
    assert files[0].closed


# streamable HTTP --------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_streamable_http_server(managers: Callable[..., MCPManager],
                                      tmp_path: Path) -> None:
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, FAKE, "--http", str(port), stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL)
    try:
        manager = managers({"name": "web", "url": f"http://127.0.0.1:{port}/mcp",
                            "headers": {"Authorization": "Bearer t"}}, connect_timeout="5s")
        await manager.start()  # the server may still be starting: it joins when it is up
        await until(manager, lambda: manager.state("web") == "connected")
        registry = ToolRegistry()
        manager.attach(registry)
        result = await registry.execute("mcp_web_add", {"a": 20, "b": 22}, ctx(tmp_path))
        assert result.text == "42"
        assert manager.status()["web"]["transport"] == "http"

        proc.terminate()
        await proc.wait()
        gone = await registry.execute("mcp_web_echo", {"text": "x"}, ctx(tmp_path))
        assert gone.is_error and "MCP server web" in gone.text
        await until(manager, lambda: manager.state("web") == "reconnecting")
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_an_http_server_is_reached_directly_whatever_the_proxy_settings(
        managers: Callable[..., MCPManager], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The owner's loopback server is trusted (its host and port), and the client takes no
    proxy from the environment: a proxy would be the connection the guard sees."""
    proxied: list[int] = []

    async def proxy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        proxied.append(1)
        writer.close()

    trap = await asyncio.start_server(proxy, "127.0.0.1", 0)
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "all_proxy"):
        monkeypatch.setenv(name, f"http://127.0.0.1:{trap.sockets[0].getsockname()[1]}")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, FAKE, "--http", str(port), stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL)
    try:
        manager = managers({"name": "web", "url": f"http://localhost:{port}/mcp"},
                           connect_timeout="5s")
        await manager.start()
        await until(manager, lambda: manager.state("web") == "connected")
        registry = ToolRegistry()
        manager.attach(registry)
        result = await registry.execute("mcp_web_add", {"a": 1, "b": 2}, ctx(tmp_path))
        assert result.text == "3" and proxied == []
    finally:
        trap.close()
        await trap.wait_closed()
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
