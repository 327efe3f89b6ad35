"""The terminal chat on prompt_toolkit: line editing, a history kept in a file, Ctrl-C stopping
the running turn like /stop, two Ctrl-C at the prompt leaving. The real gateway and agent, the
scripted model; keys typed through prompt_toolkit's pipe input."""

from __future__ import annotations

import asyncio
import io
import os
import signal
from collections.abc import Callable
from pathlib import Path

from prompt_toolkit.input import create_pipe_input
from prompt_toolkit.output import DummyOutput
from rich.console import Console

from channels.terminal import TerminalChannel
from gateway.app import Gateway
from tests.conftest import MakeConfig
from tests.e2e.waiting import until
from tests.fakes.openai_server import ScriptedLLM

UP, LEFT, ENTER, CTRL_C = "\x1b[A", "\x1b[D", "\r", "\x03"


def _user_texts(llm: ScriptedLLM) -> list[str]:
    return [r["messages"][-1]["content"] for r in llm.requests]


Keys = list[tuple[str, Callable[[], bool]]]


async def _chat(make_config: MakeConfig, history: Path, shown: io.StringIO, keys: Keys) -> None:
    """Run the interactive chat; type each ``(keys, ready)`` once ``ready()`` holds."""
    gw = Gateway(make_config(), configured_channels=False)
    terminal = TerminalChannel(gw.config.channels.terminal, gw.bus, markdown=False,
                               console=Console(file=shown, width=200))
    gw.manager.add(terminal)
    async with gw:
        with create_pipe_input() as pipe:
            chat = asyncio.create_task(terminal.interactive(history=history, input=pipe,
                                                            output=DummyOutput()))
            for typed, ready in keys:
                await until(ready, lambda t=typed: f"before typing {t!r}: {shown.getvalue()}")
                pipe.send_text(typed)
            await asyncio.wait_for(chat, 10)


async def test_line_editing_and_history(make_config: MakeConfig, llm: ScriptedLLM,
                                        tmp_path: Path) -> None:
    history = tmp_path / "data" / "chat_history"
    shown = io.StringIO()
    llm.reply("one").reply("two")
    await _chat(make_config, history, shown, [
        ("helo" + LEFT + "l" + ENTER, lambda: True),  # edited in the middle of the line
        (UP + ENTER, lambda: "one" in shown.getvalue()),  # the same line again
        ("/exit" + ENTER, lambda: "two" in shown.getvalue()),
    ])
    assert _user_texts(llm) == ["hello", "hello"]
    assert "hello" in history.read_text()

    llm.reply("three")  # a new chat reads the history file: /exit, then hello
    await _chat(make_config, history, shown, [
        (UP + UP + ENTER, lambda: True),
        ("/exit" + ENTER, lambda: "three" in shown.getvalue()),
    ])
    assert _user_texts(llm) == ["hello", "hello", "hello"]


async def test_ctrl_c_stops_the_turn_and_twice_at_the_prompt_leaves(
        make_config: MakeConfig, llm: ScriptedLLM, tmp_path: Path) -> None:
    gate = llm.hold()
    llm.reply("never shown")
    shown = io.StringIO()

    def interrupt_once_running() -> bool:
        if llm.in_flight != 1:
            return False
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C while the turn runs
        return True

    try:
        await _chat(make_config, tmp_path / "history", shown, [
            ("a long task" + ENTER, lambda: True),
            ("", interrupt_once_running),
            (CTRL_C, lambda: "Stopped." in shown.getvalue()),  # back at the prompt
            (CTRL_C, lambda: "Ctrl-C again" in shown.getvalue()),
        ])
    finally:
        gate.release()
    assert "never shown" not in shown.getvalue()
    assert _user_texts(llm) == ["a long task"]


async def test_log_lines_go_above_the_prompt(make_config: MakeConfig) -> None:
    """The CLI's log handler writes to whatever ``sys.stderr`` is when a line is logged, so
    under the prompt (prompt_toolkit's ``patch_stdout``) a log line is printed above it."""
    import logging
    import sys

    from prompt_toolkit.patch_stdout import StdoutProxy, patch_stdout

    from gateway.cli import _setup_logging

    root = logging.getLogger()
    saved = root.level, list(root.handlers)
    _setup_logging(make_config())
    try:
        [handler] = root.handlers
        with patch_stdout(raw=True):
            assert isinstance(sys.stderr, StdoutProxy)
            assert handler.stream is sys.stderr  # type: ignore[attr-defined]
        assert handler.stream is sys.stderr  # type: ignore[attr-defined]
    finally:
        root.setLevel(saved[0])
        root.handlers[:] = saved[1]
