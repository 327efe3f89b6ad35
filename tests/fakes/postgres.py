"""A throwaway PostgreSQL cluster for the tests: Debian's ``postgresql`` server binaries,
``initdb`` on a temporary directory, ``pg_ctl`` serving on a loopback port.

Run as root (CI), the server runs as the ``postgres`` user (``initdb`` refuses root) through
``runuser``. Each test gets its own database (``fresh_database``), so tests never see each
other's rows. ``make test`` installs the package (the Makefile's SYSTEM_PACKAGES); without it
``find_bin_dir`` says what is missing and the tests that need PostgreSQL skip saying why.
"""

from __future__ import annotations

import itertools
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import psycopg

_counter = itertools.count(1)


def find_bin_dir() -> Path | None:
    """The newest installed server's bin directory (``/usr/lib/postgresql/N/bin``)."""
    root = Path("/usr/lib/postgresql")
    found = sorted((d for d in root.glob("*/bin") if (d / "initdb").exists()),
                   key=lambda d: int(d.parent.name) if d.parent.name.isdigit() else 0)
    return found[-1] if found else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PostgresCluster:
    """``start()`` → a running server on 127.0.0.1:``port``; ``stop()`` removes everything."""

    def __init__(self, bin_dir: Path) -> None:
        self.bin_dir = bin_dir
        self.dir = Path(tempfile.mkdtemp(prefix="parley-pg-"))
        self.data = self.dir / "data"
        self.port = _free_port()
        self._as_postgres = os.geteuid() == 0

    def _run(self, *args: str) -> None:
        cmd = [str(self.bin_dir / args[0]), *args[1:]]
        if self._as_postgres:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{args[0]} failed: {done.stdout}{done.stderr}")

    def start(self) -> None:
        if self._as_postgres:
            pw = pwd.getpwnam("postgres")
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust",
                  "-E", "UTF8", "--locale=C", "--no-sync")
        options = (f"-c listen_addresses=127.0.0.1 -c port={self.port} "
                   f"-c unix_socket_directories={self.dir} -c fsync=off "
                   "-c synchronous_commit=off -c full_page_writes=off -c max_connections=200")
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.dir / "log"), "-o", options,
                  "-w", "-t", "60", "start")

    def stop(self) -> None:
        try:
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def fresh_database(self) -> str:
        """A new empty database; its URL."""
        name = f"t{os.getpid()}_{next(_counter)}"
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)


@asynccontextmanager
async def renewals_held(url: str, process: str) -> AsyncIterator[None]:
    """While inside, the lease renewals of ``process`` (a cluster worker's id) hang, as on a
    stalled database or a network dropping packets: its ``cluster_processes`` row is locked."""
    async with await psycopg.AsyncConnection.connect(url) as db:
        await db.execute("SELECT 1 FROM cluster_processes WHERE id = %s FOR UPDATE", (process,))
        yield
