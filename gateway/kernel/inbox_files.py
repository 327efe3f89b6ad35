"""Where received files live: ``inbox/<channel>/<chat>/<safe name>`` inside the workspace.

Every channel (Telegram, Discord, the local channel's uploads, WebChat) saves what people send
there, so the agent's file tools can open it; the agent lets a person who is not the owner read
their own chat's folder (``agent/tools/files.py``) and nothing else of the inbox. Channel and
chat ids become one folder name each: characters outside ``[A-Za-z0-9_.-]`` are replaced, and a
short hash of the original is added whenever anything was replaced, so two different chats
never share a folder.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from pathlib import Path, PurePosixPath

INBOX_DIR = "inbox"
MAX_NAME_CHARS = 80
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def _part(value: str) -> str:
    """One folder name for a channel or chat id: safe, and distinct for distinct ids."""
    clean = _UNSAFE.sub("_", value).strip("._-")[:60] or "_"
    if clean != value:
        clean += "-" + hashlib.sha256(value.encode()).hexdigest()[:8]
    return clean


def chat_folder(channel: str, chat_id: str) -> PurePosixPath:
    """``inbox/<channel>/<chat>``, relative to the workspace."""
    return PurePosixPath(INBOX_DIR, _part(channel), _part(chat_id))


def inbox_path(workspace: Path, channel: str, chat_id: str) -> Path:
    """The folder a chat's received files go to (not created here)."""
    return workspace / chat_folder(channel, chat_id)


def safe_name(name: str | None, *, fallback_suffix: str = ".bin") -> str:
    """A file name safe on any system, at most ``MAX_NAME_CHARS`` long, its extension kept;
    a random one when nothing usable is left."""
    base = PurePosixPath((name or "").replace("\\", "/")).name
    clean = _UNSAFE.sub("_", base).strip("._")
    if not clean:
        return f"{uuid.uuid4().hex}{fallback_suffix}"
    if len(clean) > MAX_NAME_CHARS:
        stem, dot, suffix = clean.rpartition(".")
        clean = (stem[:MAX_NAME_CHARS - 10] + dot + suffix[:9]) if dot and len(suffix) < 10 \
            else clean[:MAX_NAME_CHARS]
    return clean


def unique_path(folder: Path, name: str) -> Path:
    """``folder/name``, or ``folder/<stem>-<n><suffix>`` when that is taken (blocking)."""
    target = folder / name
    stem, suffix = target.stem, target.suffix
    n = 1
    while target.exists():
        n += 1
        target = folder / f"{stem}-{n}{suffix}"
    return target


def save_file(folder: Path, name: str, data: bytes) -> Path:
    """``data`` under a safe form of ``name`` in ``folder`` (a new name when it is taken);
    blocking: run it in a thread."""
    while True:
        folder.mkdir(parents=True, exist_ok=True)
        path = unique_path(folder, safe_name(name))
        try:
            with open(path, "xb") as fh:
                fh.write(data)
        except (FileExistsError, FileNotFoundError):  # taken meanwhile; an emptied folder
            continue  # removed by the cleanup
        return path
