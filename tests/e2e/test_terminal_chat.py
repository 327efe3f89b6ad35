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


async def test_parley_chat_on_a_real_terminal(tmp_path: Path, llm: ScriptedLLM) -> None:
    """``parley chat`` itself on a pseudo-terminal (util-linux ``script`` makes one, with the
    terminal's own Ctrl-C): Up recalls the last line from ``data_dir/chat_history`` instead of
    typing ``^[[A``, Ctrl-C during an answer stops it, two Ctrl-C at the prompt leave."""
    import re
    import shlex

    from tests.e2e.test_cli import PARLEY, _env, write_config

    gate = llm.hold()
    llm.reply("held answer")
    llm.echo()
    config = write_config(tmp_path, llm)
    # exec: `script` runs the command through $SHELL or /bin/sh; a shell left waiting between it and
    # parley gets the terminal's SIGINT too, and dash then exits 130 after parley exits 0
    command = "exec " + shlex.join([PARLEY, "chat", "--config", str(config)])
    proc = await asyncio.create_subprocess_exec(
        "script", "-q", "-f", "-e", "-c", command, "/dev/null", stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        # `script` answers no cursor-position request, which a real terminal does: without this
        # prompt_toolkit waits a second for the answer at every prompt and, after two, warns
        env={**_env(), "TERM": "xterm-256color", "PROMPT_TOOLKIT_NO_CPR": "1"})
    assert proc.stdin is not None and proc.stdout is not None
    seen = bytearray()

    async def read() -> None:
        assert proc.stdout is not None
        while chunk := await proc.stdout.read(4096):
            seen.extend(chunk)

    def shown() -> str:
        return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", seen.decode(errors="replace"))

    def at_prompt() -> bool:
        return shown().rstrip().endswith("›")

    reader = asyncio.create_task(read())
    try:
        for typed, ready in [
            ("first\r", at_prompt),
            ("\x03", lambda: llm.in_flight == 1),  # Ctrl-C while the model works
            ("\x1b[A\r", lambda: "Stopped." in shown() and at_prompt()),  # Up: the line again
            ("\x03", lambda: "echo: first" in shown() and at_prompt()),
            ("\x03", lambda: "Ctrl-C again" in shown() and at_prompt()),
        ]:
            await until(ready, lambda t=typed: f"before typing {t!r}:\n{shown()}", timeout=30)
            proc.stdin.write(typed.encode())
            await proc.stdin.drain()
        code = await asyncio.wait_for(proc.wait(), 30)
    finally:
        gate.release()
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await reader
    assert code == 0, shown()
    assert _user_texts(llm) == ["first", "first"]  # the second one recalled with Up
    assert "held answer" not in shown() and "Traceback" not in shown()
    assert "first" in (tmp_path / "data" / "chat_history").read_text()


LEAVING = """
import asyncio, os, signal, sys
from channels.terminal import leaving

async def main(presses):
    with leaving():
        for _ in range(presses):
            os.kill(os.getpid(), signal.SIGINT)
        # the signal reaches the loop through its wakeup fd: a bounded number of turns of it
        for _ in range(1000):
            await asyncio.sleep(0)
    return 0

try:
    sys.exit(asyncio.run(main(int(sys.argv[1]))))
except KeyboardInterrupt:
    sys.exit(130)
"""


async def test_one_ctrl_c_while_closing_is_ignored_a_second_aborts() -> None:
    """After the person left, the gateway's shutdown is not turned into an interrupted exit by
    one stray Ctrl-C; a second one still gets out of a shutdown that hangs."""
    import sys

    codes = []
    for presses in (1, 2):
        proc = await asyncio.create_subprocess_exec(sys.executable, "-c", LEAVING, str(presses))
        codes.append(await asyncio.wait_for(proc.wait(), 60))
    assert codes == [0, 130]
