"""What the sandbox keeps out, through the real exec tool and real bubblewrap.

Each hostile command fails or is contained, and afterwards no process it started is left on
the host: every command carries a marker (an odd ``sleep`` length, a function name) that the
host's ``/proc/*/cmdline`` is searched for once the tool has returned.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import itertools
import os
import random
import re
import shutil
import signal
import tempfile
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest

from agent.tools import build_registry, sandbox_probe
from agent.tools.exec_access import GatewayFiles, HostRunner, resolve_exec_access
from agent.tools.sandbox import Sandbox, SandboxSpec, sandbox_env
from agent.tools.sandbox_probe import NoSandbox, find_sandbox
from agent.tools.shell import check_command
from gateway.kernel.config import ExecSandboxConfig, ExecToolConfig, ToolsConfig
from tests.agent.tools.conftest import Exec, exec_with, make_ctx, real_sandbox

_SEQ = itertools.count()
SETTLE_LOOKS = 1000
"""How many times (10 ms apart) ``settled`` looks before it answers anyway."""


def marker() -> str:
    """A ``sleep`` length no other process on the host has in its command line."""
    return f"{random.randint(3000, 3999)}.{os.getpid() % 1000:03d}{next(_SEQ):03d}"


def survivors(*marks: str) -> list[str]:
    """Command lines of live host processes carrying one of the markers (a zombie, or a process
    in the middle of being killed, has no command line left and is not counted)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, IndexError):
            continue
        if state not in ("Z", "X") and any(m in cmdline for m in marks):
            found.append(f"{entry.name}: {cmdline}")
    return found


async def settled(*marks: str, present: bool = False) -> list[str]:
    """``survivors(*marks)`` once the host's process table agrees with ``present``: a process
    being reaped, or one in the middle of ``exec``, shows for an instant. The wait is a safety
    cap only: a process that really survives (or never starts) fails the test after it."""
    for _ in range(SETTLE_LOOKS):
        left = survivors(*marks)
        if bool(left) is present:
            return left
        await asyncio.sleep(0.01)
    return survivors(*marks)


def started(name: str, mark: str) -> str:
    """A shell that says it is running (``<name>.ready`` in the workspace), then sleeps."""
    return f"sh -c 'echo > {name}.ready; exec sleep {mark}'"


def decoded_lines(text: str) -> str:
    """``text`` plus every line of it that is base64, decoded."""
    out = [text]
    for line in text.splitlines():
        with_padding = line.strip() + "=" * (-len(line.strip()) % 4)
        try:
            out.append(base64.b64decode(with_padding, validate=True).decode(errors="replace"))
        except (binascii.Error, ValueError):
            continue
    return "\n".join(out)


async def test_no_key_in_reach_of_the_environment_or_proc(run: Exec, ws: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PARLEY_TEST_API_KEY", "sk-canary-0123456789abcdef")
    monkeypatch.setenv("PARLEY_PLAIN_CANARY", "plain-canary-9876543210")  # no secret's name
    command = ("cat /proc/1/environ; echo; for f in /proc/[0-9]*/environ; do base64 -w0 $f; "
               "echo; done; base64 -w0 /proc/$PPID/environ; echo; env; "
               "ls -d /proc/[0-9]* | wc -l")
    text, err = await run(make_ctx(ws), command)
    assert not err and text.endswith("[exit code: 0]")
    seen = decoded_lines(text)
    assert "sk-canary-0123456789abcdef" not in seen and "[redacted]" not in seen
    assert "plain-canary-9876543210" not in seen
    assert f"HOME={ws.resolve()}" in text
    assert int(text.splitlines()[-2]) <= 6  # its own few processes, none of the host's


async def test_paths_outside_the_workspace_are_not_there(run: Exec, tmp_path: Path, ws: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "config.yaml").write_text("agent:\n  api_key: sk-inline-canary-42\n")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "parley.db").write_text("every conversation")
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text("PRIVATE KEY canary")
    monkeypatch.setenv("HOME", str(home))
    repo = Path(__file__).resolve().parents[3]
    text, _ = await run(make_ctx(ws), (
        f"cat ../config.yaml {tmp_path}/config.yaml; ls ../data; cat ~/.ssh/id_ed25519 "
        f"{home}/.ssh/id_ed25519; ls {repo}; ls /root /home /var /run /srv /opt; ls /"))
    for secret in ("sk-inline-canary-42", "parley.db", "PRIVATE KEY canary", "pyproject.toml"):
        assert secret not in text
    assert text.count("No such file or directory") >= 10
    listing = set(text.split("[stderr]")[0].split())
    assert listing <= {"bin", "dev", "etc", "lib", "lib32", "lib64", "libx32", "proc", "sbin",
                       "tmp", "usr"}


async def test_gateway_files_are_covered_inside_folders_it_sees(tmp_path: Path) -> None:
    """The config, data and log covered where they lie in a visible folder (an extra
    read-only one, or the workspace itself); their neighbours stay visible."""
    shared = tmp_path / "srv"
    (shared / "parley").mkdir(parents=True)
    (shared / "tool.txt").write_text("a shared tool\n")
    config = shared / "parley" / "config.yaml"
    config.write_text("api_key: sk-inline-canary-43\n")
    ws = tmp_path / "ws"
    (ws / ".data").mkdir(parents=True)
    (ws / ".data" / "parley.db").write_text("db canary")
    (ws / "gateway.log").write_text("log canary")
    (ws / "notes.md").write_text("my notes\n")
    sandbox = await real_sandbox(ro_paths=(shared,), hidden=(config, ws / ".data",
                                                               ws / "gateway.log"))
    text, _ = await exec_with(sandbox)(make_ctx(ws), (
        f"cat {shared}/tool.txt notes.md; cat {config}; ls -A .data; cat gateway.log; "
        "echo x > .data/new; echo y > gateway.log; echo z > fresh.md"))
    assert "a shared tool" in text and "my notes" in text
    for secret in ("sk-inline-canary-43", "parley.db", "db canary", "log canary"):
        assert secret not in text
    assert sorted(p.name for p in (ws / ".data").iterdir()) == ["parley.db"]
    assert (ws / "gateway.log").read_text() == "log canary"
    assert (ws / "fresh.md").read_text() == "z\n"


async def test_a_workspace_inside_the_data_folder_stays_writable(tmp_path: Path) -> None:
    """``~/.parley`` as the data folder with the workspace in it, in a folder the command
    sees: the data folder is covered, the workspace inside it is not."""
    home = tmp_path / "home"
    dot = home / ".parley"
    ws = dot / "workspace"
    ws.mkdir(parents=True)
    (dot / "config.yaml").write_text("api_key: sk-inline-canary-44\n")
    (dot / "parley.db").write_text("db canary")
    sandbox = await real_sandbox(ro_paths=(home,), hidden=(dot / "config.yaml", dot))
    text, _ = await exec_with(sandbox)(make_ctx(ws), "echo hi > f && cat f; cat ../config.yaml; "
                                                     "ls -A ..; ls -A ../..")
    assert text.startswith("hi\n")
    assert "sk-inline-canary-44" not in text and "parley.db" not in text
    assert (ws / "f").read_text() == "hi\n"


async def test_writes_land_only_in_the_workspace(run: Exec, tmp_path: Path, ws: Path) -> None:
    text, _ = await run(make_ctx(ws), (
        f"echo x > {tmp_path}/outside.txt; touch /usr/parley-x /etc/parley-x; "
        "echo t > /tmp/t && cat /tmp/t; echo w > inside.txt"))
    assert text.count("Read-only file system") == 2
    assert not (tmp_path / "outside.txt").exists()
    assert not Path("/usr/parley-x").exists() and not Path("/etc/parley-x").exists()
    assert (ws / "inside.txt").read_text() == "w\n"
    text, _ = await run(make_ctx(ws), "cat /tmp/t")  # /tmp is the command's own
    assert "No such file or directory" in text


async def test_nothing_the_command_starts_outlives_it(run: Exec, ws: Path) -> None:
    a, b, c, d = (marker() for _ in range(4))
    command = (f"setsid -f {started('a', a)}; ( ({started('b', b)} &) & ); "
               f"nohup {started('c', c)} >/dev/null 2>&1 & {started('d', d)} & "
               "until [ -e a.ready ] && [ -e b.ready ] && [ -e c.ready ] && [ -e d.ready ]; "
               "do :; done; echo started")
    text, _ = await run(make_ctx(ws), command, timeout=20)
    assert text == "started\n[exit code: 0]"
    assert await settled(a, b, c, d) == []


async def test_the_survivor_check_can_fail(ws: Path) -> None:
    """Unsandboxed (the unsafe switch), ``setsid`` escapes the process group: the check above
    sees such a process."""
    mark = marker()
    text, _ = await exec_with(HostRunner())(
        make_ctx(ws), f"setsid -f {started('a', mark)} >/dev/null 2>&1; "
                      "until [ -e a.ready ]; do :; done")
    assert text.endswith("[exit code: 0]")
    left = await settled(mark, present=True)
    try:
        assert len(left) == 1
    finally:
        for line in left:
            os.kill(int(line.split(":")[0]), signal.SIGKILL)


async def test_timeout_kills_everything(run: Exec, ws: Path) -> None:
    a, b, c = marker(), marker(), marker()
    text, _ = await run(make_ctx(ws), f"setsid -f {started('a', a)}; {started('b', b)} & "
                                      f"sleep {c}", timeout=1)
    assert text == "(no output)\n[timed out after 1s; process killed]"
    assert (ws / "a.ready").exists() and (ws / "b.ready").exists()
    assert await settled(a, b, c) == []


async def test_a_cancelled_turn_kills_everything(run: Exec, ws: Path) -> None:
    a, b = marker(), marker()
    fifo = ws / "go"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    loop = asyncio.get_running_loop()
    going: asyncio.Future[bytes] = loop.create_future()
    loop.add_reader(reader, lambda: going.done() or going.set_result(os.read(reader, 100)))
    task = asyncio.create_task(run(make_ctx(ws), f"setsid -f {started('a', a)}; "
                                                 f"until [ -e a.ready ]; do :; done; "
                                                 f"echo go > go; sleep {b}"), name="test-exec")
    try:
        assert (await asyncio.wait_for(going, 10)).strip() == b"go"
    finally:
        loop.remove_reader(reader)
        os.close(reader)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await settled(a, b) == []


FORK_LOOP = """python3 -c '
import os, time
n = 0
try:
    while True:
        if os.fork() == 0:
            time.sleep({mark})
            os._exit(0)
        n += 1
except OSError as exc:
    print("forked", n, exc.errno, flush=True)
{then}'"""


async def test_a_fork_loop_stops_at_the_process_limit(ws: Path) -> None:
    mark = marker()
    command = FORK_LOOP.format(mark=mark, then="")
    check_command(command, [])  # the deny list does not know this form
    text, _ = await exec_with(await real_sandbox(processes=16))(make_ctx(ws), command)
    match = re.search(r"forked (\d+) 11\b", text)  # EAGAIN
    assert match, text
    assert 8 <= int(match.group(1)) < 16
    assert await settled(mark) == []


async def test_a_shell_fork_bomb_is_contained(ws: Path) -> None:
    name = f"bomb{random.randint(10**6, 10**7)}"
    command = f"{name}() {{ {name} & {name}; }}; {name}"
    check_command(command, [])
    text, err = await exec_with(await real_sandbox(processes=16))(make_ctx(ws), command,
                                                                   timeout=20)
    assert not err and "fork" in text.lower()
    assert await settled(name) == []


async def test_a_memory_hog_gets_no_memory(run: Exec, ws: Path) -> None:
    text, _ = await run(make_ctx(ws), 'python3 -c "b = bytearray(4 << 30); print(len(b))"')
    assert "MemoryError" in text and text.endswith("[exit code: 1]")


async def test_cpu_time_limit(ws: Path) -> None:
    text, _ = await exec_with(await real_sandbox(cpu_seconds=1))(
        make_ctx(ws), "while :; do :; done", timeout=30)
    assert text == "(no output)\n[exit code: 152; CPU time limit reached]"


async def test_file_size_limit(ws: Path) -> None:
    text, _ = await exec_with(await real_sandbox(file_size=1 << 20))(
        make_ctx(ws), "head -c 5000000 /dev/zero > big")
    assert text.endswith("[exit code: 153; file size limit reached]")
    assert (ws / "big").stat().st_size == 1 << 20


async def test_network_is_off_unless_configured(ws: Path) -> None:
    connected = asyncio.Event()

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connected.set()
        writer.close()

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    command = ('python3 -c "import socket; socket.create_connection((\'127.0.0.1\', '
               f'{port}), 3); print(\'connected\')"')
    async with server:
        text, _ = await exec_with(await real_sandbox())(make_ctx(ws), command)
        assert "ConnectionRefusedError" in text and not connected.is_set()
        text, _ = await exec_with(await real_sandbox(network=True))(make_ctx(ws), command)
        assert text == "connected\n[exit code: 0]"
        await asyncio.wait_for(connected.wait(), 5)


async def test_without_bubblewrap_exec_is_off_and_not_offered(tmp_path: Path) -> None:
    config = ExecToolConfig(sandbox=ExecSandboxConfig(bwrap=str(tmp_path / "no-bwrap")))
    access = await resolve_exec_access(config, GatewayFiles(config=None,
                                                            data_dir=tmp_path / "data"))
    assert access.state == "off" and access.runner is None
    assert access.describe().startswith("off — bubblewrap not found")
    names = build_registry(ToolsConfig(exec=config), exec_access=access).names
    assert "exec" not in names and "read_file" in names


async def test_root_without_a_pids_cgroup_gets_no_sandbox(
        monkeypatch: pytest.MonkeyPatch) -> None:
    await real_sandbox()  # skips where bubblewrap is missing: then that is the reason
    monkeypatch.setattr(sandbox_probe, "_FOUND", {})
    monkeypatch.setattr(sandbox_probe, "_host_root", lambda: True)
    monkeypatch.setattr(sandbox_probe, "find_pids_cgroups",
                        lambda: "no cgroup hierarchy with the pids controller is mounted")
    found = await find_sandbox(SandboxSpec())
    assert isinstance(found, NoSandbox)
    assert found.reason.startswith("running as root, whose processes the kernel does not count")


async def test_the_unsafe_switch_runs_without_bubblewrap(tmp_path: Path, ws: Path) -> None:
    (tmp_path / "outside.txt").write_text("the host's own file\n")
    config = ExecToolConfig(dangerously_run_unsandboxed=True,
                            sandbox=ExecSandboxConfig(bwrap=str(tmp_path / "no-bwrap")))
    access = await resolve_exec_access(config, GatewayFiles(config=None,
                                                            data_dir=tmp_path / "data"))
    assert access.state == "unsandboxed" and access.describe().startswith("UNSANDBOXED — ")
    assert access.runner is not None
    registry = build_registry(ToolsConfig(exec=config), exec_access=access)
    result = await registry.execute("exec", {"command": f"cat {tmp_path}/outside.txt"},
                                    make_ctx(ws))
    assert result.text == "the host's own file\n[exit code: 0]"


async def test_sandboxed_access_describes_itself(tmp_path: Path) -> None:
    await real_sandbox()
    access = await resolve_exec_access(ExecToolConfig(), GatewayFiles(
        config=tmp_path / "config.yaml", data_dir=tmp_path / "data"))
    assert access.state == "sandboxed"
    assert re.match(r"sandboxed \(bubblewrap [\d.]+; network off; limits: CPU 60 s, memory "
                    r"1 GiB, 64 processes \((pids cgroup( v1)?|RLIMIT_NPROC in a user "
                    r"namespace)\), files 100 MiB\)$", access.describe())
    [tool] = [build_registry(ToolsConfig(), exec_access=access).get("exec")]
    assert tool is not None and "sandbox" in tool.description


@pytest.fixture
async def nobody_workspaces() -> AsyncIterator[list[Path]]:
    root = Path(tempfile.mkdtemp(prefix="parley-nobody-"))
    root.chmod(0o755)
    spaces = [root / "a", root / "b"]
    for space in spaces:
        space.mkdir()
        os.chown(space, 65534, 65534)
    try:
        yield spaces
    finally:
        shutil.rmtree(root)


async def test_an_ordinary_user_is_held_by_rlimit_in_its_user_namespace(
        nobody_workspaces: list[Path]) -> None:
    """What a gateway run by an ordinary user gets (CI is root, so the same sandbox runs as
    ``nobody`` here): RLIMIT_NPROC set inside bwrap's user namespace counts each command's
    processes alone — two at their limit at the same time both reach it."""
    if os.getuid() != 0 or shutil.which("runuser") is None:
        pytest.skip("needs root (to become nobody) and runuser")
    sandbox: Sandbox = replace(await real_sandbox(processes=12), cgroups=None)
    mark = marker()
    command = FORK_LOOP.format(mark=mark, then="while not os.path.exists(\"release\"): "
                                                "time.sleep(0.01)")
    procs = [await asyncio.create_subprocess_exec(
        "runuser", "-u", "nobody", "--", sandbox.bwrap, *sandbox.options(space), "--",
        *sandbox.limits(), "/bin/sh", "-c", command, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT, env=sandbox_env(space)) for space in nobody_workspaces]
    try:
        firsts = [await asyncio.wait_for(p.stdout.readline(), 20) for p in procs if p.stdout]
        counts = [re.search(rb"forked (\d+) 11", line) for line in firsts]
        assert all(counts), firsts
        assert all(8 <= int(m.group(1)) < 12 for m in counts if m)
    finally:
        for space in nobody_workspaces:
            (space / "release").touch()
        for p in procs:
            await asyncio.wait_for(p.wait(), 20)
    assert await settled(mark) == []
