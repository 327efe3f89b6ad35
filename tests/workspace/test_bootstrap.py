"""Bootstrap files: cut with a visible marker, within per-file and total limits, cached."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from workspace.bootstrap import BOOTSTRAP_FILES, BootstrapLoader, cut_middle, seed_workspace


def _text(n: int) -> str:
    """``n`` characters whose every position is recognisable (no whitespace to strip)."""
    return "".join(chr(ord("a") + (i * 7) % 26) for i in range(n))


def _bump(path: Path, seconds: int = 10) -> None:
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + seconds * 1_000_000_000))


# cut_middle ---------------------------------------------------------------------------------

def test_cut_middle_keeps_short_text() -> None:
    text = _text(1000)
    assert cut_middle(text, 1000, "SOUL.md") == (text, False)


def test_cut_middle_keeps_head_and_tail_with_marker() -> None:
    text = _text(10_000)
    out, cut = cut_middle(text, 2_000, "AGENTS.md")
    assert cut
    assert out.startswith(text[:1400])
    assert out.endswith(text[-400:])
    head, _, rest = out.partition("\n\n[…")
    assert head == text[:1400]
    marker, _, tail = rest.partition("…]\n\n")
    assert tail == text[-400:]
    assert "8,200 characters of AGENTS.md" in marker
    assert "2,000-character limit" in marker
    assert len(out) < len(text)


# BootstrapLoader ----------------------------------------------------------------------------

def _loader(ws: Path, max_chars: int = 20_000, total: int = 150_000) -> BootstrapLoader:
    return BootstrapLoader(ws, max_chars=max_chars, total_max_chars=total)


def test_files_within_limits_are_unchanged(tmp_path: Path) -> None:
    (tmp_path / "SOUL.md").write_text("  be kind  \n\n")
    (tmp_path / "USER.md").write_text("# User\nlikes tea")
    files = _loader(tmp_path).load(BOOTSTRAP_FILES)
    assert [(f.name, f.text, f.cut) for f in files] == [
        ("SOUL.md", "be kind", None), ("USER.md", "# User\nlikes tea", None)]
    assert files[1].chars == len("# User\nlikes tea")


def test_empty_and_missing_files_are_skipped(tmp_path: Path) -> None:
    (tmp_path / "SOUL.md").write_text("")
    (tmp_path / "IDENTITY.md").write_text("   \n\n ")
    (tmp_path / "TOOLS.md").write_text("tools")
    (tmp_path / "AGENTS.md").mkdir()  # not a file: skipped, not a crash
    assert [f.name for f in _loader(tmp_path).load(BOOTSTRAP_FILES)] == ["TOOLS.md"]


def test_per_file_limit(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    big = _text(5_000)
    (tmp_path / "AGENTS.md").write_text(big)
    (tmp_path / "USER.md").write_text("small")
    with caplog.at_level(logging.WARNING, logger="workspace.bootstrap"):
        files = _loader(tmp_path, max_chars=1_000).load(BOOTSTRAP_FILES)
    agents, user = files
    assert agents.chars == 5_000
    assert agents.text.startswith(big[:700]) and agents.text.endswith(big[-200:])
    assert "AGENTS.md cut here to fit the 1,000-character limit" in agents.text
    assert agents.cut == "cut from 5,000 to 1,000 characters"
    assert user.cut is None and user.text == "small"
    assert any("AGENTS.md" in r.getMessage() and r.levelno == logging.WARNING
               for r in caplog.records)


def test_total_limit_cuts_later_files(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    first, second = _text(900), _text(3_000)[::-1]
    (tmp_path / "SOUL.md").write_text(first)
    (tmp_path / "AGENTS.md").write_text(second)
    (tmp_path / "TOOLS.md").write_text(_text(500))
    with caplog.at_level(logging.WARNING, logger="workspace.bootstrap"):
        soul, agents, tools = _loader(tmp_path, max_chars=10_000, total=1_900).load(
            BOOTSTRAP_FILES)
    assert soul.text == first and soul.cut is None
    assert agents.cut == "cut from 3,000 to 1,000 characters (bootstrap total limit 1,900)"
    assert agents.text.startswith(second[:700]) and agents.text.endswith(second[-200:])
    assert "2,100 characters of AGENTS.md cut here" in agents.text
    # what is left after the cut file is too little for another file: left out, and said so
    assert tools.text == "" and tools.chars == 500
    assert tools.cut == "left out: the bootstrap total limit of 1,900 characters was reached"
    warned = " ".join(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    assert "AGENTS.md" in warned and "TOOLS.md" in warned


def test_file_cut_by_both_limits_has_one_true_marker(tmp_path: Path) -> None:
    """Over the per-file limit and then the total: the marker counts what was really cut."""
    big = _text(20_000)
    (tmp_path / "SOUL.md").write_text(_text(1_500))
    (tmp_path / "AGENTS.md").write_text(big)
    _, agents = _loader(tmp_path, max_chars=2_000, total=2_500).load(BOOTSTRAP_FILES)
    assert agents.text.count("cut here") == 1
    assert agents.text.startswith(big[:700]) and agents.text.endswith(big[-200:])
    assert "19,100 characters of AGENTS.md cut here to fit the 1,000-character limit" \
        in agents.text


def test_unchanged_file_is_not_read_again(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "SOUL.md"
    path.write_text("first")
    reads: list[str] = []
    real = Path.read_text

    def counting(self: Path, *args: object, **kwargs: object) -> str:
        reads.append(self.name)
        return real(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "read_text", counting)
    loader = _loader(tmp_path)
    assert loader.load(("SOUL.md",))[0].text == "first"
    assert loader.load(("SOUL.md",))[0].text == "first"
    assert reads == ["SOUL.md"]

    path.write_text("second")
    _bump(path)
    assert loader.load(("SOUL.md",))[0].text == "second"
    assert reads == ["SOUL.md", "SOUL.md"]


def test_removed_file_disappears(tmp_path: Path) -> None:
    path = tmp_path / "SOUL.md"
    path.write_text("soul")
    loader = _loader(tmp_path)
    assert [f.name for f in loader.load(("SOUL.md",))] == ["SOUL.md"]
    path.unlink()
    assert loader.load(("SOUL.md",)) == []


def test_signature_follows_files(tmp_path: Path) -> None:
    loader = _loader(tmp_path)
    before = loader.signature(("SOUL.md", "USER.md"))
    assert before == (None, None)
    (tmp_path / "SOUL.md").write_text("soul")
    after = loader.signature(("SOUL.md", "USER.md"))
    assert after[0] is not None and after[1] is None
    assert loader.signature(("SOUL.md", "USER.md")) == after
    _bump(tmp_path / "SOUL.md")
    assert loader.signature(("SOUL.md", "USER.md")) != after


# seed_workspace -----------------------------------------------------------------------------

TEMPLATES = ("SOUL.md", "IDENTITY.md", "AGENTS.md", "USER.md", "TOOLS.md", "HEARTBEAT.md",
             "MEMORY.md")


def test_seed_writes_templates(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    written = seed_workspace(ws)
    for name in TEMPLATES:
        assert (ws / name).is_file() and (ws / name).read_text().strip(), name
        assert ws / name in written
    skills = sorted(ws.glob("skills/*/SKILL.md"))
    assert skills and all(p in written for p in skills)
    assert not [p for p in ws.rglob("*") if p.is_file() and p.suffix != ".md"]


def test_seed_keeps_existing_files(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "SOUL.md").write_text("my own soul")
    written = seed_workspace(ws)
    assert (ws / "SOUL.md").read_text() == "my own soul"
    assert ws / "SOUL.md" not in written
    assert ws / "USER.md" in written
    assert seed_workspace(ws) == []  # a second run changes nothing
    assert ws / "SOUL.md" in seed_workspace(ws, overwrite=True)
    assert (ws / "SOUL.md").read_text() != "my own soul"
