"""The one backoff policy: how long to wait before trying again, for every retry in Parley.

Delays start at ``base``, double with each attempt up to ``cap``, and are spread by
``±jitter`` (a share) so that many chats or processes that failed together do not retry
together. A wait the other side asked for (``Retry-After``, Telegram's ``retry_after``)
replaces the computed delay, bounded by ``max_told``. Model calls, deliveries, reconnects of
the chat platforms and of MCP servers, and storing an inbound message all use it.
"""

from __future__ import annotations

import random

from gateway.kernel.frozen import frozen


@frozen
class BackoffPolicy:
    base: float = 0.5
    cap: float = 30.0
    jitter: float = 0.2
    max_told: float | None = None
    """The longest wait a server may ask for; None takes it as told."""

    def delay(self, attempt: int, told: float | None = None) -> float:
        """The wait before try ``attempt + 1`` after ``attempt`` failed (``attempt`` ≥ 1)."""
        if told is not None:
            told = max(0.0, told)
            return told if self.max_told is None else min(told, self.max_told)
        plain = min(self.base * 2 ** max(attempt - 1, 0), self.cap)
        if self.jitter:
            plain *= random.uniform(1 - self.jitter, 1 + self.jitter)
        return min(plain, self.cap)

    def counter(self) -> Backoff:
        return Backoff(self)


class Backoff:
    """A policy with its own attempt count, for a loop that reconnects: ``next()`` after each
    failure, ``reset()`` once it works again."""

    __slots__ = ("attempt", "policy")

    def __init__(self, policy: BackoffPolicy | None = None) -> None:
        self.policy = policy or BackoffPolicy()
        self.attempt = 0

    def next(self, told: float | None = None) -> float:
        self.attempt += 1
        return self.policy.delay(self.attempt, told)

    def reset(self) -> None:
        self.attempt = 0
