"""Acknowledgement reactions on people's messages (``channels.<name>.streaming.reactions``):
one emoji per stage of the message (``MessageStage``: taken, queued, done, failed), the
latest replacing the one before.

``react`` is called synchronously by the gateway and never blocks: each message gets a small
worker that applies the stages in order, skipping to the latest when several came while a
call was on its way. A reaction that fails is logged and given up (it is a courtesy; the
answer does not wait for it).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping

from gateway.kernel.events import MessageStage, Stage
from gateway.kernel.tasks import TaskSet

_log = logging.getLogger(__name__)

DEFAULT_EMOJI: Mapping[Stage, str] = {"taken": "👀", "queued": "⏳", "done": "✅",
                                      "failed": "❌"}
FINAL: frozenset[Stage] = frozenset({"done", "failed"})

Apply = Callable[[MessageStage, str, str | None], Awaitable[None]]
"""Show ``emoji`` on the event's message in place of ``previous`` (None: nothing yet)."""


class Reactions:
    def __init__(self, name: str, tasks: TaskSet, apply: Apply,
                 emoji: Mapping[Stage, str] = DEFAULT_EMOJI) -> None:
        self._name = name
        self._tasks = tasks
        self._apply = apply
        self._emoji = emoji
        self._wanted: dict[tuple[str, str], MessageStage] = {}
        self._shown: dict[tuple[str, str], str] = {}
        self._busy: set[tuple[str, str]] = set()

    def react(self, event: MessageStage) -> None:
        key = (event.chat_id, event.message_id)
        self._wanted[key] = event
        if key not in self._busy:
            self._busy.add(key)
            self._tasks.spawn(self._work(key), f"{self._name}-reaction:{event.message_id}")

    async def _work(self, key: tuple[str, str]) -> None:
        try:
            while True:
                event = self._wanted[key]
                emoji = self._emoji[event.stage]
                shown = self._shown.get(key)
                if emoji == shown:
                    break
                try:
                    await self._apply(event, emoji, shown)
                except Exception as exc:  # a courtesy: logged, never retried
                    _log.info("%s: reaction %s on message %s failed: %s", self._name, emoji,
                              event.message_id, type(exc).__name__)
                self._shown[key] = emoji
        finally:
            self._busy.discard(key)
            if self._wanted[key].stage in FINAL:  # nothing follows: keep no state
                self._wanted.pop(key, None)
                self._shown.pop(key, None)
