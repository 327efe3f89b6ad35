"""The ``parley`` command as a user runs it: real subprocesses, the scripted model on loopback."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from tests.fakes.openai_server import ScriptedLLM

PARLEY = str(Path(sys.executable).parent / "parley")


def write_config(tmp_path: Path, llm: ScriptedLLM | None, **agent: Any) -> Path:
    data: dict[str, Any] = {
        "workspace": "ws", "data_dir": "data",
        "agent": {"model": "openai/test-model", "retry_backoff": "0.01s", **agent},
        "channels": {"local": {"port": 0}},
    }
    if llm is not None:
        data["agent"].update(api_base=llm.base_url, api_key="sk-test")
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    env.update(LITELLM_LOCAL_MODEL_COST_MAP="True", NO_COLOR="1", COLUMNS="200", **extra)
    return env


async def parley(*args: str, env: dict[str, str] | None = None,
                 stdin: bytes | None = None) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        PARLEY, *args, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env=env or _env())
    out, err = await asyncio.wait_for(proc.communicate(stdin), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_config_check_ok(tmp_path: Path, llm: ScriptedLLM) -> None:
    code, out, _ = await parley("config", "check", "--config", str(write_config(tmp_path, llm)))
    assert code == 0
    assert out.splitlines()[0] == "ok"
    assert "openai/test-model" in out and str(tmp_path / "ws") in out
    assert "posted directly (OpenAI-compatible)" in out


async def test_config_check_names_each_bad_key(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("agent:\n  modle: x\n  max_iterations: -1\n  timeout: soon\n"
                    "channels:\n  local:\n    token: ${NOT_SET_ANYWHERE}\n")
    code, out, err = await parley("config", "check", "--config", str(path))
    assert code == 2 and out == ""
    assert "channels.local.token: environment variable NOT_SET_ANYWHERE is not set" in err
    path.write_text("agent:\n  modle: x\n  max_iterations: -1\n  timeout: soon\n")
    code, _, err = await parley("config", "check", "--config", str(path))
    assert code == 2
    assert "agent.modle: unknown key" in err
    assert "agent.max_iterations: Input should be greater than 0" in err
    assert "agent.timeout: 'soon' is not a duration" in err
    assert "Traceback" not in err


async def test_config_errors_for_missing_file_and_bad_yaml(tmp_path: Path) -> None:
    code, _, err = await parley("config", "check", "--config", str(tmp_path / "nope.yaml"))
    assert code == 2 and "file not found" in err and "parley onboard" in err
    bad = tmp_path / "bad.yaml"
    bad.write_text("agent: [unclosed\n")
    code, _, err = await parley("config", "check", "--config", str(bad))
    assert code == 2 and "not valid YAML" in err and "line" in err


async def test_chat_one_message(tmp_path: Path, llm: ScriptedLLM) -> None:
    llm.reply("Hello from the **model**.")
    config = write_config(tmp_path, llm)
    code, out, err = await parley("chat", "-m", "hello", "--config", str(config))
    assert code == 0, err
    assert "Hello from the **model**." in out
    runtime = llm.last_request["messages"][-2]["content"]
    assert "Channel: terminal" in runtime
    assert (tmp_path / "ws" / "SOUL.md").exists()  # a missing workspace is created

    # The same session store as the gateway: the next message sees the first in history.
    llm.reply("again")
    code, out, _ = await parley("chat", "-m", "and again", "--config", str(config))
    assert code == 0 and "again" in out
    contents = [m.get("content") for m in llm.last_request["messages"]]
    assert "hello" in contents and "Hello from the **model**." in contents

    code, out, _ = await parley("sessions", "list", "--config", str(config))
    assert code == 0 and "terminal:terminal" in out
    code, out, _ = await parley("sessions", "export", "terminal:terminal", "--config",
                                str(config))
    lines = [json.loads(line) for line in out.splitlines()]
    assert [(m["role"], m["content"]) for m in lines] == [
        ("user", "hello"), ("assistant", "Hello from the **model**."),
        ("user", "and again"), ("assistant", "again")]
    assert all(m["tokens"] > 0 for m in lines)
    code, out, _ = await parley("context", "show", "terminal:terminal", "--config", str(config))
    assert code == 0 and "SOUL.md" in out and "history" in out


async def test_chat_without_api_key_explains(tmp_path: Path) -> None:
    config = write_config(tmp_path, None)
    code, out, err = await parley("chat", "-m", "hello", "--config", str(config))
    assert code == 1
    assert "OPENAI_API_KEY" in out and "agent.api_key" in out
    assert "Traceback" not in out + err


async def test_interactive_chat(tmp_path: Path, llm: ScriptedLLM) -> None:
    llm.reply("first").reply("second")
    config = write_config(tmp_path, llm)
    code, out, err = await parley("chat", "--plain", "--config", str(config),
                                  stdin=b"one\n\ntwo\n/exit\n")
    assert code == 0, err
    assert out.index("first") < out.index("second")
    assert llm.calls == 2


async def test_onboard_writes_a_working_setup(tmp_path: Path) -> None:
    code, out, _ = await parley("onboard", "--dir", str(tmp_path / "home"),
                                "--non-interactive", "--skip-test")
    assert code == 0
    config = tmp_path / "home" / "config.yaml"
    for name in ("SOUL.md", "IDENTITY.md", "AGENTS.md", "USER.md", "TOOLS.md", "HEARTBEAT.md",
                 "MEMORY.md"):
        assert (tmp_path / "home" / "workspace" / name).is_file(), name
    assert list((tmp_path / "home" / "workspace" / "skills").glob("*/SKILL.md"))
    code, out, err = await parley("config", "check", "--config", str(config))
    assert code == 0, err
    (tmp_path / "home" / "workspace" / "SOUL.md").write_text("mine")
    code, out, _ = await parley("onboard", "--dir", str(tmp_path / "home"))
    assert "kept" in out
    assert (tmp_path / "home" / "workspace" / "SOUL.md").read_text() == "mine"


async def test_gateway_process_serves_and_stops_on_sigterm(tmp_path: Path,
                                                           llm: ScriptedLLM) -> None:
    llm.reply("hi from the gateway")
    config = write_config(tmp_path, llm)
    proc = await asyncio.create_subprocess_exec(
        PARLEY, "gateway", "--config", str(config), stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env=_env())
    assert proc.stderr is not None
    try:
        base = None
        log: list[str] = []
        while base is None:
            line = (await asyncio.wait_for(proc.stderr.readline(), 30)).decode()
            assert line, "gateway exited early:\n" + "".join(log)
            log.append(line)
            if m := re.search(r"listening on (http://\S+)", line):
                base = m.group(1)
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{base}/v1/health") as resp:
                assert (await resp.json())["status"] == "ok"
            body = {"chat_id": "c1", "sender_id": "u1", "text": "hello"}
            async with session.post(f"{base}/v1/messages", json=body) as resp:
                assert resp.status == 202
            async with session.get(f"{base}/v1/messages",
                                   params={"chat_id": "c1", "wait": "20"}) as resp:
                data = await resp.json()
        assert data["messages"][0]["text"] == "hi from the gateway"
        proc.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(proc.communicate(), 20)
        assert proc.returncode == 0, err.decode()
        assert "Traceback" not in err.decode()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_status_says_how_exec_runs_and_why_not(tmp_path: Path) -> None:
    def exec_line(out: str) -> str:
        [line] = [line for line in out.splitlines() if line.startswith("exec:")]
        return line

    missing = {"sandbox": {"bwrap": str(tmp_path / "no-bwrap")}}
    for name, exec_config, expected in [
        ("off", missing, "exec:     off — bubblewrap not found ('"),
        ("unsafe", {**missing, "dangerously_run_unsandboxed": True}, "exec:     UNSANDBOXED — "),
        ("sandboxed", {}, "exec:     sandboxed (bubblewrap "),
    ]:
        if name == "sandboxed" and shutil.which("bwrap") is None:
            continue  # `make test` installs it; without it the first case is what you get
        (tmp_path / name).mkdir()
        config = write_config(tmp_path / name, None, tools={"exec": exec_config})
        code, out, err = await parley("status", "--config", str(config))
        assert code == 1, err  # no gateway runs
        assert exec_line(out).startswith(expected), out


@pytest.mark.parametrize("args", [["status"], ["sessions", "list"]])
async def test_commands_without_a_config_fail_clearly(tmp_path: Path, args: list[str]) -> None:
    code, _, err = await parley(*args, env=_env(HOME=str(tmp_path)))
    assert code == 2 and "file not found" in err
