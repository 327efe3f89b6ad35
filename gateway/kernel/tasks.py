"""Owned background tasks: every task is named, kept until it ends, and cancelled on stop, so
nothing of ours outlives the object that started it (and no task is garbage-collected while
it runs: asyncio keeps only a weak reference)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, Protocol, TypeVar


class _Closable(Protocol):
    def close(self) -> None: ...


C = TypeVar("C", bound=_Closable)


async def closing_to_thread(make: Callable[..., C], *args: Any) -> C:
    """``make(*args)`` on a worker thread (opening a file, say). A cancel that lands while the
    thread works (the gateway stopping, a connect timeout) closes what it makes when it
    arrives, instead of leaking it."""
    making = asyncio.ensure_future(asyncio.to_thread(make, *args))
    try:
        return await asyncio.shield(making)
    except asyncio.CancelledError:
        making.add_done_callback(_close_made)
        raise


def _close_made(making: asyncio.Future[Any]) -> None:
    if not making.cancelled() and making.exception() is None:
        making.result().close()


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
