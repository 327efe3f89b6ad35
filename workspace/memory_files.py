"""How memory files are written: an entry cleaned and keyed (so the same note is never saved
twice), appended under one lock per workspace, across processes too, and the file replaced
atomically.

Separate from ``memory.py`` so the durability rules read in one place, apart from the search.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

from workspace.memory_search import MARKER, split_paragraphs


def clean_entry(text: str) -> str:
    """The entry as written: trailing spaces and blank lines removed, so it stays one paragraph."""
    return "\n".join(line.rstrip() for line in text.strip().splitlines() if line.strip())


def entry_key(text: str) -> str:
    """What counts as the same entry: case, spacing, bullets and ``[HH:MM]`` stamps ignored."""
    return " ".join(" ".join(MARKER.sub("", line) for line in text.lower().splitlines()).split())


def entry_keys(text: str) -> set[str]:
    """The keys of every paragraph and line already in a file."""
    keys: set[str] = set()
    for _, chunk in split_paragraphs(text):
        keys.add(entry_key(chunk))
        keys.update(entry_key(line) for line in chunk.splitlines())
    return keys


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to a temporary file, fsync it and move it over ``path``: a reader sees
    the old file or the new one, never half of one."""
    target = path.resolve()  # through a symlink: replace its target, never the link itself
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        with contextlib.suppress(FileNotFoundError):
            os.chmod(tmp, target.stat().st_mode & 0o777)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


_WRITE_LOCKS: dict[Path, threading.Lock] = {}
_GUARD = threading.Lock()


@contextlib.contextmanager
def across_processes(root: Path) -> Iterator[None]:
    """An exclusive ``flock`` on the workspace folder itself (no lock file to show up in the
    agent's listings): the gateway and ``parley chat`` on one workspace append in turn, so
    neither's read-modify-write loses the other's note. Where flock is missing (Windows),
    only this process's own lock applies."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    fd = os.open(root, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def write_lock_for(root: Path) -> threading.Lock:
    """One lock per workspace, shared by every store on it: appends never interleave."""
    with _GUARD:
        return _WRITE_LOCKS.setdefault(root, threading.Lock())
