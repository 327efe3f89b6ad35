"""inotify instead of a stat per file per turn (issue 24): an unchanged workspace is known
unchanged without looking at its files, and a change is seen by the very next look."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from workspace.bootstrap import BootstrapLoader
from workspace.skills import SkillsIndex
from workspace.watch import Watch


@pytest.fixture
def watch() -> Iterator[Watch]:
    opened = Watch.open()
    assert opened is not None, "Linux has inotify"
    yield opened
    opened.close()


def test_the_generation_moves_only_when_a_covered_folder_changes(tmp_path: Path,
                                                                 watch: Watch) -> None:
    (tmp_path / "a").mkdir()
    assert watch.cover([tmp_path / "a", tmp_path / "later" / "deeper"])
    start = watch.look()
    (tmp_path / "elsewhere.txt").write_text("x")  # tmp_path is covered: for "later"
    moved = watch.look()
    assert moved > start and watch.look() == moved  # nothing since
    (tmp_path / "a" / "f.md").write_text("one")
    assert watch.look() > moved
    settled = watch.look()
    (tmp_path / "later" / "deeper").mkdir(parents=True)  # made: seen through its parent
    assert watch.look() > settled
    assert watch.cover([tmp_path / "later" / "deeper"])
    settled = watch.look()
    (tmp_path / "later" / "deeper" / "g.md").write_text("two")
    assert watch.look() > settled


def test_a_folder_removed_and_made_again_is_watched_again(tmp_path: Path,
                                                          watch: Watch) -> None:
    folder = tmp_path / "skills"
    folder.mkdir()
    assert watch.cover([folder])
    settled = watch.look()
    folder.rmdir()
    assert watch.look() > settled
    folder.mkdir()
    assert watch.cover([folder])
    settled = watch.look()
    (folder / "new").mkdir()
    assert watch.look() > settled


def test_workspace_files_are_not_looked_at_again_until_one_changes(tmp_path: Path,
                                                                   watch: Watch) -> None:
    loader = BootstrapLoader(tmp_path, max_chars=1000, total_max_chars=1000)
    loader.watch = watch
    names = ("SOUL.md", "USER.md", "notes/EXTRA.md")
    (tmp_path / "SOUL.md").write_text("be kind")
    first = loader.signature(names)
    assert loader.signature(names) is first  # the same answer, no stat made
    (tmp_path / "SOUL.md").write_text("be kind, and brief")  # same second, other size
    second = loader.signature(names)
    assert second != first and second[0] is not None
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "EXTRA.md").write_text("more")  # a file in a folder made later
    third = loader.signature(names)
    assert third[2] is not None
    (tmp_path / "notes" / "EXTRA.md").write_text("more and more")
    assert loader.signature(names)[2] != third[2]


def test_a_symlinked_file_is_looked_at_every_time(tmp_path: Path, watch: Watch) -> None:
    """A change at a link's target happens outside the watched folder: no event here."""
    outside = tmp_path / "outside"
    outside.mkdir()
    target = outside / "USER.md"
    target.write_text("Ana")
    ws = tmp_path / "ws"
    ws.mkdir()
    os.symlink(target, ws / "USER.md")
    loader = BootstrapLoader(ws, max_chars=1000, total_max_chars=1000)
    loader.watch = watch
    first = loader.signature(("USER.md",))
    target.write_text("Ana, who likes tea")
    assert loader.signature(("USER.md",)) != first


def test_a_skill_added_or_edited_is_seen_at_once(tmp_path: Path, watch: Watch) -> None:
    skills_dir = tmp_path / "skills"
    index = SkillsIndex([tmp_path / "missing", skills_dir])
    index.watch = watch
    assert index.skills() == []
    assert index.skills() == []
    (skills_dir / "weather").mkdir(parents=True)
    (skills_dir / "weather" / "SKILL.md").write_text(
        "---\nname: weather\ndescription: Look up the weather.\n---\nsteps")
    found = index.skills()
    assert [s.name for s in found] == ["weather"]
    assert index.skills() is found  # unchanged: the same list, nothing listed again
    (skills_dir / "weather" / "SKILL.md").write_text(
        "---\nname: weather\ndescription: The forecast, by city.\n---\nsteps")
    assert [s.description for s in index.skills()] == ["The forecast, by city."]
