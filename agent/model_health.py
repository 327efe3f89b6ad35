"""Whether the model can be asked, as ``/v1/health`` tells it: a key the provider needs and
nobody set (found once at start), or the last calls failing one after the other (the server
unreachable, the key refused, every fallback out of retries).

Counted per ``Provider.complete`` (after its retries and fallbacks; ``@counted``), reset by
the first call that is answered; cheap to read, so health stays free of I/O.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Concatenate, ParamSpec, Protocol, TypeVar

from agent.errors import ProviderAuthError, ProviderUnavailable


class ModelHealth:
    def __init__(self, threshold: int) -> None:
        """``threshold``: failed calls in a row (``agent.degraded_after_failures``) before the
        model counts as failing."""
        self.threshold = threshold
        self.failures = 0
        self.last_error: str | None = None
        self.config_problem: str | None = None
        """What to configure before the model can be called at all (no key), when known."""

    def failed(self, error: str) -> None:
        self.failures += 1
        self.last_error = error

    def answered(self) -> None:
        self.failures = 0

    def problem(self) -> str | None:
        """Why the model cannot be relied on now, or None."""
        if self.config_problem:
            return self.config_problem
        if self.failures >= self.threshold:
            return f"the last {self.failures} model calls failed (last: {self.last_error})"
        return None


class _Counted(Protocol):
    health: ModelHealth


S = TypeVar("S", bound=_Counted)
P = ParamSpec("P")
R = TypeVar("R")


def counted(call: Callable[Concatenate[S, P], Awaitable[R]]
            ) -> Callable[Concatenate[S, P], Awaitable[R]]:
    """``Provider.complete`` counted in its ``health``: a call that failed (unreachable,
    refused, out of retries and fallbacks) or one that was answered."""

    @functools.wraps(call)
    async def wrapper(self: S, *args: P.args, **kwargs: P.kwargs) -> R:
        try:
            result = await call(self, *args, **kwargs)
        except (ProviderUnavailable, ProviderAuthError) as exc:
            self.health.failed(str(exc))
            raise
        self.health.answered()
        return result

    return wrapper
