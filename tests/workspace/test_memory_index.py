"""The memory recall's FTS5 index (``workspace/memory_index.py``): trigram matching in any
script, hostile query text, incremental re-indexing, and old logs found among many."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pytest

from agent.budget import TokenCounter
from gateway.kernel import fts
from gateway.kernel.config import MemoryConfig
from workspace import memory_index
from workspace.memory import MemoryStore, person_scope

COUNTER = TokenCounter("openai/gpt-4o-mini")
WHEN = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)


def logs(ws: Path, days: dict[str, str]) -> None:
    (ws / "memory").mkdir(parents=True, exist_ok=True)
    for day, body in days.items():
        (ws / "memory" / f"{day}.md").write_text(f"# {day}\n\n{body}\n")


def test_this_sqlite_has_the_trigram_tokenizer() -> None:
    assert memory_index.TOKENIZER == "trigram"  # SQLite 3.34+; the fallback is tested below


def test_a_cjk_word_in_a_daily_log_is_found(tmp_path: Path) -> None:
    logs(tmp_path, {"2026-11-18": "[10:00] 和田さんと東京タワーに行った。夜は寿司。",
                    "2026-11-19": "[09:00] Called the bank about the card."})
    s = MemoryStore(tmp_path)
    hits = s.search("東京タワー")
    assert [h.path for h in hits] == ["memory/2026-11-18.md"]
    # a sentence is one \w run in Japanese: its trigrams find the note sharing its words
    block = s.recall("東京タワーはどこでしたか", counter=COUNTER)
    assert block is not None and "東京タワー" in block and "bank" not in block
    assert s.search("大阪城") == []


@pytest.mark.parametrize("query", [
    '"', '""', "*", "NEAR(", "NEAR(dentist", "-", "-dentist", ":", "body:dentist",
    "dentist*", '"dentist', "^dentist", "AND OR NOT", "(((", ")", "{body}: x",
    "'; DROP TABLE para; --", "%_\\", "dentist NEAR/2 insurance", "\x00", "a" * 5000,
])
def test_hostile_query_text_does_not_raise(tmp_path: Path, query: str) -> None:
    logs(tmp_path, {"2026-11-18": "[09:10] Booked the dentist; bring the insurance card."})
    s = MemoryStore(tmp_path)
    s.search(query, 10)
    s.recall(query, counter=COUNTER, min_score=0)
    if "dentist" in query:  # the word is still looked for, the syntax is only text
        assert [h.path for h in s.search(query)] == ["memory/2026-11-18.md"]
    assert s.search("dentist")  # the table is intact


def test_an_unchanged_memory_folder_is_not_re_indexed(tmp_path: Path) -> None:
    logs(tmp_path, {f"2026-11-{d:02d}": f"[09:00] day {d}: the {'garden' if d < 5 else 'bills'}"
                    for d in range(1, 21)})
    s = MemoryStore(tmp_path)
    assert s.recall("garden", counter=COUNTER)
    assert s.index.files_indexed == 20
    assert s.recall("garden day 3", counter=COUNTER)
    assert s.search("garden") and s.index.files_indexed == 20  # nothing parsed or written
    s.remember("The garden gate needs oil.", kind="log", when=WHEN)
    assert "gate" in s.search("garden gate")[0].text
    assert s.index.files_indexed == 21  # only the log that was written
    s.search("garden gate")
    assert s.index.files_indexed == 21


def test_a_word_from_a_log_300_files_back_is_found(tmp_path: Path) -> None:
    first = date(2025, 1, 1)
    days = {str(first + timedelta(days=n)): f"[09:00] stand-up, ticket {n}\n\n[13:00] lunch"
            for n in range(301)}
    days[str(first)] += "\n\n[17:00] the zeppelin museum sent the tickets"
    logs(tmp_path, days)
    s = MemoryStore(tmp_path)
    hits = s.search("what about the zeppelin museum?")
    assert [(h.path, h.line) for h in hits] == [(f"memory/{first}.md", 7)]
    block = s.recall("zeppelin", counter=COUNTER)
    assert block is not None and "zeppelin museum" in block


def test_short_words_match_unranked_and_are_never_recalled(tmp_path: Path) -> None:
    logs(tmp_path, {"2026-11-01": "[09:00] Room 42 is booked.",
                    "2026-11-02": "[09:00] Room 42 again, and a TV."})
    s = MemoryStore(tmp_path)
    assert [h.path for h in s.search("42")] == ["memory/2026-11-02.md", "memory/2026-11-01.md"]
    assert {h.score for h in s.search("42")} == {0.0}
    assert s.recall("42", counter=COUNTER, min_score=0) is None


def test_each_scope_has_its_own_index(tmp_path: Path) -> None:
    config = MemoryConfig()
    ann = MemoryStore(tmp_path, config, scope=person_scope("telegram:1"))
    bob = MemoryStore(tmp_path, config, scope=person_scope("telegram:2"))
    ann.remember("My locker code is 7731, the blue locker.", kind="log", when=WHEN)
    assert ann.search("locker code")
    assert bob.search("locker code") == [] and bob.index is not ann.index
    bob.recall("locker code", counter=COUNTER)
    assert ann.index.opened and not bob.index.opened  # no notes: no SQLite connection held


def test_fallback_without_trigram_matches_words_and_plurals(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memory_index, "TOKENIZER", "unicode61")
    logs(tmp_path, {"2026-11-18": "[12:00] Anna would like chocolate cakes for her party.",
                    "2026-11-19": "[08:00] The car goes to the garage."})
    s = MemoryStore(tmp_path)
    assert s.search("cake")[0].path == "memory/2026-11-18.md"
    assert s.search('NEAR( "car" -') and s.search("quantum") == []


def test_match_expressions_quote_every_term() -> None:
    assert fts.match_expr(['a"b', "NEAR("], "AND") == '"a""b" AND "NEAR("'
    assert fts.match_expr(["cake"], prefix=True) == '"cake"*'
    with pytest.raises(ValueError, match="joiner"):
        fts.match_expr(["x"], "NOT")
    assert fts.cjk_grams(["東京タワー", "dentist", "東京"]) == [
        "東京タ", "京タワ", "タワー", "dentist", "東京"]
