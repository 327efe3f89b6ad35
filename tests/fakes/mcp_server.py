"""A tiny stdio MCP server for the tests, built with the official SDK's server API.

    python tests/fakes/mcp_server.py               # stdio
    python tests/fakes/mcp_server.py --http PORT   # streamable HTTP on 127.0.0.1:PORT/mcp

Tools: ``echo``, ``add``, ``fail`` (an error result), ``slow`` (sleeps, for timeouts) and
``crash`` (the process exits at once, as a crashing server does). With ``FAKE_MCP_DOWN`` set
to a path, the server exits at start while that file exists (``crash(stay_down=true)`` creates
it), so a test can hold the server down and then let it come back by removing the file.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

DOWN = os.environ.get("FAKE_MCP_DOWN")
if __name__ == "__main__" and DOWN and Path(DOWN).exists():  # before the SDK's slow import
    sys.stderr.write("down on purpose\n")
    sys.exit(1)

from mcp.server.mcpserver import MCPServer  # noqa: E402
from mcp.server.mcpserver.exceptions import ToolError  # noqa: E402

server = MCPServer("fake")


@server.tool()
def echo(text: str) -> str:
    """Echo the text back."""
    return f"echo: {text}"


@server.tool()
def add(a: int, b: int) -> int:
    """Add two whole numbers."""
    return a + b


@server.tool()
def fail(reason: str = "it failed") -> str:
    """Always fails with the given reason."""
    raise ToolError(reason)


@server.tool()
async def slow(seconds: float) -> str:
    """Sleep, then answer."""
    await asyncio.sleep(seconds)
    return "done"


@server.tool()
def crash(stay_down: bool = False) -> str:
    """Exit the server process at once."""
    if stay_down and DOWN:
        Path(DOWN).touch()
    sys.stderr.write("crashing on purpose\n")
    sys.stderr.flush()
    os._exit(3)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--http"]:
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run()
