"""What the pre-turn media step and the inbox's cleanup cost: reading documents into the
message (PDF of 40 and 400 pages, a DOCX, a 1 MB text file, each at the default budget) and
one sweep over an inbox of 2,000 files with nothing due."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from bench.stats import summary_ms

SWEEP_FILES = 2000


def measure(root: Path, n: int) -> dict[str, Any]:
    import docx

    from agent.media.documents import read_document
    from gateway.inbox_cleanup import sweep
    from gateway.kernel.config_media import DocumentsConfig
    from tests.agent.media.pdfs import text_pdf

    folder = root / "media"
    folder.mkdir(parents=True)
    line = "lorem ipsum dolor sit amet consectetur adipiscing elit " * 10
    files: dict[str, tuple[Path, str]] = {}
    for pages in (40, 400):
        path = folder / f"{pages}.pdf"
        path.write_bytes(text_pdf([f"Page {p}: {line}" for p in range(pages)]))
        files[f"pdf_{pages}_pages"] = (path, "pdf")
    document = docx.Document()
    for p in range(200):
        document.add_paragraph(f"Paragraph {p}: {line}")
    document.save(str(folder / "200.docx"))
    files["docx_200_paragraphs"] = (folder / "200.docx", "docx")
    (folder / "big.txt").write_text(line * 2000)
    files["text_1mb"] = (folder / "big.txt", "text")
    config = DocumentsConfig()
    out: dict[str, Any] = {"reads": n}
    for name, (path, kind) in files.items():
        samples = []
        for i in range(n + 2):
            t0 = time.perf_counter()
            excerpt = read_document(path, kind, config)
            if i >= 2:  # warm-up
                samples.append(time.perf_counter() - t0)
        out[name] = {**summary_ms(samples), "bytes": path.stat().st_size,
                     "chars_in_message": excerpt.chars}
    inbox = root / "inbox"
    for i in range(SWEEP_FILES):
        chat = inbox / "telegram" / str(i % 50)
        chat.mkdir(parents=True, exist_ok=True)
        (chat / f"{i}.ogg").write_bytes(b"x" * 1024)
    samples = []
    for _ in range(max(3, n // 10)):
        t0 = time.perf_counter()
        swept = sweep(inbox, now=time.time(), max_age=30 * 86400, max_total=1 << 30,
                      in_use=set())
        samples.append(time.perf_counter() - t0)
        assert swept.removed == 0
    out["inbox_sweep_2000_files"] = summary_ms(samples)
    out["cpus"] = os.cpu_count()
    return out
