"""``bench/report.py``: each kind of turn gets its own storage rows, and the plain turn's
kept bytes are judged against item 11's target (round eighteen's wake-up row had left them
outside the loop over the kinds: only the tool turn's were shown, unjudged); item 1's 1 ms
is judged on the busy gateway, the one-chat series shown beside it."""

from __future__ import annotations

from bench.report import checks


def _stored(kept: int) -> dict[str, object]:
    return {"stored_bytes_per_turn": {"all": 3000, "second_half": 3100,
                                      "kept_second_half": kept + 50},
            "kept_bytes_long": {"turns": 800, "kept": kept}}


def test_every_kind_of_turn_has_its_storage_rows_and_the_plain_one_is_judged() -> None:
    rows = checks({"turns": {"plain": _stored(1398), "tool": _stored(2263)},
                   "wakeup": {"other_cpu": {"cpu_us": 45.0}, "same_cpu": {"cpu_us": 8.0}}})
    kept = {row.figure.split(":")[0]: row for row in rows
            if "kept past retention's hours per turn" in row.figure}
    assert set(kept) == {"plain", "tool"}
    assert kept["plain"].value == 1398 and kept["plain"].target == "≤ 1,536 B"
    assert kept["plain"].ok is True
    assert kept["tool"].value == 2263 and kept["tool"].ok is None
    over = checks({"turns": {"plain": _stored(1600)}})
    assert [row.ok for row in over
            if row.figure.startswith("plain: kept past retention's hours")] == [False]


def test_the_one_ms_target_is_judged_on_the_busy_gateway_and_one_chat_is_shown() -> None:
    """Item 1's ≤ 1 ms is the CPU a plain turn takes while the gateway is busy (the issue's
    "~2.5 ms caps one core at ~400 turns/s"); the one-chat series is shown beside it."""
    def rows(one_chat: float, busy: float) -> dict[str, tuple[float | None, bool | None]]:
        data = {"turns": {"plain": {"cpu_ms_per_turn": {"gateway": one_chat}}},
                "throughput": {"100": {"cpu_ms_per_turn": {"gateway": busy}}}}
        return {row.figure: (row.value, row.ok) for row in checks(data)
                if row.item == "1" and "CPU per" in row.figure and "plain" in row.figure}

    shown = rows(1.17, 0.84)
    busy = [v for k, v in shown.items() if k.startswith("gateway CPU per plain turn, busy")]
    lone = [v for k, v in shown.items() if k.startswith("plain turn: gateway CPU per turn, one")]
    assert busy == [(0.84, True)] and lone == [(1.17, None)]
    assert [v for k, v in rows(0.9, 1.04).items() if "busy" in k] == [(1.04, False)]
