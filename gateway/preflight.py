"""What can stop the gateway from starting, found before it starts and said in one line.

``config check``, ``doctor``, ``gateway`` and ``chat`` run these checks; each ``Problem``
names the config key (or file) and what to do. ``explain()`` turns the failures that can still
happen at start (a port taken meanwhile, a corrupt or locked database, a full disk) into the
same kind of line, so no traceback reaches an operator's terminal.
"""

from __future__ import annotations

import errno
import os
import shutil
import socket
import sqlite3
import tempfile
from pathlib import Path

from gateway.kernel.config import Config
from gateway.kernel.frozen import frozen

SQLITE_HEADER = b"SQLite format 3\x00"
MIN_FREE_BYTES = 100 * 1024 * 1024
"""Below this much free space under ``data_dir`` ``doctor`` fails: the database, received
media and logs grow there, and SQLite needs room for its write-ahead log."""


@frozen
class Problem:
    key: str
    """The config key (``workspace``, ``channels.local.port``) or file the problem is in."""
    message: str
    """What is wrong and what to do, one line."""

    def __str__(self) -> str:
        return f"{self.key}: {self.message}"


def _nearest_existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _cannot_write(folder: Path) -> str | None:
    """Why no folder can be made in ``folder``, tried for real (and removed): permissions,
    a read-only file system, or a place such as /proc where nothing can be made, whoever
    asks (root passes every ``os.access`` check)."""
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".parley-check-", dir=folder))
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


def folder_problem(key: str, path: Path) -> Problem | None:
    """Why ``path`` cannot be (or become) a writable folder, or None."""
    if path.exists() or path.is_symlink():
        if not path.is_dir():
            return Problem(key, f"{path} is a file, not a folder; set {key} to a folder or "
                                "move the file away")
        if why := _cannot_write(path):
            return Problem(key, f"cannot write in {path} ({why}); fix its permissions "
                                f"(chown/chmod) or set {key} elsewhere")
        return None
    parent = _nearest_existing(path.parent)
    if not parent.is_dir():
        return Problem(key, f"cannot create {path}: {parent} is a file; set {key} elsewhere")
    if why := _cannot_write(parent):
        return Problem(key, f"cannot create {path}: nothing can be made in {parent} ({why}); "
                            f"set {key} elsewhere")
    return None


def database_problem(path: Path) -> Problem | None:
    """A database file that SQLite will refuse: not a file, unreadable, or not SQLite."""
    if not path.exists():
        return None
    if not path.is_file():
        return Problem("data_dir", f"{path} is not a file; move it away")
    try:
        with path.open("rb") as fh:
            head = fh.read(len(SQLITE_HEADER))
    except OSError as exc:
        return Problem("data_dir", f"cannot read {path}: {exc.strerror}; fix its permissions")
    if head and head != SQLITE_HEADER:
        return Problem("data_dir", f"{path} is not a SQLite database (corrupt?); restore it "
                                   "from a backup (see `parley backup`) or move it away to "
                                   "start with an empty one")
    return None


def path_problems(config: Config) -> list[Problem]:
    """The workspace, data folder, database, log file and the local channel's token: what
    would fail at start."""
    problems = [p for p in (folder_problem("workspace", config.workspace_path),
                            folder_problem("data_dir", config.data_path)) if p]
    if not any(p.key == "data_dir" for p in problems):
        if db := database_problem(config.db_path):
            problems.append(db)
    local = config.channels.local
    if local.enabled and local.token is None and not _loopback(local.host):
        problems.append(Problem("channels.local.token", f"required to listen on {local.host!r}, "
                                "which is not loopback; set a token or use host 127.0.0.1"))
    if config.logging.file:
        log = Path(config.logging.file).expanduser()
        if log.is_dir():
            problems.append(Problem("logging.file", f"{log} is a folder; name a file"))
        elif problem := folder_problem("logging.file", log.parent):
            problems.append(problem)
    return problems


def _loopback(host: str) -> bool:
    import ipaddress

    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def listeners(config: Config) -> list[tuple[str, str, int]]:
    """(config key, host, port) of every socket the enabled channels listen on."""
    channels = config.channels
    found = []
    if channels.local.enabled:
        found.append(("channels.local.port", channels.local.host, channels.local.port))
    if channels.webchat.enabled:
        found.append(("channels.webchat.port", channels.webchat.host, channels.webchat.port))
    telegram = channels.telegram
    if telegram.enabled and telegram.mode == "webhook":
        found.append(("channels.telegram.webhook_port", telegram.webhook_listen,
                      telegram.webhook_port))
    return [(key, host, port) for key, host, port in found if port]


def port_in_use(key: str, host: str, port: int) -> Problem:
    return Problem(key, f"{host}:{port} is already in use (another gateway running? "
                        f"`parley status` says); stop it or set {key} to a free port")


def port_problems(config: Config) -> list[Problem]:
    problems = []
    for key, host, port in listeners(config):
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as exc:
            problems.append(Problem(key.rsplit(".", 1)[0] + ".host",
                                    f"cannot resolve {host!r}: {exc}"))
            continue
        family, _, _, _, address = infos[0]
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as aiohttp binds
            try:
                sock.bind(address)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    problems.append(port_in_use(key, host, port))
                else:
                    problems.append(Problem(key, f"cannot listen on {host}:{port}: "
                                                 f"{exc.strerror or exc}"))
    return problems


def free_bytes(path: Path) -> int:
    return shutil.disk_usage(_nearest_existing(path)).free


def disk_problem(config: Config, minimum: int = MIN_FREE_BYTES) -> Problem | None:
    free = free_bytes(config.data_path)
    if free < minimum:
        return Problem("data_dir", f"only {free // (1024 * 1024)} MB free under "
                                   f"{config.data_path}; free some space (at least "
                                   f"{minimum // (1024 * 1024)} MB) or move data_dir")
    return None


def explain(exc: BaseException, config: Config) -> str | None:
    """One line for a failure at start an operator can fix; None for anything else."""
    db = config.db_path
    if isinstance(exc, sqlite3.DatabaseError):
        text = str(exc).lower()
        if "locked" in text or "busy" in text:
            return (f"data_dir: the database {db} is locked by another process (another "
                    "gateway? `parley status`); stop it and start again")
        if "full" in text:
            return f"data_dir: the disk holding {db} is full; free some space and start again"
        if "not a database" in text or "malformed" in text or "corrupt" in text:
            return (f"data_dir: the database {db} is corrupt ({exc}); restore it from a "
                    "backup (see `parley backup`) or move it away to start with an empty one")
        if "unable to open" in text or "readonly" in text:
            return (f"data_dir: cannot write the database {db} ({exc}); check the folder's "
                    "permissions")
        return None
    if isinstance(exc, OSError):
        if exc.errno == errno.EADDRINUSE:
            for key, host, port in listeners(config):
                if str(port) in str(exc):
                    return str(port_in_use(key, host, port))
            if taken := port_problems(config):  # the message did not say which: try each
                return str(taken[0])
            return f"a port is already in use ({exc.strerror}); another gateway running?"
        if exc.errno == errno.ENOSPC:
            return f"data_dir: the disk is full ({exc.filename or config.data_path}); free " \
                   "some space and start again"
        if exc.errno in (errno.EACCES, errno.EROFS, errno.EEXIST, errno.ENOTDIR, errno.ENOENT):
            return f"{exc.filename or ''}: {exc.strerror}; check workspace and data_dir " \
                   "(`parley config check`)"
    return None
