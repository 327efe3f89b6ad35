"""HTML to readable text for ``web_fetch``.

trafilatura (main-content extraction: drops menus, ads and footers, keeps headings, lists,
tables and links as markdown) reads pages of some size. Without it a small
``html.parser`` converter keeps the page's text with its block structure and drops scripts,
styles and page chrome, which is enough to read a page but keeps more of its boilerplate.
"""

from __future__ import annotations

import re
from html import unescape
from html.parser import HTMLParser
from importlib import import_module
from types import ModuleType
from urllib.parse import urljoin

_SKIP = frozenset({"script", "style", "noscript", "template", "svg", "canvas", "iframe",
                   "object", "head", "nav", "footer", "aside", "form", "button", "select"})
_VOID = frozenset({"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta",
                   "param", "source", "track", "wbr"})
_BLOCK = frozenset({"p", "div", "section", "article", "main", "header", "blockquote", "ul",
                    "ol", "dl", "dt", "dd", "table", "tr", "figure", "figcaption", "details",
                    "summary", "address", "hr", "br", "h1", "h2", "h3", "h4", "h5", "h6", "li",
                    "pre"})
_HEADING = {"h1": "# ", "h2": "## ", "h3": "### ", "h4": "#### ", "h5": "##### ",
            "h6": "###### "}
_trafilatura: ModuleType | None | bool = False


def _lib() -> ModuleType | None:
    """trafilatura when installed (imported once, lazily: it is not light)."""
    global _trafilatura
    if _trafilatura is False:
        try:
            _trafilatura = import_module("trafilatura")
        except ImportError:
            _trafilatura = None
    return _trafilatura if isinstance(_trafilatura, ModuleType) else None


class _Converter(HTMLParser):
    def __init__(self, base_url: str) -> None:
        super().__init__(convert_charrefs=True)
        self.base_url = base_url
        self.out: list[str] = []
        self.title = ""
        self._skip = 0
        self._in_title = False
        self._pre = 0
        self._href: str | None = None
        self._link_text: list[str] = []
        self._newlines = 2
        """Line breaks at the end of ``out``: blocks ask for at least one or two, not more."""

    def _newline(self, count: int = 1) -> None:
        if count > self._newlines:
            self.out.append("\n" * (count - self._newlines))
            self._newlines = count

    def _emit(self, text: str) -> None:
        if not text.strip() and self._newlines and not self._pre:
            return
        self.out.append(text)
        self._newlines = 0 if text.strip() or self._pre else self._newlines

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "title":
            self._in_title = True
        if tag in _SKIP:
            if tag not in _VOID:
                self._skip += 1
            return
        if self._skip:
            return
        if tag in _BLOCK:
            self._newline(2 if tag in _HEADING or tag == "p" else 1)
        if tag in _HEADING:
            self._emit(_HEADING[tag])
        elif tag == "li":
            self._emit("- ")
        elif tag == "pre":
            self._pre += 1
        elif tag in ("td", "th"):
            self._emit(" | ")
        elif tag == "a":
            href = dict(attrs).get("href") or ""
            url = urljoin(self.base_url, href) if href else ""
            if url.startswith(("http://", "https://")):
                self._href, self._link_text = url, []
        elif tag == "img":
            alt = (dict(attrs).get("alt") or "").strip()
            if alt:
                self._emit(f"[image: {alt}]")

    def handle_endtag(self, tag: str) -> None:
        if tag == "title":
            self._in_title = False
        if tag in _SKIP:
            self._skip = max(0, self._skip - 1)
            return
        if self._skip:
            return
        if tag == "a" and self._href is not None:
            text = " ".join("".join(self._link_text).split())
            if text:
                self._emit(f"[{text}]({self._href})")
            self._href = None
        elif tag == "pre":
            self._pre = max(0, self._pre - 1)
        if tag in _BLOCK:
            self._newline(2 if tag in _HEADING or tag == "p" else 1)

    def handle_data(self, data: str) -> None:
        if self._in_title:
            self.title += data
        if self._skip:
            return
        if not self._pre:
            data = re.sub(r"\s+", " ", data)
        if self._href is not None:
            self._link_text.append(data)
        else:
            self._emit(data)

    def text(self) -> str:
        raw = "".join(self.out)
        lines = [line.rstrip() if self._pre else " ".join(line.split()) for line in
                 raw.split("\n")]
        return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


def fallback_html_to_text(html: str, url: str = "") -> tuple[str, str]:
    """(title, text) of a page with only the standard library."""
    parser = _Converter(url)
    parser.feed(html)
    parser.close()
    return " ".join(parser.title.split()), parser.text()


MIN_EXTRACT_CHARS = 1500
"""Below this an HTML page is short enough to keep whole: trafilatura's heuristics need an
article's worth of text, and on a tiny page fall back to a baseline that breaks links and
sentences into separate lines."""
_TITLE = re.compile(r"<title[^>]*>(.*?)</title>", re.I | re.S)


def html_to_text(html: str, url: str = "") -> tuple[str, str]:
    """(title, readable text) of an HTML page: trafilatura's main content for a page of some
    size, else the standard-library conversion. The title is the page's ``<title>``.
    CPU-bound: call it in a thread for big pages."""
    lib = _lib()
    if lib is not None and len(html) >= MIN_EXTRACT_CHARS:
        text = lib.extract(html, url=url or None, output_format="markdown", include_links=True,
                           include_tables=True, include_comments=False, favor_recall=True)
        if text and text.strip():
            match = _TITLE.search(html)
            title = " ".join(unescape(match.group(1)).split()) if match else ""
            if not title:
                meta = lib.extract_metadata(html, default_url=url or None)
                title = (getattr(meta, "title", None) or "") if meta is not None else ""
            return title, text.strip()
    return fallback_html_to_text(html, url)
