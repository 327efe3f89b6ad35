"""Skills: frontmatter, availability, the cached index and folder priority."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from workspace.skills import Skill, SkillsIndex, parse_skill


def _write(root: Path, folder: str, text: str) -> Path:
    path = root / folder / "SKILL.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _bump(path: Path) -> None:
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10_000_000_000))


def _by_name(index: SkillsIndex) -> dict[str, Skill]:
    return {s.name: s for s in index.skills()}


# parse_skill --------------------------------------------------------------------------------

def test_parse_frontmatter_and_body() -> None:
    meta, body = parse_skill(Path("SKILL.md"), (
        "---\nname: weather\ndescription: Look up the weather.\nalways: true\n"
        "requires:\n  bins: [curl]\n  env: [WEATHER_KEY]\n---\n\n# Weather\nUse curl.\n"))
    assert meta == {"name": "weather", "description": "Look up the weather.", "always": True,
                    "requires": {"bins": ["curl"], "env": ["WEATHER_KEY"]}}
    assert body == "# Weather\nUse curl."


def test_no_frontmatter_is_all_body() -> None:
    assert parse_skill(Path("SKILL.md"), "# Just a body\n") == ({}, "# Just a body")


def test_bad_yaml_is_tolerated(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="workspace.skills"):
        meta, body = parse_skill(Path("x/SKILL.md"),
                                 "---\nname: [unclosed\n  : :\n---\nthe body\n")
    assert meta == {} and body == "the body"
    assert any("not valid YAML" in r.getMessage() for r in caplog.records)


# the index ----------------------------------------------------------------------------------

def test_index_reads_skills(tmp_path: Path) -> None:
    _write(tmp_path, "weather", "---\nname: weather\ndescription: Look up the weather.\n"
                                "always: true\n---\nUse the API.\n")
    _write(tmp_path, "plain", "No frontmatter at all.")
    (tmp_path / "empty-folder").mkdir()
    (tmp_path / "README.md").write_text("not a skill")
    skills = SkillsIndex([tmp_path]).skills()
    assert [s.name for s in skills] == ["plain", "weather"]
    plain, weather = skills
    assert weather.always and weather.available and weather.reason is None
    assert weather.description == "Look up the weather." and weather.body == "Use the API."
    assert weather.path == tmp_path / "weather" / "SKILL.md"
    assert plain.name == "plain" and not plain.always and plain.description == ""


def test_missing_folder_gives_no_skills(tmp_path: Path) -> None:
    assert SkillsIndex([tmp_path / "nope"]).skills() == []


def test_bad_frontmatter_skill_still_listed(tmp_path: Path) -> None:
    _write(tmp_path, "broken", "---\nname: [oops\n---\nbody here\n")
    (skill,) = SkillsIndex([tmp_path]).skills()
    assert skill.name == "broken" and skill.body == "body here" and skill.available


def test_availability(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "parley-test-tool"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setenv("PARLEY_TEST_SKILL_KEY", "set")
    monkeypatch.delenv("PARLEY_TEST_SKILL_MISSING", raising=False)
    _write(tmp_path, "ok", "---\nrequires:\n  bins: [parley-test-tool]\n"
                           "  env: [PARLEY_TEST_SKILL_KEY]\n---\nbody")
    _write(tmp_path, "nobin", "---\nrequires:\n  bins: [parley-no-such-command-xyz]\n---\nb")
    _write(tmp_path, "noenv", "---\nrequires:\n  env: [PARLEY_TEST_SKILL_MISSING]\n---\nb")
    _write(tmp_path, "onebin", "---\nrequires:\n  bins: parley-no-such-command-xyz\n---\nb")
    skills = _by_name(SkillsIndex([tmp_path]))
    assert skills["ok"].available and skills["ok"].reason is None
    assert not skills["nobin"].available
    assert skills["nobin"].reason == "missing command parley-no-such-command-xyz"
    assert not skills["noenv"].available
    assert skills["noenv"].reason == "missing env PARLEY_TEST_SKILL_MISSING"
    # a single command written as a string is one command, not a list of letters
    assert skills["onebin"].reason == "missing command parley-no-such-command-xyz"


def test_env_requirement_met_by_environment(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    _write(tmp_path, "keyed", "---\nrequires:\n  env: [PARLEY_TEST_SKILL_KEY]\n---\nb")
    monkeypatch.delenv("PARLEY_TEST_SKILL_KEY", raising=False)
    assert not SkillsIndex([tmp_path]).skills()[0].available
    monkeypatch.setenv("PARLEY_TEST_SKILL_KEY", "x")
    assert SkillsIndex([tmp_path]).skills()[0].available


def test_summary_line(tmp_path: Path) -> None:
    _write(tmp_path / "skills", "ok", "---\ndescription: Does things.\n---\nb")
    _write(tmp_path / "skills", "nobin",
           "---\ndescription: Needs a tool.\nrequires:\n  bins: [parley-no-such-cmd]\n---\nb")
    skills = _by_name(SkillsIndex([tmp_path / "skills"]))
    assert skills["ok"].summary_line(tmp_path) == (
        "- ok: Does things. (path: skills/ok/SKILL.md; available)")
    assert skills["nobin"].summary_line(tmp_path) == (
        "- nobin: Needs a tool. (path: skills/nobin/SKILL.md; "
        "unavailable: missing command parley-no-such-cmd)")
    # outside the workspace the full path is shown
    other = tmp_path / "elsewhere"
    assert str(skills["ok"].path) in skills["ok"].summary_line(other)


def test_cache_is_kept_until_a_skill_changes(tmp_path: Path) -> None:
    path = _write(tmp_path, "one", "---\ndescription: first\n---\nb")
    index = SkillsIndex([tmp_path])
    first = index.skills()
    assert index.skills() is first  # nothing changed: not scanned again
    (tmp_path / "not-a-skill").mkdir()
    assert index.skills() is first

    path.write_text("---\ndescription: second\n---\nb")
    _bump(path)
    second = index.skills()
    assert second is not first and second[0].description == "second"
    assert index.skills() is second

    _write(tmp_path, "two", "---\ndescription: new\n---\nb")
    third = index.skills()
    assert [s.name for s in third] == ["one", "two"]

    (tmp_path / "two" / "SKILL.md").unlink()
    (tmp_path / "two").rmdir()
    assert [s.name for s in index.skills()] == ["one"]


def test_later_folder_overrides_earlier(tmp_path: Path) -> None:
    builtin, workspace = tmp_path / "builtin", tmp_path / "workspace"
    _write(builtin, "shared", "---\ndescription: builtin version\n---\nold")
    _write(builtin, "only-builtin", "---\ndescription: b\n---\nb")
    _write(workspace, "shared", "---\ndescription: workspace version\n---\nnew")
    skills = _by_name(SkillsIndex([builtin, workspace]))
    assert sorted(skills) == ["only-builtin", "shared"]
    assert skills["shared"].description == "workspace version"
    assert skills["shared"].path == workspace / "shared" / "SKILL.md"
    # and the other way round the builtin one wins
    assert _by_name(SkillsIndex([workspace, builtin]))["shared"].body == "old"


def test_frontmatter_name_overrides_folder_name(tmp_path: Path) -> None:
    builtin, workspace = tmp_path / "builtin", tmp_path / "workspace"
    _write(builtin, "weather", "---\nname: weather\n---\nold")
    _write(workspace, "my-weather", "---\nname: weather\n---\nmine")
    (skill,) = SkillsIndex([builtin, workspace]).skills()
    assert skill.name == "weather" and skill.body == "mine"
