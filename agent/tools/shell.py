"""The ``exec`` tool: run a shell command in the workspace.

Where it runs is the runner's business: the bubblewrap sandbox (``sandbox.py``), or the host
itself when the config says so (``exec_access.py`` decides which, once). Either way stdin is
closed, the runner kills everything the command started when it returns, times out or its turn
is cancelled, secrets' values are masked in the output, and the output is capped. The deny list
is a seatbelt against an obviously destructive command, not the defence: a determined command
can get around any regex, and the sandbox is what contains it.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Protocol

from agent.tools.base import Tool, ToolError, ToolRetry
from agent.turn import TurnContext
from gateway.kernel.secrets import is_secret_name

_HEAD_SHARE = 0.6
_DRAIN_SECONDS = 2.0
_MIN_SECRET_LEN = 8
_LIMIT_HINTS = {128 + signal.SIGXCPU: "CPU time limit reached",
                128 + signal.SIGXFSZ: "file size limit reached"}


class RunningCommand(Protocol):
    async def wait(self) -> int:
        """The exit status (128 + n when a signal n killed it)."""
        ...

    async def kill(self) -> None:
        """Kill everything the command started; return once it is gone."""
        ...


class CommandRunner(Protocol):
    async def start(self, command: str, *, cwd: Path, stdout: int,
                    stderr: int) -> RunningCommand:
        """Start ``/bin/sh -c command`` in ``cwd`` with stdin closed."""
        ...

# Where a command starts: beginning, after ; & | ( ` $( or a newline, past sudo/exec and the like.
_CMD = r"(?:^|[;&|(`\n]|\$\()\s*(?:(?:sudo|exec|command|nohup|env|time|nice)\s+(?:-\S+\s+)*)*"
_END = r"""["']?(?=$|[\s;&|)`])"""
_SYSTEM_DIRS = r"(?:bin|boot|dev|etc|home|lib|lib32|lib64|opt|proc|root|sbin|srv|sys|usr|var)"
_ROOT_ABS = rf"""["']?(?:/+|/+{_SYSTEM_DIRS}/?|~/?|\$HOME/?|\$\{{HOME\}}/?)\*?{_END}"""
_ROOT_LIKE = rf"""(?:{_ROOT_ABS}|["']?(?:\*|\.{{1,2}}/?\*?){_END})"""
_ARGS = r"(?:[^\s;&|]+\s+)*?"  # other arguments in the same command (no separators)
_RECURSIVE = r"(?:-[a-zA-Z]*[rR][a-zA-Z]*|--recursive)\s+"

DENY_RULES: tuple[tuple[str, str], ...] = (
    ("recursive rm of /, ~, the workspace or a system folder",
     rf"\brm\s+{_ARGS}{_RECURSIVE}{_ARGS}{_ROOT_LIKE}"),
    ("mkfs (formats a filesystem)", r"\bmkfs(?:\.\w+)?\b"),
    ("dd writing to a device", r"\bdd\b[^;&|\n]*\bof=/dev/(?!null\b|zero\b|stdout\b|stderr\b)"),
    ("writing to a disk device",
     r"(?:>|\btee\s+(?:-\S+\s+)*)\s*/dev/(?:sd|hd|vd|xvd|nvme|mmcblk|disk)"),
    ("shutdown, reboot, halt or poweroff",
     rf"{_CMD}(?:systemctl\s+)?(?:shutdown|reboot|halt|poweroff)\b|{_CMD}init\s+[06]\b"),
    ("fork bomb", r"([\w:]+)\s*\(\s*\)\s*\{\s*\1\s*\|\s*\1\s*&"),
    ("recursive chmod/chown/chgrp of / or a system folder",
     rf"\b(?:chmod|chown|chgrp)\s+{_ARGS}(?:-[a-zA-Z]*R[a-zA-Z]*|--recursive)\s+{_ARGS}"
     rf"{_ROOT_ABS}"),
    ("kill every process (kill -1)",
     r"\bkill\s+(?:-s\s+\w+\s+|-\w+\s+|--\s+)+-1(?=$|[\s;&|)])"),
    ("sudo, su or doas (no privilege escalation)", rf"{_CMD}(?:sudo|su|doas)\b(?!-)"),
)
_DENY = tuple((name, re.compile(pattern)) for name, pattern in DENY_RULES)


def child_env(environ: dict[str, str] | None = None) -> tuple[dict[str, str], list[str]]:
    """The environment for a command without secrets, and the removed values worth masking."""
    environ = dict(os.environ if environ is None else environ)
    env = {k: v for k, v in environ.items() if not is_secret_name(k)}
    secrets = {v for k, v in environ.items() if k not in env and len(v) >= _MIN_SECRET_LEN}
    return env, sorted(secrets, key=len, reverse=True)


def check_command(command: str, extra: list[str]) -> None:
    """Raise ``ToolRetry`` naming the rule when the command matches the deny list."""
    for name, pattern in _DENY:
        if pattern.search(command):
            raise ToolRetry(f"command refused by the safety policy (rule: {name}); "
                            "do not retry it in another form")
    for raw in extra:
        try:
            matched = re.search(raw, command)
        except re.error as exc:  # fail closed: a broken rule must not let everything through
            raise ToolError(f"the configured deny pattern {raw!r} is not a valid regex "
                            f"({exc}); exec is unavailable until it is fixed") from None
        if matched:
            raise ToolRetry(f"command refused by the safety policy (rule: configured deny "
                            f"pattern {raw!r}); do not retry it in another form")


@dataclass
class _Capture:
    """Keeps the first ``head`` and the last ``tail`` bytes of a stream, counting the rest."""

    head: int
    tail: int
    first: bytearray = field(default_factory=bytearray)
    last: bytearray = field(default_factory=bytearray)
    dropped: int = 0

    def feed(self, data: bytes) -> None:
        room = self.head - len(self.first)
        if room > 0:
            self.first += data[:room]
            data = data[room:]
        self.last += data
        if len(self.last) > self.tail:
            excess = len(self.last) - self.tail
            del self.last[:excess]
            self.dropped += excess

    def pieces(self) -> list[str | int]:
        """Text pieces, with the number of dropped characters as an int where they were."""
        out: list[str | int] = [self.first.decode(errors="replace")]
        if self.dropped:
            out.append(self.dropped)
        out.append(self.last.decode(errors="replace"))
        return out


def cap_pieces(pieces: list[str | int], max_chars: int) -> str:
    """Join text pieces, keeping 60 % head and 40 % tail of ``max_chars`` with one marker.

    An int piece is text already dropped while reading; neither end is taken across it.
    """
    total = sum(p if isinstance(p, int) else len(p) for p in pieces)
    if total <= max_chars and not any(isinstance(p, int) for p in pieces):
        return "".join(p for p in pieces if isinstance(p, str))

    def take(seq: list[str | int], budget: int, from_end: bool) -> str:
        got: list[str] = []
        for p in reversed(seq) if from_end else seq:
            if isinstance(p, int) or budget <= 0:
                break
            part = (p[-budget:] if from_end else p[:budget]) if len(p) > budget else p
            got.append(part)
            budget -= len(part)
        return "".join(reversed(got) if from_end else got)

    head = take(pieces, int(max_chars * _HEAD_SHARE), from_end=False)
    tail = take(pieces, max_chars - len(head), from_end=True)
    cut = total - len(head) - len(tail)
    return f"{head}\n... [{cut} characters cut] ...\n{tail}"


class _PipeSink(asyncio.Protocol):
    """Feeds one pipe into a ``_Capture`` as data arrives, so memory stays bounded."""

    def __init__(self, capture: _Capture, closed: asyncio.Future[None]) -> None:
        self.capture = capture
        self.closed = closed

    def data_received(self, data: bytes) -> None:
        self.capture.feed(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)


async def _open_sink(capture: _Capture, pipe: BinaryIO) -> tuple[asyncio.BaseTransport,
                                                                  asyncio.Future[None]]:
    loop = asyncio.get_running_loop()
    closed: asyncio.Future[None] = loop.create_future()
    transport, _ = await loop.connect_read_pipe(lambda: _PipeSink(capture, closed), pipe)
    return transport, closed


async def _drain(sinks: list[tuple[asyncio.BaseTransport, asyncio.Future[None]]]) -> None:
    """Read what is left in the pipes; a process that escaped the group and keeps a pipe open
    does not hold the tool up."""
    if sinks:
        await asyncio.wait([closed for _, closed in sinks], timeout=_DRAIN_SECONDS)
    for transport, _ in sinks:
        transport.close()


@dataclass
class _Outcome:
    stdout: _Capture
    stderr: _Capture
    returncode: int | None
    timed_out: bool


async def _run(runner: CommandRunner, command: str, cwd: Path, limit: float,
               max_chars: int) -> _Outcome:
    """Run ``command``; whatever it started is killed when it ends, times out or is cancelled.

    The pipes are our own rather than asyncio's: ``Process.wait()`` on a PIPE also waits for
    every background process holding it, and so would not notice the shell itself ending.
    """
    head = int(max_chars * _HEAD_SHARE)
    out, err = _Capture(head, max_chars - head), _Capture(head, max_chars - head)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    pipes = [os.fdopen(out_r, "rb", buffering=0), os.fdopen(err_r, "rb", buffering=0)]
    try:
        proc = await runner.start(command, cwd=cwd, stdout=out_w, stderr=err_w)
    except BaseException:
        for pipe in pipes:
            pipe.close()
        raise
    finally:
        os.close(out_w)
        os.close(err_w)
    returncode: int | None = None
    sinks: list[tuple[asyncio.BaseTransport, asyncio.Future[None]]] = []
    try:
        sinks.append(await _open_sink(out, pipes[0]))
        sinks.append(await _open_sink(err, pipes[1]))
        try:
            async with asyncio.timeout(limit):
                returncode = await proc.wait()
        except TimeoutError:
            pass
    finally:  # normal exit, timeout and cancellation alike: nothing it started survives
        try:
            await proc.kill()
            await _drain(sinks)
        finally:
            for pipe in pipes:
                pipe.close()
    return _Outcome(out, err, returncode, timed_out=returncode is None)


def _combine(stdout: _Capture, stderr: _Capture) -> list[str | int]:
    """stdout, then stderr under a ``[stderr]`` line when there is any."""
    pieces = stdout.pieces()
    if not (stderr.first or stderr.last):
        return pieces
    if stdout.first and not (stdout.last or stdout.first).endswith(b"\n"):
        pieces.append("\n")
    return [*pieces, "[stderr]\n", *stderr.pieces()]


def _redact(pieces: list[str | int], secrets: list[str]) -> list[str | int]:
    for secret in secrets:
        pieces = [p.replace(secret, "[redacted]") if isinstance(p, str) else p for p in pieces]
    return pieces


def exec_tool(runner: CommandRunner, *, about: str = "") -> Tool:
    """The ``exec`` tool running its commands with ``runner``; ``about`` ends its description
    (where commands run, what they can reach)."""

    async def exec_(ctx: TurnContext, command: str,
                    timeout: float | None = None) -> str:  # noqa: ASYNC109 (the model's)
        """Run a shell command (/bin/sh) in the workspace; returns output and exit code. No
        stdin; background processes end with it; destructive commands are refused.

        Args:
            command: the command line.
            timeout: seconds before it is killed (capped).
        """
        config = ctx.tools.exec
        if not command.strip():
            raise ToolRetry("command is empty; send a shell command line")
        if "\0" in command:
            raise ToolRetry("command contains a NUL byte")
        if timeout is not None and timeout <= 0:
            raise ToolRetry("timeout must be a positive number of seconds (or left out)")
        check_command(command, config.deny)
        limit = config.timeout if timeout is None else min(timeout, config.timeout)
        workspace = ctx.workspace.expanduser().resolve()
        workspace.mkdir(parents=True, exist_ok=True)
        _, secrets = child_env()
        result = await _run(runner, command, workspace, limit, config.max_output_chars)

        pieces = _combine(result.stdout, result.stderr)
        text = cap_pieces(_redact(pieces, secrets), config.max_output_chars).rstrip("\n")
        if result.timed_out:
            status = f"[timed out after {limit:g}s; process killed]"
        elif hint := _LIMIT_HINTS.get(result.returncode or 0):
            status = f"[exit code: {result.returncode}; {hint}]"
        else:
            status = f"[exit code: {result.returncode}]"
        return f"{text}\n{status}" if text else f"(no output)\n{status}"

    made = Tool(exec_, name="exec", group="shell")
    if about:
        made.description = f"{made.description} {about}"
    return made
