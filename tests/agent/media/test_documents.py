"""Documents read into the message: the head within the budget and a note of what was cut;
what cannot be read safely is refused in words."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import docx
import pytest
from pypdf import PdfReader, PdfWriter

from agent.media.documents import Unreadable, document_type, read_document
from gateway.kernel.config_media import DocumentsConfig
from tests.agent.media.pdfs import text_pdf


def write(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def test_which_files_are_documents() -> None:
    assert document_type("a.bin", "application/pdf") == "pdf"
    assert document_type("notes.MD", None) == "text"
    assert document_type("x.docx", None) == "docx"
    assert document_type("song.mp3", "audio/mpeg") is None


def test_a_short_pdf_is_read_whole(tmp_path: Path) -> None:
    path = write(tmp_path, "a.pdf", text_pdf(["first page", "second page"]))
    excerpt = read_document(path, "pdf", DocumentsConfig())
    assert excerpt.text.startswith("[PDF, 2 pages, read whole; the whole text follows]\n")
    assert "first page\n\nsecond page" in excerpt.text


def test_max_pages_is_said(tmp_path: Path) -> None:
    path = write(tmp_path, "a.pdf", text_pdf([f"p{n}" for n in range(10)]))
    excerpt = read_document(path, "pdf", DocumentsConfig(max_pages=3))
    assert "only the first 3 of 10 pages were read" in excerpt.text and "p3" not in excerpt.text


def test_an_encrypted_pdf_is_refused(tmp_path: Path) -> None:
    writer = PdfWriter(clone_from=PdfReader(io.BytesIO(text_pdf(["secret"]))))
    writer.encrypt("hunter22", algorithm="RC4-128")
    out = io.BytesIO()
    writer.write(out)
    path = write(tmp_path, "locked.pdf", out.getvalue())
    with pytest.raises(Unreadable, match="encrypted with a password"):
        read_document(path, "pdf", DocumentsConfig())


def test_a_damaged_pdf_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "bad.pdf", b"%PDF-1.4 this is not really a pdf")
    with pytest.raises(Unreadable, match="PDF could not be read"):
        read_document(path, "pdf", DocumentsConfig())


def test_a_docx_is_read(tmp_path: Path) -> None:
    document = docx.Document()
    document.add_paragraph("Minutes of the meeting")
    table = document.add_table(rows=1, cols=2)
    table.rows[0].cells[0].text, table.rows[0].cells[1].text = "budget", "4000"
    path = tmp_path / "m.docx"
    document.save(str(path))
    excerpt = read_document(path, "docx", DocumentsConfig())
    assert "Minutes of the meeting" in excerpt.text and "budget | 4000" in excerpt.text


def test_a_zip_bomb_docx_is_refused_unopened(tmp_path: Path) -> None:
    path = tmp_path / "bomb.docx"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("word/document.xml", b"\0" * (3 * 1024 * 1024))
    assert path.stat().st_size < 100_000
    with pytest.raises(Unreadable, match="over the 1,048,576-byte limit"):
        read_document(path, "docx", DocumentsConfig(max_unpacked_bytes=1024 * 1024))


def test_text_is_cut_to_the_budget_and_binary_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "long.txt", ("word " * 1000).encode())
    excerpt = read_document(path, "text", DocumentsConfig(max_tokens=100))
    assert excerpt.chars == 400
    assert "cut after 400 characters of a 5,000-byte file" in excerpt.text
    binary = write(tmp_path, "x.txt", b"abc\0def")
    with pytest.raises(Unreadable, match="binary"):
        read_document(binary, "text", DocumentsConfig())
