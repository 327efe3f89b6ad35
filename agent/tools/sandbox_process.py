"""A sandboxed command while it runs: bwrap (our child) and the sandbox's PID 1 under it.

bwrap tells which process is PID 1 through ``--info-fd``; a pidfd taken at once (so the pid
cannot be reused under us) is what ``kill()`` signals and then waits on. PID 1 exits only
after the kernel has killed every other process of its PID namespace, so once the pidfd turns
readable nothing the command started is left.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal

from agent.tools.sandbox_cgroup import CommandCgroup

_KILL_WAIT = 5.0


class _InfoSink(asyncio.Protocol):
    """bwrap's ``--info-fd`` JSON; the pipe closes once bwrap has written it (or died)."""

    def __init__(self, done: asyncio.Future[int | None]) -> None:
        self.data = bytearray()
        self.done = done

    def data_received(self, data: bytes) -> None:
        self.data += data

    def connection_lost(self, exc: Exception | None) -> None:
        if self.done.done():
            return
        try:
            pid = int(json.loads(self.data)["child-pid"])
            self.done.set_result(os.pidfd_open(pid))  # at once: the pid can't be reused now
        except (ValueError, KeyError, TypeError, OSError):
            self.done.set_result(None)  # bwrap failed before its PID 1 existed, or it is gone


async def read_info(fd: int) -> tuple[asyncio.Future[int | None], asyncio.BaseTransport]:
    """A pidfd of the sandbox's PID 1, once bwrap has said which process that is."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[int | None] = loop.create_future()
    pipe = os.fdopen(fd, "rb", buffering=0)
    try:
        transport, _ = await loop.connect_read_pipe(lambda: _InfoSink(done), pipe)
    except BaseException:
        pipe.close()
        raise
    return done, transport


async def _exited(pidfd: int, within: float) -> None:
    """Wait until the process behind ``pidfd`` has exited (a pidfd turns readable)."""
    loop = asyncio.get_running_loop()
    gone: asyncio.Future[None] = loop.create_future()

    def exited() -> None:
        if not gone.done():
            gone.set_result(None)

    loop.add_reader(pidfd, exited)
    try:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(gone, within)
    finally:
        loop.remove_reader(pidfd)


class SandboxedCommand:
    """A running sandboxed command: bwrap (our child) and the sandbox's PID 1 under it."""

    def __init__(self, proc: asyncio.subprocess.Process, init: asyncio.Future[int | None],
                 info: asyncio.BaseTransport, cgroup: CommandCgroup | None) -> None:
        self._proc = proc
        self._init = init
        self._info = info
        self._cgroup = cgroup
        self._killed = False

    @property
    def pid(self) -> int:
        return self._proc.pid

    async def wait(self) -> int:
        return await self._proc.wait()

    def _pidfd(self) -> int | None:
        return self._init.result() if self._init.done() else None

    async def kill(self) -> None:
        """Kill everything the command started; return once all of it is gone."""
        if self._killed:
            return
        if (pidfd := self._pidfd()) is not None:
            _signal(pidfd)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._proc.pid, signal.SIGKILL)
        await self._proc.wait()
        with contextlib.suppress(TimeoutError):  # bwrap is gone: its pipe closes now
            await asyncio.wait_for(asyncio.shield(self._init), _KILL_WAIT)
        self._info.close()
        self._killed = True
        if not self._init.done():  # never seen: close it whenever it comes
            self._init.add_done_callback(lambda f: _close(f.result()))
        elif (pidfd := self._init.result()) is not None:
            try:
                _signal(pidfd)  # PID 1 going takes its PID namespace along
                await _exited(pidfd, _KILL_WAIT)
            finally:
                os.close(pidfd)
        if self._cgroup is not None:
            await self._cgroup.kill_and_remove()


def _close(fd: int | None) -> None:
    if fd is not None:
        os.close(fd)


def _signal(pidfd: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
