"""File tools: read, write, edit and list files in the workspace.

Every path goes through ``resolve_in_workspace``, the one guard that keeps the model inside the
workspace (``..``, absolute paths and symlinks leading out are refused). The tools then work on
the resolved path, so a symlink is never followed a second time. Disk work runs in a thread so a
big file never blocks the event loop.
"""

from __future__ import annotations

import asyncio
import io
import os
from pathlib import Path
from typing import BinaryIO

from agent.tools.base import ToolError, ToolRetry, tool
from agent.turn import TurnContext
from gateway.kernel.inbox_files import chat_folder

MAX_LIST_ENTRIES = 500
_SNIFF_BYTES = 8192
_CHUNK_CHARS = 64 * 1024


def resolve_in_workspace(workspace: Path, path: str, *, restrict: bool = True) -> Path:
    """The real (symlink-free) absolute path for ``path``; relative paths start at the workspace.

    With ``restrict`` the result must lie inside the workspace, checked after every symlink is
    followed (also a dangling one, or one in the parent of a file not yet written).
    """
    if "\0" in path:
        raise ToolRetry(f"path {path!r} contains a NUL byte; send a plain file path")
    if not path.strip():
        raise ToolRetry("path is empty; send a file path relative to the workspace")
    try:
        root = workspace.expanduser().resolve()
        given = root / Path(path).expanduser()
        target = given.resolve()
    except (RuntimeError, OSError) as exc:  # unknown ~user, symlink loop
        raise ToolRetry(f"cannot use path {path!r}: {exc}") from None
    if restrict and not target.is_relative_to(root):
        hint = "" if target == Path(os.path.abspath(given)) \
            else f" (it resolves to {target} through a symlink)"
        raise ToolRetry(f"path {path!r} is outside the workspace {root}{hint}; "
                        "only files inside the workspace can be used")
    return target


PUBLIC_FOLDERS = frozenset({"skills", "shared"})
"""The workspace is the owner's: anyone else's file tools reach only these folders at its top
(the skills, and whatever the owner puts in ``shared/`` for everyone), and the inbox folder of
the chat the turn is in (``inbox/<channel>/<chat>/``: the files sent in that chat, which its
people saw anyway; never another chat's). MEMORY.md, USER.md, ``memory/`` and the owner's
other files stay out of their reach (the memory tool reads a person's own notes for them)."""


def resolve_for(ctx: TurnContext, path: str, *, restrict: bool = False) -> Path:
    """``path`` for this turn's sender: anyone but the owner stays inside the workspace's
    public folders, whatever ``restrict_to_workspace`` says (``restrict``: the owner stays in
    the workspace too)."""
    owner = ctx.access.trust == "owner"
    restrict = restrict or ctx.tools.files.restrict_to_workspace or not owner
    target = resolve_in_workspace(ctx.workspace, path, restrict=restrict)
    if not owner:
        rel = target.relative_to(ctx.workspace.expanduser().resolve())
        own = chat_folder(ctx.message.channel, ctx.message.chat_id)
        if not (rel.parts and rel.parts[0] in PUBLIC_FOLDERS) and \
                rel.parts[:len(own.parts)] != own.parts:
            raise ToolError(f"{path} is private to the owner; in this conversation only "
                            f"{', '.join(sorted(f'{f}/' for f in PUBLIC_FOLDERS))} and {own}/ "
                            "of the workspace can be opened")
    return target


_resolve = resolve_for


def skill_file(ctx: TurnContext, path: str) -> Path | None:
    """An absolute ``path`` inside a skill folder outside the workspace (as the skills list
    shows it): readable by anyone who may read files, like the workspace's ``skills/``."""
    if not ctx.services.skill_folders or not Path(path).is_absolute() or "\0" in path:
        return None
    try:
        target = Path(path).resolve()
    except (RuntimeError, OSError):
        return None
    for folder in ctx.services.skill_folders:
        try:
            root = folder.expanduser().resolve()
        except (RuntimeError, OSError):
            continue
        if target.is_relative_to(root) and target != root:
            return target
    return None


def _is_binary(head: bytes) -> bool:
    return b"\0" in head


def _read_line(stream: io.TextIOWrapper, keep: int) -> tuple[str, bool] | None:
    """The next line without its newline, at most ``keep`` characters of it, and whether it was
    cut; a long line is read in pieces so one huge line cannot fill memory. None at the end."""
    piece = stream.readline(_CHUNK_CHARS)
    if not piece:
        return None
    kept, length = piece[:keep], len(piece)
    while not piece.endswith("\n"):
        piece = stream.readline(_CHUNK_CHARS)
        if not piece:
            break
        length += len(piece)
        if len(kept) < keep:
            kept += piece[: keep - len(kept)]
    length -= len(piece) - len(piece.rstrip("\r\n"))
    return kept.rstrip("\r\n"), length > keep


def _count_lines(raw: BinaryIO) -> int:
    raw.seek(0)
    count, last = 0, b"\n"
    while chunk := raw.read(1 << 20):
        count += chunk.count(b"\n")
        last = chunk[-1:]
    return count + (last != b"\n")


def _read_text(target: Path, shown: str, offset: int, limit: int | None, max_chars: int) -> str:
    with target.open("rb") as raw:
        if _is_binary(raw.read(_SNIFF_BYTES)):
            raise ToolRetry(f"{shown} looks like a binary file; read_file only reads text")
        total = _count_lines(raw)
        if total == 0:
            return f"({shown} is empty)"
        if offset > total:
            raise ToolRetry(f"offset {offset} is past the end of {shown} ({total} lines)")
        raw.seek(0)
        stream = io.TextIOWrapper(raw, encoding="utf-8", errors="replace", newline="\n")
        for _ in range(offset - 1):
            _read_line(stream, 0)
        out: list[str] = []
        used, lineno, note = 0, offset - 1, ""
        while limit is None or len(out) < limit:
            line = _read_line(stream, max_chars)
            if line is None:
                break
            text, cut = line
            numbered = f"{lineno + 1:>6}\t{text}"
            if out and used + len(numbered) + 1 > max_chars:
                note = f"output capped at {max_chars} characters"
                break
            lineno += 1
            if cut or len(numbered) > max_chars:
                numbered = numbered[:max_chars]
                note = f"line {lineno} is longer than {max_chars} characters and was cut"
                out.append(numbered)
                break
            out.append(numbered)
            used += len(numbered) + 1
    body = "\n".join(out)
    if lineno < total:
        reason = f"{note}; " if note else ""
        body += (f"\n[{reason}showing lines {offset}-{lineno} of {total}; call read_file with "
                 f"offset={lineno + 1} to read the rest]")
    return body


@tool(group="files")
async def read_file(ctx: TurnContext, path: str, offset: int = 1,
                    limit: int | None = None) -> str:
    """Read a workspace text file. Each line starts with its number and a tab (not part of
    the file); a long file is cut, the note at the end names the offset to read next.

    Args:
        path: relative to the workspace.
        offset: first line to return (1-based).
        limit: most lines to return.
    """
    if offset < 1:
        raise ToolRetry("offset is the 1-based number of the first line; use 1 or more")
    if limit is not None and limit < 1:
        raise ToolRetry("limit must be 1 or more (or left out)")
    target = skill_file(ctx, path) or _resolve(ctx, path)
    if target.is_dir():
        raise ToolRetry(f"{path} is a directory; use list_dir to see what it holds")
    if not target.is_file():
        raise ToolRetry(f"file not found: {path}")
    return await asyncio.to_thread(_read_text, target, path, offset, limit,
                                   ctx.tools.files.max_read_chars)


def _write(target: Path, data: bytes) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)


@tool(group="files")
async def write_file(ctx: TurnContext, path: str, content: str) -> str:
    """Write a workspace file (replaced if it exists; folders made).

    Args:
        path: relative to the workspace.
        content: the whole new content.
    """
    target = _resolve(ctx, path)
    if target.is_dir():
        raise ToolRetry(f"{path} is a directory; give a file path")
    existed = target.exists()
    data = content.encode("utf-8")
    await asyncio.to_thread(_write, target, data)
    return f"{'Overwrote' if existed else 'Created'} {path} ({len(data)} bytes written)"


def _edit(target: Path, shown: str, old: str, new: str, replace_all: bool) -> int:
    raw = target.read_bytes()
    if _is_binary(raw[:_SNIFF_BYTES]):
        raise ToolRetry(f"{shown} looks like a binary file; edit_file only edits text")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ToolRetry(f"{shown} is not UTF-8 text; it cannot be edited safely") from None
    count = text.count(old)
    if count == 0 and "\r\n" in text and "\n" in old and "\r\n" not in old:
        old, new = old.replace("\n", "\r\n"), new.replace("\n", "\r\n")
        count = text.count(old)
    if count == 0:
        raise ToolRetry(f"old_text was not found in {shown}; read the file and copy the text "
                        "exactly, including whitespace (without the line numbers)")
    if count > 1 and not replace_all:
        raise ToolRetry(f"old_text occurs {count} times in {shown}; include more surrounding "
                        "lines to make it unique, or pass replace_all=true")
    target.write_bytes(text.replace(old, new).encode("utf-8"))
    return count


@tool(group="files")
async def edit_file(ctx: TurnContext, path: str, old_text: str, new_text: str,
                    replace_all: bool = False) -> str:
    """Replace exact text in a workspace file.

    Args:
        path: relative to the workspace.
        old_text: the exact text, as in the file (no line numbers).
        new_text: its replacement.
        replace_all: every occurrence; else old_text must occur once.
    """
    if not old_text:
        raise ToolRetry("old_text is empty; give the exact text to replace")
    if old_text == new_text:
        raise ToolRetry("old_text and new_text are the same; nothing would change")
    target = _resolve(ctx, path)
    if target.is_dir():
        raise ToolRetry(f"{path} is a directory; give a file path")
    if not target.is_file():
        raise ToolRetry(f"file not found: {path}")
    count = await asyncio.to_thread(_edit, target, path, old_text, new_text, replace_all)
    return f"Edited {path}: replaced {count} occurrence{'s' if count != 1 else ''}"


def _size(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    size = n / 1024
    for unit in ("KiB", "MiB", "GiB"):
        if size < 1024:
            return f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"


def _describe(entry: os.DirEntry[str]) -> str:
    link = f" -> {os.readlink(entry.path)}" if entry.is_symlink() else ""
    try:
        if entry.is_dir():
            return f"{entry.name}/{link}"
        return f"{entry.name}{link}  ({_size(entry.stat().st_size)})"
    except OSError:
        return f"{entry.name}{link}  (unreadable)"


def _list(target: Path) -> tuple[list[str], int]:
    """The first ``MAX_LIST_ENTRIES`` entries by name, described, and how many there are."""
    with os.scandir(target) as it:
        entries = sorted(it, key=lambda e: e.name)
    return [_describe(e) for e in entries[:MAX_LIST_ENTRIES]], len(entries)


@tool(group="files")
async def list_dir(ctx: TurnContext, path: str = ".") -> str:
    """List a workspace folder (folders end with "/", files show their size).

    Args:
        path: relative to the workspace.
    """
    target = _resolve(ctx, path)
    if not target.exists():
        raise ToolRetry(f"folder not found: {path}")
    if not target.is_dir():
        raise ToolRetry(f"{path} is a file, not a folder; use read_file to read it")
    lines, total = await asyncio.to_thread(_list, target)
    if not lines:
        return f"({path} is empty)"
    if total > len(lines):
        lines.append(f"[... {total - len(lines)} more entries not shown]")
    return "\n".join(lines)


FILE_TOOLS = [read_file, write_file, edit_file, list_dir]
