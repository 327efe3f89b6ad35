"""``make bench`` item 9 still runs: the documents are read within the budget and the sweep
removes nothing fresh."""

from __future__ import annotations

from pathlib import Path

from bench import media_cost


def test_the_media_probe_runs(tmp_path: Path) -> None:
    figures = media_cost.measure(tmp_path, 1)
    for name in ("pdf_40_pages", "pdf_400_pages", "docx_200_paragraphs", "text_1mb"):
        assert figures[name]["n"] == 1 and figures[name]["chars_in_message"] == 12_000
    assert figures["inbox_sweep_2000_files"]["n"] == 3
