"""The README, followed as a new user would: a fresh clone, an empty home folder, and every
command of every ``sh`` block run verbatim, in order, in a shell whose PATH has no ``parley``
until the README says how to get it there.

Nothing is skipped silently. A command that cannot run here (one that needs a real bot's
pairing code, systemd, docker, PyPI, a terminal to answer questions, or is this very suite) is
listed in ``NOT_RUN`` with the reason, and still checked: its ``parley`` subcommand and options
exist (``--help``), its ``make`` target exists (``make -n``), and it parses as shell. A command
the README gains is run unless it is listed, so the README cannot drift from what works.

What stands in for the world: the scripted OpenAI-compatible server (through
``PARLEY_MODEL``/``PARLEY_API_BASE``, as the README's provider table says), free ports for the
README's 8765 and 8766 (``PARLEY_LOCAL_PORT``/``PARLEY_WEBCHAT_PORT``, read by the config
``make run`` writes; the port numbers in the commands are replaced by them), and the virtualenv
running these tests linked as the clone's ``.venv`` (``make`` sees it installed).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from tests.e2e.waiting import until
from tests.fakes.openai_server import ScriptedLLM

ROOT = Path(__file__).resolve().parents[2]
VENV = Path(sys.executable).parent.parent

NOT_RUN = {
    "make test": "this suite itself (`make -n test` checked)",
    "make lint": "ruff and mypy, run by CI on their own (`make -n lint` checked)",
    "make bench": "benchmarks take minutes and are never part of make test",
    "parley onboard --force": "asks questions at a terminal; tests/e2e/test_onboard_doctor.py "
                              "answers them",
    "parley onboard": "asks questions at a terminal (as above)",
    "parley pairing approve telegram K7QH3MZP": "needs the code a real Telegram user was given",
    "parley pairing approve discord K7QH3MZP": "needs the code a real Discord user was given",
    "parley pairing revoke telegram 123456789": "needs a user approved on a real bot",
    "parley cron run ID": "ID stands for a job's id from `parley cron list`",
    "parley cron remove ID": "ID stands for a job's id from `parley cron list`",
    "pipx install .": "installs into ~/.local from PyPI; the wheel's package data is checked "
                      "by test_package_data_is_shipped",
    "systemctl --user daemon-reload && systemctl --user enable --now parley":
        "needs a systemd user session; tests/test_deploy.py checks the unit",
    "systemctl --user start parley": "needs a systemd user session",
    'loginctl enable-linger "$USER"': "needs systemd-logind",
    "journalctl --user -u parley -f": "needs systemd's journal (and never ends)",
    "docker build -t parley .": "needs docker; tests/test_deploy.py checks the Dockerfile",
    "docker run -d --name parley -v parley-data:/home/parley/.parley -e PARLEY_MODEL "
    "-e PARLEY_API_KEY -e PARLEY_API_BASE -e PARLEY_LOCAL_TOKEN -e PARLEY_WEBCHAT_TOKEN "
    "-p 127.0.0.1:8765:8765 -p 127.0.0.1:8766:8766 parley": "needs docker (as above)",
}
"""Commands not run here, each with why; normalised as ``_key`` makes them."""

STOP_GATEWAY = "systemctl --user stop parley"
"""Its comment says "or Ctrl-C where it runs": here, SIGINT to the ``make run`` started above."""

EXPECT = {
    "parley --version": "parley ",
    "parley chat -m hello": "echo: hello",
    "parley doctor": "all checks passed",
    "parley cron list": "standup",
    "parley backup --to ~/parley-copy.db": "message(s)",
}
"""What a command's output must contain besides exiting 0."""


@dataclass
class Command:
    text: str
    """As written (continuations joined), what the shell runs."""
    key: str
    """Without its trailing comment, whitespace collapsed: what ``NOT_RUN`` is keyed by."""


def sh_blocks(readme: str) -> list[list[Command]]:
    """Every fenced ``sh`` block (indented ones in lists too), as commands."""
    blocks = []
    for match in re.finditer(r"^( *)```sh\n(.*?)^\1```", readme, re.M | re.S):
        lines = [line.removeprefix(match.group(1)) for line in match.group(2).splitlines()]
        text = re.sub(r"\\\n\s*", " ", "\n".join(lines))
        commands = []
        for line in text.splitlines():
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            key = " ".join(re.sub(r"\s+#\s.*$", "", line).split())
            commands.append(Command(line, key))
        blocks.append(commands)
    return blocks


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _shell_env(home: Path, llm: ScriptedLLM, ports: dict[str, int]) -> dict[str, str]:
    path = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep)
                           if not Path(p, "parley").exists())
    env = {k: v for k, v in os.environ.items()
           if not (k.endswith("_API_KEY") or k.startswith(("PARLEY_", "VIRTUAL_ENV", "MAKE")))}
    env.update(HOME=str(home), PATH=path, PARLEY_MODEL="openai/test-model",
               PARLEY_API_BASE=llm.base_url, PARLEY_LOCAL_PORT=str(ports["8765"]),
               PARLEY_WEBCHAT_PORT=str(ports["8766"]), NO_COLOR="1", USER="parley-test")
    env.pop("PYTEST_CURRENT_TEST", None)
    return env


def _fresh_clone(tmp_path: Path) -> Path:
    clone = tmp_path / "parley"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    assert (VENV / ".installed").exists(), f"{VENV} was not made by `make install`"
    (clone / ".venv").symlink_to(VENV)
    for name in ("pyproject.toml", "constraints.txt"):  # older than the install: make keeps it
        os.utime(clone / name, (0, 0))
    return clone


def _check_not_run(command: Command, clone: Path, env: dict[str, str]) -> None:
    syntax = subprocess.run(["bash", "-n", "-c", command.text], capture_output=True)
    assert syntax.returncode == 0, (command.text, syntax.stderr)
    for part in re.split(r"&&|;", command.key):
        words = part.split()
        if words[:1] == ["make"]:
            dry = subprocess.run(["make", "-n", *words[1:]], cwd=clone, env=env,
                                 capture_output=True, text=True)
            assert dry.returncode == 0, (part, dry.stderr)
        elif words[:1] == ["parley"]:
            args = [w for w in words[1:] if not w.startswith("-") and w != "."]
            subcommand = []
            for word in args:  # the command path ends where the arguments begin
                probe = subprocess.run([str(VENV / "bin" / "parley"), *subcommand, word,
                                        "--help"], capture_output=True, text=True, env=env)
                if probe.returncode != 0:
                    break
                subcommand.append(word)
            helped = subprocess.run([str(VENV / "bin" / "parley"), *subcommand, "--help"],
                                    capture_output=True, text=True,
                                    env={**env, "COLUMNS": "200"})
            assert helped.returncode == 0, (part, helped.stderr)
            for option in (w.split("=")[0] for w in words if w.startswith("--")):
                assert option in helped.stdout, (option, part)


async def _sandbox_here() -> bool:
    """Whether ``exec``'s sandbox can be made on this machine (``parley doctor`` checks it)."""
    from agent.tools.exec_access import GatewayFiles, resolve_exec_access
    from gateway.kernel.config import parse_config

    config = parse_config({}, env={})
    access = await resolve_exec_access(config.agent.tools.exec, GatewayFiles.of(config))
    return access.state == "sandboxed"


class Gateway:
    """``make run`` in the background, stopped with SIGINT like Ctrl-C."""

    def __init__(self, clone: Path, env: dict[str, str], log: Path) -> None:
        self.log = log
        with log.open("wb") as out:
            self.proc = subprocess.Popen(["make", "run"], cwd=clone, env=env,
                                         start_new_session=True, stdin=subprocess.DEVNULL,
                                         stdout=out, stderr=subprocess.STDOUT)

    async def healthy(self, port: int) -> None:
        async def up() -> bool:
            try:
                async with aiohttp.ClientSession() as http, \
                        http.get(f"http://127.0.0.1:{port}/v1/health") as resp:
                    return resp.status == 200
            except aiohttp.ClientError:
                return False

        async with asyncio.timeout(60):
            while not await up():
                assert self.proc.poll() is None, self.log.read_text()
                await asyncio.sleep(0.05)

    async def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
            try:
                await asyncio.wait_for(asyncio.to_thread(self.proc.wait), 30)
            except TimeoutError:
                os.killpg(self.proc.pid, signal.SIGKILL)
                await asyncio.to_thread(self.proc.wait)
        assert "Traceback" not in self.log.read_text(), self.log.read_text()


async def test_readme_commands_work_verbatim(tmp_path: Path, llm: ScriptedLLM) -> None:
    llm.echo()
    readme = (ROOT / "README.md").read_text()
    blocks = sh_blocks(readme)
    assert len(blocks) >= 10
    written = {c.key for block in blocks for c in block}
    assert set(NOT_RUN) <= written, f"listed but gone from the README: {set(NOT_RUN) - written}"
    clone = _fresh_clone(tmp_path)
    home = tmp_path / "home"
    home.mkdir()
    ports = {"8765": _free_port(), "8766": _free_port()}
    env = _shell_env(home, llm, ports)
    assert shutil.which("parley", path=env["PATH"]) is None  # not before the README says so
    sandbox = await _sandbox_here()
    prelude = ""
    gateway: Gateway | None = None
    ran: list[str] = []
    try:
        for block in blocks:
            exports = ""  # a block's `export` lines hold for its later commands
            for command in block:
                if command.key in NOT_RUN:
                    _check_not_run(command, clone, env)
                    continue
                if command.key == STOP_GATEWAY:
                    assert gateway is not None
                    await gateway.stop()
                    continue
                if command.key == "make run":
                    gateway = Gateway(clone, env, tmp_path / "make-run.log")
                    await gateway.healthy(ports["8765"])
                    assert (home / ".parley" / "config.yaml").is_file()
                    ran.append(command.key)
                    continue
                text = command.text
                for written_port, port in ports.items():
                    text = re.sub(rf"\b{written_port}\b", str(port), text)
                done = await asyncio.to_thread(
                    subprocess.run, ["bash", "-e", "-c", prelude + exports + text], cwd=clone,
                    env=env,
                    stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
                said = done.stdout + done.stderr
                if command.key == "parley doctor" and not sandbox:
                    # No sandbox can be made on this machine: that, and only that, fails.
                    assert done.returncode == 1 and done.stdout.count("FAIL ") == 1, said
                    assert "FAIL  sandbox: off" in done.stdout, said
                    ran.append(command.key)
                    continue
                assert done.returncode == 0, f"`{command.text}` failed:\n{said}"
                assert "Traceback" not in said, said
                if expected := EXPECT.get(command.key):
                    assert expected in done.stdout, f"`{command.text}`:\n{said}"
                if command.key.startswith("echo "):
                    assert done.stdout.strip(), f"`{command.text}` printed nothing"
                if command.key.startswith(". .venv/bin/activate"):
                    prelude = ". .venv/bin/activate\n"
                if command.key.startswith("export "):
                    exports += text + "\n"
                ran.append(command.key)
                if command.key.startswith("curl -s 'localhost:8765/v1/messages"):
                    reply = json.loads(done.stdout)["messages"][0]
                    assert reply["text"] == "echo: hello" and reply["kind"] == "reply"
    finally:
        if gateway is not None:
            await gateway.stop()
    # The quick start's path, in order, and the restore brought the backup back.
    for needed in ("make run", ". .venv/bin/activate", "parley chat -m hello", "make chat",
                   "parley doctor", "parley backup"):
        assert needed in ran, needed
    assert ran.index("make run") < ran.index("parley chat -m hello")
    code = await asyncio.to_thread(
        subprocess.run, [str(VENV / "bin" / "parley"), "sessions", "list"], env=env,
        capture_output=True, text=True)
    assert code.returncode == 0 and "local:c1" in code.stdout, code.stdout + code.stderr
    await until(lambda: llm.calls >= 3, "the model answered the README's messages")


def test_package_data_is_shipped() -> None:
    """What ``pip install .`` / ``pipx install .`` must carry besides modules: every
    non-Python file inside a package is matched by ``tool.setuptools.package-data``."""
    import fnmatch
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    data = project["tool"]["setuptools"]["package-data"]
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.split()
    missing = []
    for name in tracked:
        package, _, rest = name.partition("/")
        if package in ("gateway", "channels", "agent", "workspace") and rest and \
                not name.endswith(".py"):
            patterns = data.get(package, [])
            if not any(fnmatch.fnmatch(rest, p) for p in patterns):
                missing.append(name)
    assert missing == []
    for needed in ("channels/webchat_static/index.html", "workspace/templates/SOUL.md"):
        assert needed in tracked
