"""Whether anything in some folders changed since the last look, without a ``stat`` per file
per turn (issue 24): Linux's inotify, asked without waiting — one ``poll`` that finds nothing
when nothing changed, a ``read`` of the events when something did. An event is queued by the
kernel as the change is made, so a look after the change always sees it (no delay, no
thread). Elsewhere, or past inotify's limits, there is no watcher (``Watch.open`` returns
None) and callers ``stat`` as before.

Callers keep what they computed together with the ``generation`` read *before* they added
their folders (``cover``) and looked at the files: a change after that bumps the generation,
and the next look computes again.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import select
import struct
import sys
from pathlib import Path
from typing import Self

_log = logging.getLogger(__name__)

_IN_NONBLOCK = os.O_NONBLOCK
_IN_CLOEXEC = os.O_CLOEXEC
# what changes a folder's files or the folder itself (not reads, not opens)
_MASK = (0x2 | 0x4 | 0x8 | 0x40 | 0x80 | 0x100 | 0x200 | 0x400 | 0x800)
"""IN_MODIFY, IN_ATTRIB, IN_CLOSE_WRITE, IN_MOVED_FROM, IN_MOVED_TO, IN_CREATE, IN_DELETE,
IN_DELETE_SELF, IN_MOVE_SELF."""
_IN_IGNORED = 0x8000
"""The watch is gone (its folder deleted or moved, or the file system unmounted)."""
_EVENT = struct.Struct("iIII")


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.inotify_init1.argtypes = [ctypes.c_int]
        libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        return libc
    except (OSError, AttributeError):
        return None


class Watch:
    """One inotify instance: the folders ``cover`` was given, and a ``generation`` that grows
    whenever something in them changed."""

    def __init__(self, libc: ctypes.CDLL, fd: int) -> None:
        self._libc = libc
        self._fd: int | None = fd
        self._queued = select.poll()
        """Asked first whether the kernel queued anything: a look that finds nothing (most
        of them) costs one ``poll``, not a ``read`` failing with EAGAIN and the exception it
        raises in Python (five looks a turn)."""
        self._queued.register(fd, select.POLLIN)
        self._watched: dict[str, int] = {}
        self._by_wd: dict[int, str] = {}
        self.generation = 0

    @classmethod
    def open(cls) -> Self | None:
        """A watcher, or None where there is none (not Linux, or inotify's instance limit)."""
        libc = _libc()
        if libc is None:
            return None
        fd = libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        if fd < 0:
            _log.info("no inotify (%s): workspace files are checked on every turn",
                      os.strerror(ctypes.get_errno()))
            return None
        return cls(libc, fd)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
            self._watched.clear()
            self._by_wd.clear()

    def __del__(self) -> None:
        self.close()

    def look(self) -> int:
        """The generation, after reading what the kernel queued since the last look."""
        if self._fd is None:
            self.generation += 1  # closed: never say "unchanged"
            return self.generation
        if not self._queued.poll(0):
            return self.generation
        changed = False
        while True:
            try:
                data = os.read(self._fd, 65536)
            except BlockingIOError:
                break
            except OSError:  # a queue overflow reads as an event; anything else: changed
                changed = True
                break
            if not data:
                break
            changed = True
            offset = 0
            while offset + _EVENT.size <= len(data):
                wd, mask, _, length = _EVENT.unpack_from(data, offset)
                offset += _EVENT.size + length
                if mask & _IN_IGNORED and wd in self._by_wd:
                    self._watched.pop(self._by_wd.pop(wd), None)
        if changed:
            self.generation += 1
        return self.generation

    def cover(self, folders: list[Path]) -> bool:
        """Watch ``folders`` (for one that does not exist, the nearest folder above it that
        does, so its making is seen). False when one cannot be watched: then the caller must
        not trust an unchanged generation."""
        if self._fd is None:
            return False
        for folder in folders:
            target = folder
            while not target.is_dir():
                if target.parent == target:
                    return False
                target = target.parent
            key = os.fspath(target)
            if key in self._watched:
                continue
            wd = self._libc.inotify_add_watch(self._fd, os.fsencode(key), _MASK)
            if wd < 0:
                _log.info("cannot watch %s (%s): its files are checked on every turn", key,
                          os.strerror(ctypes.get_errno()))
                return False
            self._watched[key] = wd
            self._by_wd[wd] = key
        return True
