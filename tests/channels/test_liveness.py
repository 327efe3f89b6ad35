"""``Liveness``: a channel's state from what completed, with a clock the test moves."""

from __future__ import annotations

from channels.common import Liveness


class Clock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


def test_silence_counts_from_the_last_receive_or_the_first_start() -> None:
    clock = Clock()
    live = Liveness(receive="getUpdates", limit=10.0, clock=clock)
    live.watching()
    clock.now += 10
    assert live.state(True) == ("connected", None)
    clock.now += 1
    state, reason = live.state(True)
    assert state == "degraded" and reason is not None and "since it started" in reason
    live.watching()  # a second start (a restart) does not reset the watch
    assert live.state(True)[0] == "degraded"
    live.received()
    assert live.state(True) == ("connected", None)
    clock.now += 10.5
    assert live.stalled() and "for 10s" in (live.state(True)[1] or "")


def test_a_missing_echo_degrades_a_quiet_channel_and_down_wins() -> None:
    clock = Clock()
    live = Liveness(receive="gateway event", limit=5.0, clock=clock, silence=False)
    clock.now += 100  # a quiet server is fine
    assert live.state(True) == ("connected", None)
    live.expect_echo()
    clock.now += 6
    assert live.state(True)[0] == "degraded"
    live.received()
    assert live.state(True) == ("connected", None)
    live.down("token refused")
    assert live.state(True) == ("down", "token refused")
    assert live.state(False) == ("down", "token refused")
    live.down(None)
    assert live.state(False) == ("down", "not running")
