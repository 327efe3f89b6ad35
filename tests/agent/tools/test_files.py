"""File tools through the real registry, so refusals reach the model as "Error: ..." text."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from agent.tools.base import ToolRegistry, ToolRetry
from agent.tools.files import FILE_TOOLS, resolve_in_workspace
from agent.turn import TurnContext
from gateway.kernel.config import FileToolsConfig, ToolsConfig
from gateway.kernel.events import InboundMessage

REGISTRY = ToolRegistry(FILE_TOOLS)


def make_ctx(workspace: Path, **files: Any) -> TurnContext:
    return TurnContext(message=InboundMessage(channel="local", chat_id="c1", sender_id="u1",
                                              trust="owner",
                                              text="", received_at=datetime.now(UTC)),
                       session_id=1, workspace=workspace,
                       tools=ToolsConfig(files=FileToolsConfig(**files)))


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    path = tmp_path / "ws"
    path.mkdir()
    return path


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    path = tmp_path / "outside"
    path.mkdir()
    (path / "secret.txt").write_text("top secret\n")
    return path


async def call(ctx: TurnContext, name: str, **args: Any) -> tuple[str, bool]:
    result = await REGISTRY.execute(name, json.dumps(args), ctx)
    return result.text, result.is_error


async def test_write_read_edit_list_round_trip(ws: Path) -> None:
    ctx = make_ctx(ws)
    text, err = await call(ctx, "write_file", path="notes/todo.md", content="a\nb\nc\n")
    assert not err and "6 bytes" in text and "Created" in text
    assert (ws / "notes" / "todo.md").read_text() == "a\nb\nc\n"

    text, err = await call(ctx, "read_file", path="notes/todo.md")
    assert not err
    assert text.splitlines() == ["     1\ta", "     2\tb", "     3\tc"]

    text, err = await call(ctx, "edit_file", path="notes/todo.md", old_text="b\n", new_text="B\n")
    assert not err and "1 occurrence" in text
    assert (ws / "notes" / "todo.md").read_text() == "a\nB\nc\n"

    (ws / "big.bin").write_bytes(b"x" * 2048)
    text, err = await call(ctx, "list_dir")
    assert not err
    assert text.splitlines() == ["big.bin  (2.0 KiB)", "notes/"]
    text, _ = await call(ctx, "list_dir", path="notes")
    assert text == "todo.md  (6 B)"

    text, _ = await call(ctx, "write_file", path="notes/todo.md", content="é")
    assert "Overwrote" in text and "2 bytes" in text


async def test_read_pages_with_offset_and_limit(ws: Path) -> None:
    (ws / "f.txt").write_text("".join(f"line {i}\n" for i in range(1, 11)))
    text, err = await call(make_ctx(ws), "read_file", path="f.txt", offset=4, limit=2)
    assert not err
    lines = text.splitlines()
    assert lines[:2] == ["     4\tline 4", "     5\tline 5"]
    assert "offset=6" in lines[2] and "of 10" in lines[2]

    text, err = await call(make_ctx(ws), "read_file", path="f.txt", offset=11)
    assert err and "past the end" in text and "10 lines" in text


async def test_read_missing_file(ws: Path) -> None:
    text, err = await call(make_ctx(ws), "read_file", path="nope.md")
    assert err and text == "Error: file not found: nope.md"


async def test_read_refuses_binary(ws: Path) -> None:
    (ws / "img.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
    text, err = await call(make_ctx(ws), "read_file", path="img.png")
    assert err and "binary" in text


async def test_read_big_file_is_capped_with_marker(ws: Path) -> None:
    (ws / "big.txt").write_text("".join(f"{i:04d} " + "x" * 95 + "\n" for i in range(1, 2001)))
    ctx = make_ctx(ws, max_read_chars=10_000)
    text, err = await call(ctx, "read_file", path="big.txt")
    assert not err
    body, marker = text.rsplit("\n", 1)
    assert len(body) <= 10_000
    last = int(body.splitlines()[-1].split("\t")[0])
    assert 90 < last < 100
    assert "capped at 10000 characters" in marker and f"offset={last + 1}" in marker
    assert "of 2000" in marker

    text, _ = await call(ctx, "read_file", path="big.txt", offset=last + 1)
    assert text.startswith(f"{last + 1:>6}\t{last + 1:04d} ")


async def test_read_one_huge_line_is_cut(ws: Path) -> None:
    (ws / "min.js").write_text("x" * 300_000 + "\nsecond\n")
    text, err = await call(make_ctx(ws, max_read_chars=1000), "read_file", path="min.js")
    assert not err
    assert len(text.splitlines()[0]) == 1000
    assert "line 1 is longer than 1000 characters" in text and "offset=2" in text


async def test_edit_not_found_and_ambiguous(ws: Path) -> None:
    (ws / "f.txt").write_text("x = 1\nx = 1\ny = 2\n")
    ctx = make_ctx(ws)
    text, err = await call(ctx, "edit_file", path="f.txt", old_text="z = 3", new_text="z = 4")
    assert err and "not found" in text

    text, err = await call(ctx, "edit_file", path="f.txt", old_text="x = 1", new_text="x = 9")
    assert err and "2 times" in text and "replace_all" in text
    assert (ws / "f.txt").read_text() == "x = 1\nx = 1\ny = 2\n"

    text, err = await call(ctx, "edit_file", path="f.txt", old_text="x = 1", new_text="x = 9",
                           replace_all=True)
    assert not err and "2 occurrences" in text
    assert (ws / "f.txt").read_text() == "x = 9\nx = 9\ny = 2\n"

    text, err = await call(ctx, "edit_file", path="missing.txt", old_text="a", new_text="b")
    assert err and "not found: missing.txt" in text


async def test_edit_keeps_crlf_line_endings(ws: Path) -> None:
    (ws / "win.txt").write_bytes(b"one\r\ntwo\r\nthree\r\n")
    text, err = await call(make_ctx(ws), "edit_file", path="win.txt", old_text="one\ntwo",
                           new_text="1\n2")
    assert not err
    assert (ws / "win.txt").read_bytes() == b"1\r\n2\r\nthree\r\n"


async def test_list_dir_caps_entries(ws: Path) -> None:
    for i in range(520):
        (ws / f"f{i:03d}").touch()
    text, err = await call(make_ctx(ws), "list_dir")
    lines = text.splitlines()
    assert not err and len(lines) == 501
    assert lines[0] == "f000  (0 B)" and lines[-1] == "[... 20 more entries not shown]"


@pytest.mark.parametrize("tool_name, extra", [
    ("read_file", {}),
    ("write_file", {"content": "pwned"}),
    ("edit_file", {"old_text": "top", "new_text": "pwned"}),
    ("list_dir", {}),
])
@pytest.mark.parametrize("kind", ["dotdot", "absolute", "file_link", "dir_link", "parent_link"])
async def test_escapes_are_refused(ws: Path, outside: Path, tool_name: str,
                                   extra: dict[str, str], kind: str) -> None:
    (ws / "link.txt").symlink_to(outside / "secret.txt")
    (ws / "linkdir").symlink_to(outside, target_is_directory=True)
    is_dir_tool = tool_name == "list_dir"
    path = {
        "dotdot": "../outside" if is_dir_tool else "../outside/secret.txt",
        "absolute": str(outside) if is_dir_tool else str(outside / "secret.txt"),
        "file_link": "link.txt",
        "dir_link": "linkdir" if is_dir_tool else "linkdir/secret.txt",
        "parent_link": "linkdir/new" if is_dir_tool else "linkdir/new/file.txt",
    }[kind]
    text, err = await call(make_ctx(ws), tool_name, path=path, **extra)
    assert err
    assert "outside the workspace" in text and repr(path) in text
    assert (outside / "secret.txt").read_text() == "top secret\n"
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]


async def test_etc_passwd_is_refused(ws: Path) -> None:
    text, err = await call(make_ctx(ws), "read_file", path="/etc/passwd")
    assert err and "'/etc/passwd' is outside the workspace" in text
    assert "root:" not in text


async def test_dangling_symlink_leading_out_is_refused_for_writing(ws: Path,
                                                                   outside: Path) -> None:
    (ws / "trap.txt").symlink_to(outside / "created-by-model.txt")
    text, err = await call(make_ctx(ws), "write_file", path="trap.txt", content="x")
    assert err and "outside the workspace" in text and "through a symlink" in text
    assert not (outside / "created-by-model.txt").exists()


async def test_symlink_inside_workspace_is_allowed(ws: Path) -> None:
    (ws / "real").mkdir()
    (ws / "real" / "a.txt").write_text("hello\n")
    (ws / "alias").symlink_to(ws / "real", target_is_directory=True)
    text, err = await call(make_ctx(ws), "read_file", path="alias/a.txt")
    assert not err and text == "     1\thello"


async def test_restrict_false_allows_outside_paths(ws: Path, outside: Path) -> None:
    ctx = make_ctx(ws, restrict_to_workspace=False)
    text, err = await call(ctx, "read_file", path=str(outside / "secret.txt"))
    assert not err and "top secret" in text
    text, err = await call(ctx, "write_file", path="../outside/new.txt", content="ok")
    assert not err
    assert (outside / "new.txt").read_text() == "ok"


def test_resolve_in_workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = tmp_path / "real"
    (real / "ws").mkdir(parents=True)
    (tmp_path / "alias").symlink_to(real, target_is_directory=True)
    workspace = tmp_path / "alias" / "ws"  # the workspace itself under a symlinked folder
    assert resolve_in_workspace(workspace, "a/b.txt") == real / "ws" / "a" / "b.txt"
    assert resolve_in_workspace(workspace, "a/../c.txt") == real / "ws" / "c.txt"
    assert resolve_in_workspace(workspace, str(workspace / "d.txt")) == real / "ws" / "d.txt"
    with pytest.raises(ToolRetry, match="NUL"):
        resolve_in_workspace(workspace, "a\0b")
    with pytest.raises(ToolRetry, match="outside the workspace"):
        resolve_in_workspace(workspace, "~/x")

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert resolve_in_workspace(workspace, "~/x", restrict=False) == tmp_path / "home" / "x"
    assert resolve_in_workspace(workspace, "/etc/hosts", restrict=False) == \
        Path("/etc/hosts").resolve()
