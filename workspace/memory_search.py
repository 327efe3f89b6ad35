"""Memory text for search: paragraphs, query words and the recall block's lines.

Pure functions over strings, no files. The ranking itself is FTS5's bm25 in ``memory_index``;
the store that owns the files, their cache and the writes is ``memory.py``.
"""

from __future__ import annotations

import re
from typing import Protocol

from workspace.memory_index import Doc

MAX_CHUNK_CHARS = 800
_MIN_CUT_WORDS = 4

_WORD = re.compile(r"\w+")
_HEADING = re.compile(r"^#{1,6}\s+(.*)$")
_PLACEHOLDER = re.compile(r"^\(.*\)$", re.S)
MARKER = re.compile(r"^[ \t]*(?:[-*+][ \t]+|\[\d{1,2}:\d{2}\][ \t]*)+", re.M)
_STOPWORDS = frozenset("""
a about after all also am an and any are as at be been but by can could did do does for from
had has have he hello her hey hi him his how i if in into is it its just me my no not of ok okay
on or our please she so than thank thanks that the their them then there these they this to up
us was we were what when where which who why will with would yes you your
""".split())


class TextCounter(Protocol):
    def count_text(self, text: str) -> int: ...


def tokenize(text: str) -> list[str]:
    """Lowercase words without stopwords, a plural ``s`` dropped (dentists ~ dentist)."""
    out: list[str] = []
    for word in _WORD.findall(text.lower()):
        if word in _STOPWORDS or (len(word) < 2 and not word.isdigit()):
            continue
        if len(word) > 3 and word.endswith("s") and not word.endswith(("ss", "us", "is")):
            word = word[:-1]
        out.append(word)
    return out


def _split_long(lines: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """Pieces of at most ``MAX_CHUNK_CHARS``, cut between lines, else at a space."""
    pieces: list[tuple[int, str]] = []
    current: list[str] = []
    first, size = 0, 0
    for no, line in lines:
        while len(line) > MAX_CHUNK_CHARS:
            cut = line.rfind(" ", 0, MAX_CHUNK_CHARS)
            cut = cut if cut > MAX_CHUNK_CHARS // 2 else MAX_CHUNK_CHARS
            if current:
                pieces.append((first, "\n".join(current)))
                current, size = [], 0
            pieces.append((no, line[:cut].rstrip()))
            line = line[cut:].lstrip()
        if not line:
            continue
        if current and size + len(line) + 1 > MAX_CHUNK_CHARS:
            pieces.append((first, "\n".join(current)))
            current, size = [], 0
        if not current:
            first = no
        current.append(line)
        size += len(line) + 1
    if current:
        pieces.append((first, "\n".join(current)))
    return pieces


def split_paragraphs(text: str) -> list[tuple[int, str]]:
    """(first line, text) of each searchable paragraph.

    The file's title (a level-1 heading on its first line) is left out; a block of headings
    alone sticks to the paragraph after it; template placeholders, paragraphs that are one
    parenthesised remark like ``(Long-term facts ...)``, are skipped with their heading.
    """
    blocks: list[list[tuple[int, str]]] = []
    current: list[tuple[int, str]] = []
    for no, raw in enumerate(text.splitlines(), 1):
        line = raw.rstrip()
        if no == 1 and line.startswith("# "):
            continue
        if line.strip():
            current.append((no, line))
        elif current:
            blocks.append(current)
            current = []
    if current:
        blocks.append(current)
    out: list[tuple[int, str]] = []
    pending: list[tuple[int, str]] = []
    for block in blocks:
        body = [line for _, line in block if not _HEADING.match(line)]
        if not body:
            pending = block
        elif _PLACEHOLDER.match(" ".join(line.strip() for line in body)):
            pending = []
        else:
            out.extend(_split_long(pending + block))
            pending = []
    return out


def parse_docs(path: str, text: str) -> tuple[Doc, ...]:
    """The searchable paragraphs of one file (``path`` relative to the workspace); one with no
    word worth matching (a bare ``[HH:MM]``, stopwords only) is left out."""
    docs = []
    for line, chunk in split_paragraphs(text):
        body = MARKER.sub("", chunk)  # the [HH:MM] stamps are not words to match
        if tokenize(body):
            docs.append(Doc(path, line, chunk, body))
    return tuple(docs)


def one_line(text: str) -> str:
    """A paragraph as one recall line: ``## Projects`` becomes ``Projects:``, bullets ``;``."""
    parts: list[str] = []
    for line in text.splitlines():
        heading = _HEADING.match(line)
        if heading:
            parts.append(heading.group(1).strip() + ":")
        else:
            stripped = re.sub(r"^\s*[-*+]\s+", "", line).strip()
            if parts and re.match(r"^\s*[-*+]\s+", line) and not parts[-1].endswith(":"):
                parts[-1] += ";"
            parts.append(stripped)
    return " ".join(" ".join(parts).split())


def cut_to_fit(lines: list[str], item: str, counter: TextCounter, max_tokens: int) -> str | None:
    """The longest word prefix of ``item`` (with an ellipsis) for which the block still fits."""
    words = item.split(" ")
    prefix = 2  # "-" and "[path]"

    def candidate(n: int) -> str:
        return " ".join(words[:n]) + " …"

    def fits(n: int) -> bool:
        return counter.count_text("\n".join([*lines, candidate(n)])) <= max_tokens

    low, high = prefix + _MIN_CUT_WORDS, len(words) - 1
    if low > high or not fits(low):
        return None
    while low < high:
        mid = (low + high + 1) // 2
        if fits(mid):
            low = mid
        else:
            high = mid - 1
    return candidate(low)
