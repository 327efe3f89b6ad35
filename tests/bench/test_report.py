"""``bench/report.py``: each kind of turn gets its own storage rows, and the plain turn's
kept bytes are judged against item 11's target (round eighteen's wake-up row had left them
outside the loop over the kinds: only the tool turn's were shown, unjudged)."""

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
