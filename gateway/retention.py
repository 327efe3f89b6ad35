"""The database's retention, in the background (issue 24; the rules: ``retention`` in the
config, the queries: ``gateway/kernel/store_retention.py``).

Every ``retention.sweep_every`` (and once soon after the start) the rules run a batch at a time,
each batch one short transaction, yielding between batches so turns go first; it never runs on
a turn's path. After a sweep that removed snapshots (at most once a day) the layer texts no
kept snapshot names go too: one read of every snapshot, on a connection of its own. Removed
rows leave free pages that the file reuses; ``parley db vacuum`` gives the space back to the
disk.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import datetime

from gateway.kernel.config_retention import RetentionConfig
from gateway.kernel.events import utcnow
from gateway.kernel.store import Store
from gateway.kernel.store_retention import (
    TEXTS_GRACE,
    Removed,
    policy_of,
    prune_store,
    sweep_texts_store,
)
from gateway.periodic import run_every

_log = logging.getLogger(__name__)

TEXTS_EVERY = TEXTS_GRACE
"""Seconds between two passes over the kept snapshots for the layer texts none names (each
reads every snapshot; a text must be a day untouched to go anyway)."""
MAX_BATCHES = 10_000
"""Batches per sweep at most (the rest waits for the next sweep)."""


class Retention:
    def __init__(self, config: RetentionConfig, store: Store, *,
                 now: Callable[[], datetime] = utcnow) -> None:
        self.config = config
        self.policy = policy_of(config)
        self.store = store
        self.now = now
        self.last: Removed | None = None
        self._texts_due = False
        """Snapshots went since the layer texts were last swept: a pass over the kept
        snapshots may find texts no one names any more."""
        self._texts_swept: datetime | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="retention")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def sweep_once(self) -> Removed:
        """Every rule until nothing is due (or ``MAX_BATCHES``); rows removed per table."""
        total: Removed = {}
        now = self.now()
        for _ in range(MAX_BATCHES):
            done = await prune_store(self.store, self.policy, now)
            for table, n in done.removed.items():
                total[table] = total.get(table, 0) + n
            if not done.more:
                break
            await asyncio.sleep(0)  # turns waiting for the write lock go first
        if total.get("context_snapshots") or total.get("turns"):
            self._texts_due = True
        if self._texts_due and (self._texts_swept is None
                                or (now - self._texts_swept).total_seconds() >= TEXTS_EVERY):
            self._texts_swept = now
            gone = await sweep_texts_store(self.store, self.policy, now)
            self.store.forget_texts(gone)
            if gone:
                total["layer_texts"] = len(gone)
            self._texts_due = False
        if total:
            _log.info("retention: removed %s", ", ".join(f"{n} {t}" for t, n in total.items()))
        self.last = total
        return total

    async def _run(self) -> None:
        await run_every(self.config.sweep_every, self.sweep_once, "retention")
