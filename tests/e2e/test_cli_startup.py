"""What stops a start is said in one line naming the key or file, never as a traceback:
a busy port, a workspace or data folder that is a file or cannot be made, a corrupt or locked
database; ``config check`` finds the path problems first. And ``parley backup``."""

from __future__ import annotations

import re
import socket
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.e2e.test_cli import parley, write_config
from tests.fakes.openai_server import ScriptedLLM

LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ (DEBUG|INFO|WARNING) ")


def _edit(config: Path, **top: object) -> str:
    data = yaml.safe_load(config.read_text())
    for key, value in top.items():
        section, _, name = key.partition("__")
        if name:
            data.setdefault("channels", {}).setdefault(section, {})[name] = value
        else:
            data[key] = value
    config.write_text(yaml.safe_dump(data))
    return str(config)


def _one_line(err: str) -> str:
    """The one line said, besides the log's own lines (``2025-01-31 12:00:00,000 INFO …``)."""
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip() and not LOG_LINE.match(line)]
    assert len(lines) == 1, err
    return lines[0]


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


async def test_busy_port_is_one_line(tmp_path: Path, llm: ScriptedLLM, busy_port: int) -> None:
    config = _edit(write_config(tmp_path, llm), local__port=busy_port)
    code, _, err = await parley("gateway", "--config", config)
    assert code == 2
    line = _one_line(err)
    assert f"channels.local.port: 127.0.0.1:{busy_port} is already in use" in line
    assert "set channels.local.port to a free port" in line


@pytest.mark.parametrize("case", ["workspace_file", "workspace_uncreatable", "data_file",
                                  "workspace_in_proc"])
async def test_bad_paths_are_found_by_config_check_and_at_start(
        tmp_path: Path, llm: ScriptedLLM, case: str) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    key, value, expected = {
        "workspace_file": ("workspace", blocker, f"workspace: {blocker} is a file, not a folder"),
        "workspace_uncreatable": ("workspace", blocker / "ws",
                                  f"workspace: cannot create {blocker / 'ws'}: {blocker} is a "
                                  "file"),
        "data_file": ("data_dir", blocker, f"data_dir: {blocker} is a file, not a folder"),
        "workspace_in_proc": ("workspace", Path("/proc/parley-ws"),
                              "workspace: cannot create /proc/parley-ws: nothing can be made "
                              "in /proc"),
    }[case]
    config = _edit(write_config(tmp_path, llm), **{key: str(value)})
    code, out, err = await parley("config", "check", "--config", config)
    assert code == 2 and out == ""
    assert expected in err and "Traceback" not in err
    for command in ("gateway", "chat"):
        args = [command, "--config", config] + (["-m", "hi"] if command == "chat" else [])
        code, _, err = await parley(*args)
        assert code == 2
        assert expected in _one_line(err)
    assert not (tmp_path / "ws").exists()  # nothing half made before the refusal


async def test_corrupt_database_is_one_line(tmp_path: Path, llm: ScriptedLLM) -> None:
    config = str(write_config(tmp_path, llm))
    (tmp_path / "data").mkdir()
    db = tmp_path / "data" / "parley.db"
    db.write_bytes(b"this is no database" * 100)
    code, _, err = await parley("config", "check", "--config", config)
    assert code == 2 and f"data_dir: {db} is not a SQLite database" in err
    code, _, err = await parley("gateway", "--config", config)
    assert code == 2 and "backup" in _one_line(err)
    # a database whose header is right but whose pages are not: found when it is opened
    db.write_bytes(b"SQLite format 3\x00" + b"\xff" * 4000)
    for args in (["gateway"], ["sessions", "list"], ["backup"]):
        code, _, err = await parley(*args, "--config", config)
        assert code == 1, args
        line = _one_line(err)
        assert f"the database {db} is corrupt" in line and "backup" in line


async def test_locked_database_is_one_line(tmp_path: Path, llm: ScriptedLLM) -> None:
    config = str(write_config(tmp_path, llm))
    (tmp_path / "data").mkdir()
    db = tmp_path / "data" / "parley.db"
    holder = sqlite3.connect(db, check_same_thread=False)
    holder.execute("CREATE TABLE t (x)")
    holder.execute("BEGIN EXCLUSIVE")  # another process writing, and not letting go
    try:
        code, _, err = await parley("sessions", "list", "--config", config)
    finally:
        holder.rollback()
        holder.close()
    assert code == 1
    assert f"the database {db} is locked by another process" in _one_line(err)


async def test_backup_copies_a_live_database(tmp_path: Path, llm: ScriptedLLM) -> None:
    llm.reply("one").reply("two")
    config = str(write_config(tmp_path, llm))
    for text in ("a", "b"):
        code, _, err = await parley("chat", "-m", text, "--config", config)
        assert code == 0, err
    target = tmp_path / "copy.db"
    code, out, err = await parley("backup", "--to", str(target), "--config", config)
    assert code == 0, err
    assert f"to {target}" in out and "4 message(s)" in out
    with sqlite3.connect(target) as copy:
        rows = copy.execute("SELECT COUNT(*) FROM messages").fetchone()
    assert rows == (4,)
    code, _, err = await parley("backup", "--to", str(target), "--config", config)
    assert code == 1 and "exists" in err  # never overwrites a backup
    code, out, err = await parley("backup", "--config", config)
    assert code == 0, err
    assert len(list((tmp_path / "data" / "backups").glob("parley-*.db"))) == 1
