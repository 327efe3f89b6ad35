"""Documents into the message: PDF (pypdf), DOCX (python-docx), plain text and Markdown.

The head of the document, within ``agent.media.documents.max_tokens`` (about four characters
a token), goes into the user's message with a visible note of what was cut; the whole file
stays in the inbox for ``read_file``. What cannot be read safely is refused in words the model
and the user see: an encrypted PDF, a DOCX that unpacks to more than ``max_unpacked_bytes``
(a zip bomb), a "text" file with binary content. Blocking: run it in a thread.
"""

from __future__ import annotations

import logging
import zipfile
from pathlib import Path

from gateway.kernel.config_media import DocumentsConfig
from gateway.kernel.frozen import frozen

_log = logging.getLogger(__name__)

CHARS_PER_TOKEN = 4
MAX_ZIP_ENTRIES = 5000
PDF_TYPES = frozenset({"application/pdf"})
DOCX_TYPES = frozenset({
    "application/vnd.openxmlformats-officedocument.wordprocessingml.document"})
TEXT_TYPES = frozenset({"text/plain", "text/markdown", "text/x-markdown"})
SUFFIXES = {".pdf": "pdf", ".docx": "docx", ".txt": "text", ".md": "text",
            ".markdown": "text"}


class Unreadable(Exception):
    """Why a document is refused, in words for the model and the user."""


@frozen
class Excerpt:
    text: str
    """The note of what it is and what was cut, then the text."""
    chars: int
    """Characters of the document put into the message."""


def document_type(path: str, mime: str | None) -> str | None:
    """``pdf``, ``docx`` or ``text`` when this is a document read here, else None."""
    if mime in PDF_TYPES:
        return "pdf"
    if mime in DOCX_TYPES:
        return "docx"
    if mime in TEXT_TYPES:
        return "text"
    return SUFFIXES.get(Path(path).suffix.lower())


def read_document(path: Path, kind: str, config: DocumentsConfig) -> Excerpt:
    """The head of the document at ``path`` within the budget, with its note."""
    budget = config.max_tokens * CHARS_PER_TOKEN
    if kind == "pdf":
        return _pdf(path, budget, config.max_pages)
    if kind == "docx":
        return _docx(path, budget, int(config.max_unpacked_bytes))
    return _text(path, budget)


def _excerpt(what: str, parts: list[str], budget: int, whole_note: str,
             cut_note: str) -> Excerpt:
    text = "\n\n".join(p.strip() for p in parts if p.strip())
    if len(text) <= budget and not cut_note:
        return Excerpt(f"[{what}, {whole_note}; the whole text follows]\n{text}", len(text))
    kept = text[:budget]
    note = cut_note or f"cut after {budget:,} of {len(text):,} characters"
    return Excerpt(f"[{what}: only its beginning follows ({len(kept):,} characters); {note}. "
                   "The whole file is at the path above: read_file reads the rest]\n" + kept,
                   len(kept))


def _pdf(path: Path, budget: int, max_pages: int) -> Excerpt:
    from pypdf import PdfReader
    from pypdf.errors import PdfReadError

    try:
        reader = PdfReader(path)
        if reader.is_encrypted and not reader.decrypt(""):
            raise Unreadable("the PDF is encrypted with a password")
        total = len(reader.pages)
        parts: list[str] = []
        used = 0
        read = 0
        for index in range(min(total, max_pages)):
            if used > budget:
                break
            page = reader.pages[index].extract_text() or ""
            parts.append(page)
            used += len(page) + 2
            read = index + 1
    except Unreadable:
        raise
    except (PdfReadError, ValueError, KeyError, TypeError, OSError) as exc:
        raise Unreadable(f"the PDF could not be read ({type(exc).__name__}: "
                         f"{str(exc)[:120]})") from None
    except Exception as exc:  # pypdf on a hostile file: many kinds of error
        _log.warning("pdf %s: %s: %s", path.name, type(exc).__name__, exc)
        raise Unreadable("the PDF could not be read (it looks damaged)") from None
    what = f"PDF, {total} page{'s' * (total != 1)}"
    if not "".join(parts).strip():
        raise Unreadable(f"the {what} has no text layer (a scan?)")
    chars = sum(len(p) + 2 for p in parts)
    if read == total and chars <= budget:
        return _excerpt(what, parts, budget, "read whole", "")
    if chars <= budget:  # max_pages came first
        note = f"only the first {read} of {total} pages were read"
    else:
        note = f"the text stops in page {_pages_shown(parts, budget) + 1} of {total}"
    return _excerpt(what, parts, budget, "", note)


def _pages_shown(parts: list[str], budget: int) -> int:
    """Pages that fit the budget whole."""
    used = 0
    for index, page in enumerate(parts):
        used += len(page.strip()) + 2
        if used > budget:
            return index
    return len(parts)


def _docx(path: Path, budget: int, max_unpacked: int) -> Excerpt:
    try:
        with zipfile.ZipFile(path) as archive:
            entries = archive.infolist()
            unpacked = sum(e.file_size for e in entries)
    except (zipfile.BadZipFile, OSError) as exc:
        raise Unreadable(f"the DOCX is not a valid document ({exc})") from None
    if len(entries) > MAX_ZIP_ENTRIES or unpacked > max_unpacked:
        raise Unreadable(f"the DOCX unpacks to {unpacked:,} bytes in {len(entries):,} parts, "
                         f"over the {max_unpacked:,}-byte limit; it was not opened")
    import docx

    try:
        document = docx.Document(str(path))
        parts = [p.text for p in document.paragraphs]
        for table in document.tables:
            parts.extend(" | ".join(cell.text for cell in row.cells) for row in table.rows)
    except Exception as exc:  # python-docx on a damaged or hostile file
        raise Unreadable(f"the DOCX could not be read ({type(exc).__name__})") from None
    text = "\n".join(parts)
    if not text.strip():
        raise Unreadable("the DOCX has no text")
    return _excerpt("Word document", [text], budget, f"{len(text):,} characters", "")


def _text(path: Path, budget: int) -> Excerpt:
    try:
        size = path.stat().st_size
        with path.open("rb") as fh:
            head = fh.read(budget * 4 + 4)  # UTF-8: at most 4 bytes a character
    except OSError as exc:
        raise Unreadable(f"the file could not be read ({exc.strerror})") from None
    if b"\0" in head[:8192]:
        raise Unreadable("the file is binary, not text")
    text = head.decode("utf-8", errors="replace")
    if size <= len(head) and len(text) <= budget:
        return _excerpt("text file", [text], budget, f"{len(text):,} characters", "")
    return _excerpt("text file", [text], budget, "",
                    f"cut after {budget:,} characters of a {size:,}-byte file")
