"""Owned background tasks: every task is named, kept until it ends, and cancelled on stop, so
nothing of ours outlives the object that started it (and no task is garbage-collected while
it runs: asyncio keeps only a weak reference)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Iterator
from typing import Any


class TaskSet:
    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def __len__(self) -> int:
        return len(self._tasks)

    def __iter__(self) -> Iterator[asyncio.Task[Any]]:
        return iter(set(self._tasks))

    async def cancel_all(self) -> None:
        """Cancel every task and wait until each has ended."""
        tasks = set(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def finish(self, grace: float) -> None:
        """Give the tasks ``grace`` seconds to end by themselves, then cancel the rest."""
        tasks = set(self._tasks)
        if not tasks:
            return
        _, still = await asyncio.wait(tasks, timeout=grace)
        for task in still:
            task.cancel()
        await asyncio.gather(*still, return_exceptions=True)
