"""A background job of the gateway run every so often (the inbox's cleanup, the database's
retention): once soon after the start, then every ``every`` seconds; a failure is logged and
tried again next time, never ends the loop."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

_log = logging.getLogger(__name__)


async def run_every(every: float, job: Callable[[], Awaitable[object]], what: str) -> None:
    while True:
        try:
            await job()
        except asyncio.CancelledError:
            raise
        except Exception:
            _log.exception("%s failed; tried again in %.0f s", what, every)
        await asyncio.sleep(every)
