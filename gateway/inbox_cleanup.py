"""The inbox's cleanup: received files (``inbox/<channel>/<chat>/`` in the workspace) go when
they are older than ``agent.media.inbox.max_age``, and the oldest go first while all of them
take more than ``max_total``.

A file a message still waiting for its answer refers to (a pending row of the durable inbox:
queued, or in a running turn) is never removed, whatever its age. The sweep runs in the
background every ``sweep_every``, once soon after the start; the walk and the deletes run in a
thread. Ages are files' modification times against the wall clock (``now``), not the
schedules' clock: the cleanup is no schedule of the agent's.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

from gateway.kernel.config_media import InboxConfig
from gateway.kernel.frozen import frozen
from gateway.kernel.inbox_files import INBOX_DIR
from gateway.kernel.store import Store
from gateway.periodic import run_every

_log = logging.getLogger(__name__)


@frozen
class Swept:
    removed: int
    freed: int
    kept_in_use: int
    """Files due for removal that a pending message still refers to."""
    total: int
    """Bytes the inbox holds after the sweep."""


def sweep(inbox: Path, *, now: float, max_age: float, max_total: int,
          in_use: set[str]) -> Swept:
    """Remove what is too old, then the oldest beyond ``max_total`` (blocking). ``in_use``:
    paths never removed."""
    in_use = {os.path.realpath(p) for p in in_use}
    files: list[tuple[float, int, Path]] = []
    for folder, _, names in os.walk(inbox):
        for name in names:
            path = Path(folder, name)
            try:
                info = path.lstat()
            except OSError:
                continue
            files.append((info.st_mtime, info.st_size, path))
    files.sort(key=lambda f: f[0])
    total = sum(size for _, size, _ in files)
    removed = freed = kept = 0
    for mtime, size, path in files:
        too_old = max_age > 0 and now - mtime > max_age
        too_much = max_total > 0 and total > max_total
        if not (too_old or too_much):
            break  # oldest first: nothing after this one is due either
        if os.path.realpath(path) in in_use:
            kept += 1
            continue
        try:
            path.unlink()
        except OSError as exc:
            _log.warning("inbox cleanup: could not remove %s: %s", path, exc.strerror)
            continue
        removed, freed, total = removed + 1, freed + size, total - size
    for folder, _, _ in os.walk(inbox, topdown=False):
        if Path(folder) != inbox:
            try:
                os.rmdir(folder)  # only an empty one
            except OSError:
                pass
    return Swept(removed, freed, kept, total)


class InboxCleanup:
    def __init__(self, config: InboxConfig, store: Store, *, workspace: Path,
                 now: Callable[[], float] = time.time) -> None:
        self.config = config
        self.store = store
        self.inbox = workspace / INBOX_DIR
        self.now = now
        self.last: Swept | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if self.config.max_age > 0 or self.config.max_total > 0:
            self._task = asyncio.create_task(self._run(), name="inbox-cleanup")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def sweep_once(self) -> Swept:
        """One sweep now: what pending messages refer to is read first, then kept."""
        in_use = {m.path for msg in await self.store.inbox_pending() for m in msg.media
                  if m.path}
        swept = await asyncio.to_thread(
            sweep, self.inbox, now=self.now(), max_age=self.config.max_age,
            max_total=int(self.config.max_total), in_use=in_use)
        if swept.removed:
            _log.info("inbox cleanup: removed %d file(s), %d bytes; %d bytes kept",
                      swept.removed, swept.freed, swept.total)
        self.last = swept
        return swept

    async def _run(self) -> None:
        await run_every(self.config.sweep_every, self.sweep_once, "inbox cleanup")
