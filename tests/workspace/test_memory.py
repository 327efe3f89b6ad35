"""Memory files: writes, FTS5 bm25 search over paragraphs, the per-file cache and recall."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path

import pytest

from agent.budget import TokenCounter
from gateway.kernel.config import MemoryConfig
from workspace import memory as memory_mod
from workspace.bootstrap import seed_workspace
from workspace.memory import (
    MAX_CHUNK_CHARS,
    RECALL_HEADER,
    MemoryRefused,
    MemoryStore,
    memory_store_for,
    split_paragraphs,
)

WHEN = datetime(2026, 11, 20, 23, 30, tzinfo=UTC)
COUNTER = TokenCounter("openai/gpt-4o-mini")

LOG = """# 2026-11-18

[09:10] Booked the dentist for Tuesday at 10:00 with Dr. Weber; bring the insurance card.

[12:00] Anna's birthday party is on Saturday. She would like a chocolate cake.

[15:45] Discussed the Parley release plan: beta in April, launch in May, docs first.

[18:20] Paid the electricity bill for October, 84 euros.
"""


def store(ws: Path, **config: object) -> MemoryStore:
    return MemoryStore(ws, MemoryConfig(**config), timezone="Europe/Berlin")  # type: ignore[arg-type]


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    path = tmp_path / "ws"
    (path / "memory").mkdir(parents=True)
    (path / "memory" / "2026-11-18.md").write_text(LOG)
    (path / "memory" / "2026-11-19.md").write_text(
        "# 2026-11-19\n\n[08:00] The car goes to the garage on Friday for new tyres.\n")
    return path


# writing -------------------------------------------------------------------------------------


def test_fact_appends_to_memory_md_keeping_what_is_there(tmp_path: Path) -> None:
    seed_workspace(tmp_path)
    template = (tmp_path / "MEMORY.md").read_text()
    saved = store(tmp_path).remember("The user's name is Sam.", when=WHEN)
    assert (saved.path, saved.written) == ("MEMORY.md", True)
    assert (tmp_path / "MEMORY.md").read_text() == template + "\n- The user's name is Sam.\n"

    store(tmp_path).remember("Prefers tea\n\n  over coffee  ", kind="fact", when=WHEN)
    assert (tmp_path / "MEMORY.md").read_text().endswith(
        "- The user's name is Sam.\n\n- Prefers tea\n    over coffee\n")


def test_fact_creates_memory_md_when_missing(tmp_path: Path) -> None:
    store(tmp_path).remember("Sam lives in Lyon.", when=WHEN)
    assert (tmp_path / "MEMORY.md").read_text() == "# Memory\n\n- Sam lives in Lyon.\n"


@pytest.mark.parametrize(("tz", "day", "stamp"), [
    ("Europe/Berlin", "2026-11-21", "[00:30]"),  # past midnight in Berlin: the next day's log
    ("America/New_York", "2026-11-20", "[18:30]"),
])
def test_log_goes_to_the_local_day(tmp_path: Path, tz: str, day: str, stamp: str) -> None:
    s = MemoryStore(tmp_path, timezone=tz)
    assert s.remember("Called the bank.", kind="log", when=WHEN).path == f"memory/{day}.md"
    s.remember("Bank says the card arrives Monday.", kind="log", when=WHEN)
    assert (tmp_path / "memory" / f"{day}.md").read_text() == (
        f"# {day}\n\n{stamp} Called the bank.\n\n{stamp} Bank says the card arrives Monday.\n")


def test_append_to_a_file_without_final_newline(tmp_path: Path) -> None:
    (tmp_path / "MEMORY.md").write_text("# Memory\n\n- one")
    store(tmp_path).remember("two", when=WHEN)
    assert (tmp_path / "MEMORY.md").read_text() == "# Memory\n\n- one\n\n- two\n"


def test_exact_repeats_are_not_written_twice(tmp_path: Path) -> None:
    (tmp_path / "MEMORY.md").write_text("# Memory\n\n- Likes tea\n- Sam lives in Lyon.\n")
    s = store(tmp_path)
    before = (tmp_path / "MEMORY.md").read_bytes()
    saved = s.remember("  sam LIVES in   lyon. ", when=WHEN)
    assert not saved.written and (tmp_path / "MEMORY.md").read_bytes() == before

    assert s.remember("Called the bank.", kind="log", when=WHEN).written
    later = WHEN.replace(hour=23, minute=55)
    assert not s.remember("called the bank.", kind="log", when=later).written
    assert (tmp_path / "memory" / "2026-11-21.md").read_text().count("bank") == 1


def test_memory_md_size_guard_asks_to_consolidate(tmp_path: Path) -> None:
    s = store(tmp_path, max_memory_chars=200)
    s.remember("x" * 120, when=WHEN)
    before = (tmp_path / "MEMORY.md").read_bytes()
    with pytest.raises(MemoryRefused, match="full") as info:
        s.remember("y" * 70, when=WHEN)  # 133 + 74 characters > 200
    assert "rewrite MEMORY.md shorter" in str(info.value) and "kind=log" in str(info.value)
    assert (tmp_path / "MEMORY.md").read_bytes() == before
    assert s.remember("y" * 60, kind="log", when=WHEN).written  # logs are not capped this way


def test_refusals(tmp_path: Path) -> None:
    s = store(tmp_path, daily_log=False)
    with pytest.raises(MemoryRefused, match="empty"):
        s.remember(" \n ", when=WHEN)
    with pytest.raises(MemoryRefused, match="under 2,000"):
        s.remember("z" * 2001, when=WHEN)
    with pytest.raises(MemoryRefused, match="daily logs are turned off"):
        s.remember("a note", kind="log", when=WHEN)
    with pytest.raises(ValueError, match="timezone-aware"):
        s.remember("a note", when=datetime(2026, 1, 1))  # noqa: DTZ001
    assert not (tmp_path / "MEMORY.md").exists() and not (tmp_path / "memory").exists()


def test_write_keeps_bytes_mode_and_symlink(tmp_path: Path) -> None:
    real = tmp_path / "dotfiles" / "MEMORY.md"
    real.parent.mkdir()
    real.write_bytes(b"# Memory\n\n- caf\xe9 in latin-1\n")
    real.chmod(0o640)
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "MEMORY.md").symlink_to(real)
    store(ws).remember("new fact", when=WHEN)
    assert (ws / "MEMORY.md").is_symlink()
    assert real.read_bytes() == b"# Memory\n\n- caf\xe9 in latin-1\n\n- new fact\n"
    assert real.stat().st_mode & 0o777 == 0o640
    assert [p.name for p in real.parent.iterdir()] == ["MEMORY.md"]  # no temp file left


async def test_concurrent_remembers_all_land(tmp_path: Path) -> None:
    s = store(tmp_path, max_memory_chars=100_000)
    facts = [f"fact number {i} about topic {i * 7}" for i in range(20)]
    await asyncio.gather(*(asyncio.to_thread(s.remember, f, when=WHEN) for f in facts),
                         *(asyncio.to_thread(s.remember, f, kind="log", when=WHEN)
                           for f in facts))
    memory = (tmp_path / "MEMORY.md").read_text()
    log = (tmp_path / "memory" / "2026-11-21.md").read_text()
    for fact in facts:
        assert f"\n- {fact}\n" in memory and f"[00:30] {fact}\n" in log


# paragraphs ----------------------------------------------------------------------------------


def test_paragraphs_title_headings_placeholders_and_long_ones() -> None:
    long_line = " ".join(["word"] * 400)  # 1,999 characters on one line
    text = ("# Memory\n\n(Long-term facts worth remembering.)\n\n## Projects\n\n"
            "Parley ships in May.\nBeta in April.\n\n## Empty\n\n(nothing yet)\n\n"
            f"plain paragraph\n\n{long_line}\n")
    paragraphs = split_paragraphs(text)
    assert paragraphs[0] == (5, "## Projects\nParley ships in May.\nBeta in April.")
    assert paragraphs[1] == (14, "plain paragraph")
    pieces = paragraphs[2:]
    assert len(pieces) == 3 and all(len(p) <= MAX_CHUNK_CHARS for _, p in pieces)
    assert " ".join(p for _, p in pieces) == long_line and {n for n, _ in pieces} == {16}


def test_long_paragraph_under_a_heading_keeps_true_line_numbers() -> None:
    lines = [f"- item {i} " + "x" * 90 for i in range(12)]
    pieces = split_paragraphs("## Heading\n\n" + "\n".join(lines))
    assert pieces[0][0] == 1 and pieces[0][1].startswith("## Heading\n- item 0 ")
    assert len(pieces) == 2 and pieces[1][1].startswith(lines[pieces[1][0] - 3])


def test_many_lines_split_between_lines() -> None:
    lines = [f"- item {i} " + "x" * 90 for i in range(20)]
    pieces = split_paragraphs("\n".join(lines))
    assert all(len(p) <= MAX_CHUNK_CHARS for _, p in pieces)
    assert "\n".join(p for _, p in pieces) == "\n".join(line.rstrip() for line in lines)
    assert len(pieces) == 3
    assert all(p.startswith(lines[n - 1]) for n, p in pieces)  # line numbers point at the start


# search --------------------------------------------------------------------------------------


def test_relevant_paragraph_ranks_first(ws: Path) -> None:
    s = store(ws)
    hits = s.search("when is my dentist appointment?")
    assert hits[0].path == "memory/2026-11-18.md" and hits[0].line == 3
    assert "Dr. Weber" in hits[0].text
    top = s.search("what did we decide about the release plan")[0]
    assert "beta in April" in top.text
    assert "cake" in s.search("Anna's birthday cakes")[0].text  # plural matches singular
    assert "tyres" in s.search("car garage")[0].text


def test_no_shared_words_gives_nothing(ws: Path) -> None:
    s = store(ws)
    assert s.search("quantum physics homework") == []
    assert s.search("hello, how are you?") == []  # stopwords only
    assert s.search("10") and s.search("14:05") == []  # times stamp entries, they don't match


def test_template_placeholders_never_match(tmp_path: Path) -> None:
    seed_workspace(tmp_path)
    s = store(tmp_path)
    assert s.search("long-term facts worth remembering across conversations") == []


def test_search_is_deterministic_with_ties_by_path_then_position(tmp_path: Path) -> None:
    (tmp_path / "memory").mkdir()
    for day in ("2026-11-03", "2026-11-01", "2026-11-02"):
        (tmp_path / "memory" / f"{day}.md").write_text(
            f"# {day}\n\nwatered the plants\n\nwatered the plants\n\nunrelated note\n")
    hits = store(tmp_path).search("plants", 10)
    assert [(h.path, h.line) for h in hits] == [
        (f"memory/2026-11-0{d}.md", line) for d in (1, 2, 3) for line in (3, 5)]
    again = MemoryStore(tmp_path).search("plants", 10)
    assert again == hits


def test_sources_logs_leaves_memory_md_out(ws: Path) -> None:
    (ws / "MEMORY.md").write_text("# Memory\n\n- The dentist is Dr. Weber in Lyon.\n")
    s = store(ws)
    assert {h.path for h in s.search("dentist Lyon", sources="all")} == {
        "MEMORY.md", "memory/2026-11-18.md"}
    assert {h.path for h in s.search("dentist Lyon", sources="logs")} == {"memory/2026-11-18.md"}


def test_unchanged_files_are_not_read_again(ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    reads: list[str] = []
    original = Path.read_bytes

    def counting(self: Path) -> bytes:
        reads.append(self.name)
        return original(self)

    monkeypatch.setattr(Path, "read_bytes", counting)
    s = store(ws)
    first = s.search("dentist")
    assert sorted(reads) == ["2026-11-18.md", "2026-11-19.md"]
    reads.clear()
    assert s.search("dentist") == first and s.recall("dentist", counter=COUNTER)
    assert reads == []

    (ws / "memory" / "2026-11-19.md").write_text("# 2026-11-19\n\nMoved the dentist to May.\n")
    hits = s.search("dentist")
    assert reads == ["2026-11-19.md"]
    assert {h.path for h in hits} == {"memory/2026-11-18.md", "memory/2026-11-19.md"}

    (ws / "memory" / "2026-11-19.md").unlink()
    reads.clear()
    assert {h.path for h in s.search("dentist")} == {"memory/2026-11-18.md"}
    assert reads == []


def test_own_write_is_seen_by_the_next_search(ws: Path) -> None:
    s = store(ws)
    assert s.search("passport") == []
    s.remember("Passport renewal is due in March.", kind="log", when=WHEN)
    assert s.search("passport")[0].path == "memory/2026-11-21.md"


# recall --------------------------------------------------------------------------------------


def test_recall_block_and_nothing_for_small_talk(ws: Path) -> None:
    s = store(ws)
    block = s.recall("Remind me, when is the dentist?", counter=COUNTER)
    assert block == (f"{RECALL_HEADER}\n- [memory/2026-11-18.md] [09:10] Booked the dentist "
                     "for Tuesday at 10:00 with Dr. Weber; bring the insurance card.")
    assert s.recall("hello", counter=COUNTER) is None
    assert s.recall("thanks, that's great", counter=COUNTER) is None
    assert s.recall("dentist", counter=COUNTER, max_items=0) is None


@pytest.mark.parametrize("cap", [12, 20, 30, 45, 60, 80, 300])
def test_recall_never_exceeds_its_token_cap(ws: Path, cap: int) -> None:
    query = "dentist birthday cake release plan electricity bill garage"
    block = store(ws).recall(query, counter=COUNTER, max_tokens=cap, max_items=5, min_score=0)
    if block is not None:
        assert COUNTER.count_text(block) <= cap
        assert block.startswith(RECALL_HEADER + "\n- [memory/")
    if cap >= 30:
        assert block is not None
    if cap == 300:
        assert block is not None and block.count("\n- [") == 5 and "…" not in block


def test_recall_cuts_the_last_item_at_a_word(ws: Path) -> None:
    full = store(ws).recall("dentist insurance", counter=COUNTER, min_score=0)
    assert full is not None
    cap = COUNTER.count_text(full) - 5
    cut = store(ws).recall("dentist insurance", counter=COUNTER, max_tokens=cap, min_score=0)
    assert cut is not None and cut.endswith(" …") and COUNTER.count_text(cut) <= cap
    assert full.startswith(cut.removesuffix(" …"))


def test_recall_min_score_items_and_sources(ws: Path) -> None:
    (ws / "MEMORY.md").write_text("# Memory\n\n## Health\n\n- Dentist: Dr. Weber, Lyon.\n")
    s = store(ws)
    assert s.recall("dentist", counter=COUNTER, min_score=100) is None
    logs_only = s.recall("dentist weber", counter=COUNTER)
    assert logs_only is not None and "MEMORY.md" not in logs_only
    everything = store(ws, recall_sources="all").recall("dentist weber", counter=COUNTER)
    assert everything is not None
    assert "- [MEMORY.md] Health: Dentist: Dr. Weber, Lyon." in everything.splitlines()
    one = s.recall("dentist cake bill", counter=COUNTER, max_items=1, min_score=0)
    assert one is not None and one.count("\n- [") == 1


def test_recall_skips_words_most_notes_share(tmp_path: Path) -> None:
    """Months of logs all naming the user: a greeting with the name recalls nothing."""
    (tmp_path / "memory").mkdir()
    topics = ["train tickets", "garden plants", "tax forms", "piano lesson", "bike repair"]
    for day in range(1, 29):
        notes = [f"[1{i}:00] Sam sorted out the {topic} (day {day})."
                 for i, topic in enumerate(topics)]
        (tmp_path / "memory" / f"2026-02-{day:02d}.md").write_text("\n\n".join(notes) + "\n")
    s = store(tmp_path)
    assert s.recall("Sam here, morning!", counter=COUNTER) is None
    block = s.recall("Sam: did the piano lesson happen?", counter=COUNTER)
    assert block is not None and block.count("piano lesson") == 3


def test_recall_is_deterministic(ws: Path) -> None:
    query = "cake for the birthday and the dentist"
    blocks = {MemoryStore(ws, timezone="UTC").recall(query, counter=COUNTER) for _ in range(3)}
    assert len(blocks) == 1 and None not in blocks


def test_memory_store_for_shares_one_instance(tmp_path: Path) -> None:
    config = MemoryConfig()
    a = memory_store_for(tmp_path, config, timezone="Europe/Berlin")
    assert memory_store_for(tmp_path, MemoryConfig(), timezone="Europe/Berlin") is a
    assert memory_store_for(tmp_path, config, timezone="UTC") is not a
    assert memory_store_for(tmp_path / "other", config, timezone="Europe/Berlin") is not a


def test_daily_logs_are_not_all_stat_ed_every_turn(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Years of daily logs: a search looks at the newest few and at the folder; an old log
    edited in place is seen at the next full listing, a new log at once."""
    logs = tmp_path / "memory"
    logs.mkdir()
    for day in range(1, 29):
        (logs / f"2025-02-{day:02d}.md").write_text(f"# 2025-02-{day:02d}\n\n[09:00] day {day}\n")
    now = [0.0]
    store = MemoryStore(tmp_path, clock=lambda: now[0])
    assert store.search("lighthouse") == []
    listings: list[object] = []
    real_scandir = memory_mod.os.scandir

    def counting_scandir(path: object) -> object:
        listings.append(path)
        return real_scandir(path)  # type: ignore[arg-type]

    monkeypatch.setattr(memory_mod.os, "scandir", counting_scandir)
    assert store.search("lighthouse") == []
    assert listings == []  # nothing changed: the folder is not listed, 28 files not stat-ed
    with (logs / "2025-02-28.md").open("a") as fh:  # today's log, appended in place
        fh.write("\n[18:00] visited the lighthouse\n")
    assert [h.path for h in store.search("lighthouse")] == ["memory/2025-02-28.md"]
    with (logs / "2025-02-02.md").open("a") as fh:  # an old log edited by hand, in place
        fh.write("\n[10:00] the lighthouse keeper called\n")
    assert len(store.search("lighthouse")) == 1  # not listed again yet
    (logs / "2025-03-01.md").write_text("# 2025-03-01\n\n[08:00] lighthouse tour booked\n")
    assert len(store.search("lighthouse")) == 3  # a new file changes the folder: listed again
    assert len(listings) == 1
    now[0] += memory_mod.FULL_RESCAN_SECONDS
    (logs / "2025-02-03.md").write_text(
        (logs / "2025-02-03.md").read_text() + "\n[11:00] lighthouse again\n")
    # same size folder, edited in place: the full listing after a minute finds it
    assert len(store.search("lighthouse")) == 4


def test_with_inotify_an_unchanged_memory_is_not_looked_at(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A search while nothing changed reads no folder and no file signature (one inotify
    read instead); an append, a new log, an edit of MEMORY.md or a folder made later are
    seen at the very next search."""
    if memory_mod._watch_look() is None:
        pytest.fail("no inotify here: the test cannot show what it is about")
    logs = tmp_path / "memory"
    logs.mkdir()
    (logs / "2025-02-27.md").write_text("# 2025-02-27\n\n[09:00] fed the heron\n")
    (tmp_path / "MEMORY.md").write_text("# Memory\n\n- likes herons\n")
    store = MemoryStore(tmp_path, MemoryConfig(recall_sources="all"))
    scans: list[int] = []
    real_scan = MemoryStore._scan

    def counting_scan(self: MemoryStore) -> object:
        scans.append(1)
        return real_scan(self)

    monkeypatch.setattr(MemoryStore, "_scan", counting_scan)
    assert len(store.search("heron")) == 2
    assert len(store.search("heron")) == 2
    assert len(scans) == 1  # the second search looked at nothing
    with (logs / "2025-02-27.md").open("a") as fh:  # appended in place
        fh.write("\n[18:00] the heron again\n")
    assert len(store.search("heron")) == 3
    (tmp_path / "MEMORY.md").write_text("# Memory\n\n- likes herons\n- a heron named Bo\n")
    assert any("named Bo" in h.text for h in store.search("heron"))
    (logs / "2025-02-28.md").write_text("# 2025-02-28\n\n[08:00] heron flew off\n")
    assert len(store.search("heron")) == 4
    assert len(scans) == 4
    assert len(store.search("heron")) == 4 and len(scans) == 4


def test_memory_folder_made_after_the_first_search_is_seen(tmp_path: Path) -> None:
    store = MemoryStore(tmp_path)
    assert store.search("otter") == []
    (tmp_path / "memory").mkdir()
    assert store.search("otter") == []
    (tmp_path / "memory" / "2025-02-27.md").write_text("# 2025-02-27\n\n[09:00] an otter\n")
    assert [h.path for h in store.search("otter")] == ["memory/2025-02-27.md"]
