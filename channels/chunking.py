"""Split markdown into chunks under a platform's length limit, at natural boundaries.

Chunk the markdown *before* converting each chunk to the channel's markup, so a tag never
straddles two messages. Cuts are chosen, best first: a paragraph break (blank line), a line
break, a line break inside a fenced code block (the fence is closed at the cut and reopened with
the same language in the next chunk), a space, and only as a last resort anywhere. A paragraph
break wins over a line break when it keeps the chunk at least half full; a code block is cut
only when no break outside it fits.

The limit is measured by a supplied length function: ``utf16_len`` for Telegram (4096 UTF-16
code units), ``len`` for Discord (2000 characters). It must add up over concatenation and count
every character at least 1, as both do.
"""

from __future__ import annotations

import bisect
import itertools
import re
from collections.abc import Callable, Iterator

from markdown_it import MarkdownIt

from gateway.kernel.frozen import frozen

__all__ = ["chunk_markdown", "utf16_len"]

Length = Callable[[str], int]

_PARAGRAPH, _LINE, _FENCE_LINE, _SPACE, _HARD = 4, 3, 2, 1, 0
_parser = MarkdownIt("commonmark", {"html": False}).enable(["strikethrough", "table"])


def utf16_len(text: str) -> int:
    """Length in UTF-16 code units, as Telegram counts (an emoji outside the BMP counts 2)."""
    return len(text) + sum(1 for ch in text if ord(ch) > 0xFFFF)


@frozen
class _Fence:
    body_start: int
    """Index of the first character after the opening fence line."""
    body_end: int
    """Index of the closing fence line's first character, or the text's end if unclosed."""
    reopen: str
    close: str

    def holds(self, pos: int) -> bool:
        return self.body_start <= pos < self.body_end


@frozen
class _Cut:
    end: int
    """The chunk ends before this index."""
    next: int
    """The next chunk starts at this index."""
    rank: int


def chunk_markdown(text: str, limit: int, length: Length = len) -> list[str]:
    """``text`` as chunks of at most ``limit`` by ``length``; whitespace-only chunks dropped."""
    if limit < 16:
        raise ValueError("limit must be at least 16")
    text = text.strip("\n")
    if not text.strip():
        return []
    if length(text) <= limit:
        return [text]
    fences = _fences(text)
    cum = [0, *itertools.accumulate(length(ch) for ch in text)]
    cuts = sorted(_cuts(text, fences), key=lambda c: c.end)
    chunks: list[str] = []
    pos = 0
    while pos < len(text):
        fence = next((f for f in fences if f.holds(pos)), None)
        prefix = fence.reopen + "\n" if fence else ""
        budget = limit - length(prefix)
        if cum[-1] - cum[pos] <= budget:
            chunks.append(prefix + text[pos:])
            break
        cut = _best_cut(text, pos, budget, cuts, fences, cum, length)
        piece = text[pos:cut.end]
        inside = _closing(fences, cut.end)
        if inside is not None:
            piece = piece.rstrip("\n") + "\n" + inside.close
        if piece.strip():
            chunks.append(prefix + piece)
        pos = cut.next
    return [c.rstrip() for c in chunks if c.strip()]


def _best_cut(text: str, pos: int, budget: int, cuts: list[_Cut], fences: list[_Fence],
              cum: list[int], length: Length) -> _Cut:
    def size(end: int) -> int:
        closing = _closing(fences, end)
        return cum[end] - cum[pos] + (length("\n" + closing.close) if closing else 0)

    # Every character counts at least 1, so a cut further than ``budget`` characters can't fit.
    lo = bisect.bisect_right(cuts, pos, key=lambda c: c.end)
    hi = bisect.bisect_right(cuts, pos + budget, key=lambda c: c.end)
    fitting = [c for c in cuts[lo:hi] if c.next > pos and size(c.end) <= budget
               and text[pos:c.end].strip()]
    for rank in (_PARAGRAPH, _LINE):
        full = [c for c in fitting if c.rank == rank and size(c.end) >= budget / 2]
        if full:
            return max(full, key=lambda c: c.end)
    for ranks in ((_PARAGRAPH, _LINE), (_FENCE_LINE,), (_SPACE,)):
        found = [c for c in fitting if c.rank in ranks]
        if found:
            return max(found, key=lambda c: c.end)
    return _hard_cut(pos, budget, cum, size)


def _hard_cut(pos: int, budget: int, cum: list[int], size: Callable[[int], int]) -> _Cut:
    end = pos + 1
    lo, hi = pos + 1, len(cum) - 1
    while lo <= hi:  # the furthest end that fits, by bisection over the running lengths
        mid = (lo + hi) // 2
        if size(mid) <= budget:
            end, lo = mid, mid + 1
        else:
            hi = mid - 1
    return _Cut(end, end, _HARD)


def _closing(fences: list[_Fence], end: int) -> _Fence | None:
    """The fence a chunk ending before ``end`` must close (it ends inside that fence's body)."""
    return next((f for f in fences if f.body_start < end < f.body_end), None)


def _cuts(text: str, fences: list[_Fence]) -> Iterator[_Cut]:
    body_starts = {f.body_start for f in fences}
    i = 0
    for line in text.split("\n"):
        end = i + len(line)  # the index of this line's newline
        if end < len(text):
            nxt = end + 1
            fence = next((f for f in fences if f.holds(end)), None)
            if fence is not None:
                if fence.body_start < end and nxt < fence.body_end:
                    yield _Cut(end, nxt, _FENCE_LINE)
            elif nxt not in body_starts:
                if line.strip() and _blank_follows(text, nxt):
                    yield _Cut(end, _skip_blank(text, nxt), _PARAGRAPH)
                elif line.strip():
                    yield _Cut(end, nxt, _LINE)
        for match in re.finditer(r" +", line):
            if match.start() > 0 and match.end() < len(line):
                yield _Cut(i + match.start(), i + match.end(), _SPACE)
        i = end + 1


def _blank_follows(text: str, start: int) -> bool:
    end = text.find("\n", start)
    line = text[start:] if end < 0 else text[start:end]
    return not line.strip()


def _skip_blank(text: str, start: int) -> int:
    while start < len(text):
        end = text.find("\n", start)
        line = text[start:] if end < 0 else text[start:end]
        if line.strip():
            return start
        if end < 0:
            return len(text)
        start = end + 1
    return start


def _fences(text: str) -> list[_Fence]:
    """Fenced code blocks, found by the markdown parser (so fences in lists and quotes count)."""
    lines = text.split("\n")
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line) + 1)
    out = []
    for token in _parser.parse(text):
        if token.type != "fence" or token.map is None:
            continue
        first, last = token.map
        opener = lines[first]
        marker = token.markup
        head = opener[:opener.index(marker)] if marker in opener else ""
        container = head.rstrip(" ")
        indent = " " * min(len(head) - len(container), 3)
        closed = last - 1 > first and lines[last - 1].strip().lstrip(">").strip().startswith(
            marker[0] * len(marker))
        body_end = starts[last - 1] if closed else len(text)
        if last - 1 == first:
            continue
        reopen = container + indent + opener[len(head):].strip()
        out.append(_Fence(body_start=min(starts[first + 1], len(text)), body_end=body_end,
                          reopen=reopen, close=container + indent + marker))
    return out
