from __future__ import annotations

import pytest

from gateway.kernel.backoff import Backoff, BackoffPolicy


def test_delays_double_up_to_the_cap_within_the_jitter() -> None:
    policy = BackoffPolicy(base=1.0, cap=10.0, jitter=0.5)
    for attempt, plain in ((1, 1.0), (2, 2.0), (3, 4.0), (4, 8.0), (5, 10.0), (30, 10.0)):
        for _ in range(50):
            delay = policy.delay(attempt)
            assert plain * 0.5 <= delay <= min(plain * 1.5, 10.0)


def test_without_jitter_the_sequence_is_exact_and_resets() -> None:
    backoff = Backoff(BackoffPolicy(base=0.5, cap=3.0, jitter=0.0))
    assert [backoff.next() for _ in range(5)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    backoff.reset()
    assert backoff.next() == 0.5


@pytest.mark.parametrize(("told", "max_told", "expected"),
                         [(7.0, None, 7.0), (120.0, 60.0, 60.0), (-3.0, None, 0.0)])
def test_a_wait_the_server_asks_for_wins(told: float, max_told: float | None,
                                         expected: float) -> None:
    assert BackoffPolicy(max_told=max_told).delay(1, told) == expected
