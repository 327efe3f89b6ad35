"""Heartbeat: a periodic agent turn over the tasks in HEARTBEAT.md, quiet unless it matters.

Every ``heartbeat.every`` inside ``heartbeat.active_hours`` (cron timezone) the agent gets a
turn in its own session (``heartbeat:main``) with HEARTBEAT.md in its system prompt. A beat is
skipped without a model call when the file holds no tasks, and skipped while the target's
conversation (or the previous beat) is busy. A reply that is ``HEARTBEAT_OK`` is stored but not
delivered (``gateway.kernel.heartbeat_ack``, applied by the agent); anything else goes to
``heartbeat.target`` and never to whoever spoke last.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path

from gateway.kernel.bus import BusClosed, MessageBus, NotStored
from gateway.kernel.clock import Clock
from gateway.kernel.config import HeartbeatConfig
from gateway.kernel.events import InboundMessage
from gateway.kernel.heartbeat_ack import HEARTBEAT_CHANNEL, HEARTBEAT_OK
from gateway.kernel.schedule import zone

_log = logging.getLogger(__name__)

HEARTBEAT_CHAT = "main"

PROMPT = ("Heartbeat: go through the tasks in HEARTBEAT.md (in your instructions). If "
          "something needs the user's attention, say it briefly. If nothing does, reply with "
          f"{HEARTBEAT_OK} only.")

_COMMENT = re.compile(r"<!--.*?-->", re.S)
_EMPTY_ITEM = re.compile(r"^([-*+]|\d+[.)])(\s+\[[ xX]?\])?\s*$")


def has_tasks(text: str) -> bool:
    """Whether HEARTBEAT.md asks for anything: headings, blank lines, HTML comments, empty
    list items and a line wholly in parentheses (the template's placeholder) do not."""
    for line in _COMMENT.sub("", text).splitlines():
        line = line.strip()
        if not line or line.startswith("#") or _EMPTY_ITEM.match(line):
            continue
        if line.startswith("(") and line.endswith(")"):
            continue
        return True
    return False


def within(hours: tuple[int, int] | None, local: datetime) -> bool:
    """``local`` inside active hours (minutes after midnight; end exclusive; may wrap)."""
    if hours is None:
        return True
    start, end = hours
    minute = local.hour * 60 + local.minute
    if start == end:
        return True
    if start < end:
        return start <= minute < end
    return minute >= start or minute < end


class Heartbeat:
    def __init__(self, config: HeartbeatConfig, bus: MessageBus, *, workspace: Path,
                 timezone: str, clock: Clock, busy: Callable[[str], bool]) -> None:
        self.config = config
        self.bus = bus
        self.file = workspace / "HEARTBEAT.md"
        self.tz = zone(timezone)
        self.clock = clock
        self.busy = busy
        self.target: tuple[str, str] | None = None
        if config.target != "none":
            channel, _, chat_id = config.target.partition(":")
            self.target = (channel, chat_id)
        self.last: tuple[datetime, str] | None = None
        """When the last beat was and what came of it (started, or why it was skipped)."""
        self._task: asyncio.Task[None] | None = None

    @property
    def session_key(self) -> str:
        return f"{HEARTBEAT_CHANNEL}:{HEARTBEAT_CHAT}"

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="heartbeat")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _run(self) -> None:
        every = timedelta(seconds=self.config.every)
        due = self.clock.now() + every
        while True:
            await self.clock.sleep_until(due)
            now = self.clock.now()
            if now < due:
                continue
            try:
                await self.beat(now)
            except BusClosed:
                return
            except NotStored as exc:  # the database is gone or full: health says so already
                _log.warning("heartbeat: not run: %s", exc)
            except Exception:
                _log.exception("heartbeat failed")
            while due <= now:  # beats missed meanwhile are not made up
                due += every

    async def beat(self, now: datetime) -> str:
        """One beat: publish a heartbeat turn, or say why not."""
        outcome = await self._beat(now)
        self.last = (now, outcome)
        _log.log(logging.INFO if outcome == "started" else logging.DEBUG,
                 "heartbeat: %s", outcome)
        return outcome

    async def _beat(self, now: datetime) -> str:
        if not within(self.config.hours(), now.astimezone(self.tz)):
            return "skipped: outside active hours"
        text = await asyncio.to_thread(self._read)
        if not has_tasks(text):
            return "skipped: HEARTBEAT.md has no tasks"
        busy = [key for key in (self._target_session(), self.session_key)
                if key is not None and self.busy(key)]
        if busy:
            return f"skipped: {busy[0]} is busy"
        await self.bus.publish_inbound(InboundMessage(
            channel=HEARTBEAT_CHANNEL, chat_id=HEARTBEAT_CHAT, sender_id="heartbeat",
            text=PROMPT, kind="heartbeat", deliver_to=self.target, received_at=now,
            message_id=f"heartbeat:{now.isoformat()}", trust="owner"))
        return "started"

    def _target_session(self) -> str | None:
        return f"{self.target[0]}:{self.target[1]}" if self.target else None

    def _read(self) -> str:
        try:
            return self.file.read_text(encoding="utf-8")
        except (FileNotFoundError, IsADirectoryError):
            return ""
        except (OSError, UnicodeDecodeError) as exc:
            _log.warning("cannot read %s: %s", self.file, exc)
            return ""
