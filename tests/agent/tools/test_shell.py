"""The exec tool through the real registry: output, limits, process cleanup and safety rules."""

from __future__ import annotations

import asyncio
import json
import os
import re
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from agent.tools.base import ToolRegistry
from agent.tools.files import FILE_TOOLS
from agent.tools.shell import SHELL_TOOLS, cap_pieces, check_command, child_env
from agent.turn import TurnContext
from gateway.kernel.config import ConfigError, ExecToolConfig, ToolsConfig, parse_config
from gateway.kernel.events import InboundMessage

REGISTRY = ToolRegistry(FILE_TOOLS + SHELL_TOOLS)


def make_ctx(workspace: Path, **exec_config: Any) -> TurnContext:
    return TurnContext(message=InboundMessage(channel="local", chat_id="c1", sender_id="u1",
                                              trust="owner",
                                              text="", received_at=datetime.now(UTC)),
                       session_id=1, workspace=workspace,
                       tools=ToolsConfig(exec=ExecToolConfig(**exec_config)))


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    path = tmp_path / "ws"
    path.mkdir()
    return path


async def run(ctx: TurnContext, command: str, **args: Any) -> tuple[str, bool]:
    result = await REGISTRY.execute("exec", json.dumps({"command": command, **args}), ctx)
    return result.text, result.is_error


async def wait_exited(pid: int, timeout: float = 5.0) -> None:
    """Wait (without sleeping) until ``pid`` has exited; a pidfd turns readable when it does."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    loop = asyncio.get_running_loop()
    exited = loop.create_future()
    loop.add_reader(fd, lambda: exited.done() or exited.set_result(None))
    try:
        await asyncio.wait_for(exited, timeout)
    finally:
        loop.remove_reader(fd)
        os.close(fd)


def assert_reaped(pid: int) -> None:
    """Our own child must be gone entirely, not left as a zombie."""
    assert not Path(f"/proc/{pid}").exists()


async def test_echo_output_and_exit_code(ws: Path) -> None:
    text, err = await run(make_ctx(ws), "echo hello; echo oops >&2")
    assert not err
    assert text == "hello\n[stderr]\noops\n[exit code: 0]"


async def test_nonzero_exit_and_no_output(ws: Path) -> None:
    text, err = await run(make_ctx(ws), "exit 3")
    assert not err and text == "(no output)\n[exit code: 3]"


async def test_runs_in_workspace_with_stdin_closed(ws: Path) -> None:
    text, _ = await run(make_ctx(ws), "pwd; cat; echo done")
    assert text.splitlines() == [str(ws.resolve()), "done", "[exit code: 0]"]


async def test_timeout_kills_the_process_group(ws: Path) -> None:
    text, err = await run(make_ctx(ws), "sleep 30 & echo $$ $!; sleep 30", timeout=0.5)
    assert not err
    assert text.endswith("[timed out after 0.5s; process killed]")
    shell_pid, background_pid = map(int, text.splitlines()[0].split())
    assert_reaped(shell_pid)
    await wait_exited(background_pid)


async def test_timeout_is_capped_by_config(ws: Path) -> None:
    text, _ = await run(make_ctx(ws, timeout=0.3), "sleep 30", timeout=1000)
    assert text == "(no output)\n[timed out after 0.3s; process killed]"


async def test_background_jobs_do_not_outlive_the_command(ws: Path) -> None:
    # the background sleep keeps the output pipe open; the command still ends with its shell
    text, _ = await run(make_ctx(ws), "sleep 30 & echo $!", timeout=20)
    assert text.endswith("[exit code: 0]")
    await wait_exited(int(text.splitlines()[0]))


async def test_cancellation_kills_the_child(ws: Path, tmp_path: Path) -> None:
    fifo = tmp_path / "pids"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    loop = asyncio.get_running_loop()
    started = loop.create_future()
    loop.add_reader(reader, lambda: started.done() or started.set_result(os.read(reader, 100)))
    ctx = make_ctx(ws)
    task = asyncio.create_task(run(ctx, f"sleep 30 & echo $$ $! > {fifo}; sleep 30"),
                               name="test-exec")
    try:
        shell_pid, background_pid = map(int, (await asyncio.wait_for(started, 10)).split())
    finally:
        loop.remove_reader(reader)
        os.close(reader)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert_reaped(shell_pid)
    await wait_exited(background_pid)


async def test_huge_output_keeps_head_and_tail(ws: Path) -> None:
    text, err = await run(make_ctx(ws, max_output_chars=1000), "yes | head -c 5000000")
    assert not err
    head, rest = text.split("\n... [", 1)
    count, tail = rest.split(" characters cut] ...\n", 1)
    assert tail.endswith("\n[exit code: 0]")
    tail = tail.removesuffix("\n[exit code: 0]")
    assert len(head) == 600 and set(head) <= {"y", "\n"}
    assert 0 < len(tail) <= 400
    assert int(count) == 5_000_000 - 600 - len(tail) - 1  # the trailing newline is stripped


async def test_cut_counts_exact_with_distinct_head_and_tail(ws: Path) -> None:
    text, _ = await run(make_ctx(ws, max_output_chars=1000), "seq 1 200000")
    full = "".join(f"{i}\n" for i in range(1, 200001))
    match = re.fullmatch(r"(.*)\n\.\.\. \[(\d+) characters cut\] \.\.\.\n(.*)\n\[exit code: 0\]",
                         text, re.S)
    assert match
    head, cut, tail = match.group(1), int(match.group(2)), match.group(3)
    assert full.startswith(head) and head.startswith("1\n2\n3\n")
    assert full.rstrip("\n").endswith(tail) and tail.endswith("199999\n200000")
    assert len(head) + cut + len(tail) == len(full) - 1


async def test_stderr_flood_and_stdout_both_shown(ws: Path) -> None:
    text, _ = await run(make_ctx(ws, max_output_chars=500),
                        "echo start; yes err | head -c 100000 >&2; echo end >&2; exit 1")
    assert text.startswith("start\n[stderr]\nerr\n")
    assert text.endswith("err\nend\n[exit code: 1]")
    assert "characters cut" in text


async def test_secrets_are_not_in_the_environment(ws: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PARLEY_TEST_API_KEY", "supersecretvalue123")
    monkeypatch.setenv("GITHUB_PAT", "ghp_xxxxxxxxxxxx")
    monkeypatch.setenv("PARLEY_HARMLESS", "visible-value")
    text, _ = await run(make_ctx(ws), "env")
    assert "PARLEY_HARMLESS=visible-value" in text
    assert "PARLEY_TEST_API_KEY" not in text and "supersecretvalue123" not in text
    assert "GITHUB_PAT" not in text


async def test_secret_values_are_redacted_from_output(ws: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PARLEY_TEST_API_KEY", "supersecretvalue123")
    (ws / "leak.txt").write_text("key=supersecretvalue123\n")
    text, _ = await run(make_ctx(ws), "cat leak.txt")
    assert text == "key=[redacted]\n[exit code: 0]"


@pytest.mark.parametrize("command", [
    "rm -rf /", "rm -rf ~", "rm -fr /*", "sudo rm -rf --no-preserve-root /", "rm -r -f $HOME",
    "cd x && rm -rf *", "rm -rf .", "rm -rf /etc", ":(){ :|:& };:", "mkfs.ext4 /dev/sda1",
    "dd if=/dev/zero of=/dev/sda bs=1M", "echo x > /dev/sda", "shutdown -h now", "ls; reboot",
    "chmod -R 777 /", "chown -R nobody /", "kill -9 -1", "sudo apt-get install foo",
])
async def test_deny_list_refuses_destructive_commands(ws: Path, command: str) -> None:
    marker = ws / "still-here"
    marker.touch()
    text, err = await run(make_ctx(ws), command)
    assert err and "refused by the safety policy" in text and "rule:" in text
    assert marker.exists()


@pytest.mark.parametrize("command", [
    "rm -rf build/", "rm build/x.txt", "rm -rf ./build .cache", "rm -rf /tmp/parley-x",
    "rm -rf ~/projects/old", "echo reboot later", "grep -r halt .", "chmod -R u+w .",
    "kill -1 12345", "dd if=/dev/zero of=out.img count=1", "cat /dev/null > log.txt",
])
def test_deny_list_allows_ordinary_commands(command: str) -> None:
    check_command(command, [])


async def test_rm_inside_workspace_runs(ws: Path) -> None:
    (ws / "build" / "sub").mkdir(parents=True)
    (ws / "build" / "sub" / "x.o").touch()
    text, err = await run(make_ctx(ws), "rm -rf build/ && ls -A")
    assert not err and text == "(no output)\n[exit code: 0]"


async def test_configured_deny_pattern(ws: Path) -> None:
    ctx = make_ctx(ws, deny=[r"\bcurl\b"])
    text, err = await run(ctx, "curl https://example.com")
    assert err and r"configured deny pattern '\\bcurl\\b'" in text
    text, err = await run(ctx, "echo curly")
    assert not err


def test_broken_deny_pattern_is_a_config_error() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config({"agent": {"tools": {"exec": {"deny": ["ok", "("]}}}}, env={})
    [(key, reason)] = info.value.errors
    assert key == "agent.tools.exec.deny" and "deny[1] '('" in reason


async def test_broken_deny_pattern_fails_closed(ws: Path) -> None:
    """Defence in depth for a config built without validation."""
    ctx = make_ctx(ws)
    broken = ExecToolConfig.model_construct(**{**ctx.tools.exec.model_dump(), "deny": ["("]})
    ctx = replace(ctx, tools=ToolsConfig.model_construct(**{**dict(ctx.tools), "exec": broken}))
    text, err = await run(ctx, "echo hi")
    assert err and "not a valid regex" in text


def test_child_env_drops_secret_names() -> None:
    env, secrets = child_env({"PATH": "/bin", "OPENAI_API_KEY": "sk-123456789",
                              "AWS_REGION": "eu", "db_password": "hunter2hunter2",
                              "SSH_AUTH_SOCK": "/tmp/agent", "GIT_AUTHOR_NAME": "Ann",
                              "HF_HOME": "/x"})
    assert env == {"PATH": "/bin", "GIT_AUTHOR_NAME": "Ann"}
    assert sorted(secrets) == ["/tmp/agent", "hunter2hunter2", "sk-123456789"]


def test_cap_pieces() -> None:
    assert cap_pieces(["abc", "def"], 10) == "abcdef"
    assert cap_pieces(["a" * 10, "b" * 10], 10) == "aaaaaa\n... [10 characters cut] ...\nbbbb"
    assert cap_pieces(["ab", 5, "cd"], 100) == "ab\n... [5 characters cut] ...\ncd"
