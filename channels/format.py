"""Markdown (what models write) → channel markup, from markdown-it-py's tokens.

Why tokens and not regular expressions: the model's markdown nests (bold inside a list inside
a quote), contains code that must stay verbatim, and is sometimes malformed; a real parser
decides what is markup and what is text, and everything that is text gets escaped.

``to_telegram_html`` renders the subset Telegram's HTML parse mode accepts (``b i s code pre
a blockquote``); headings become bold, lists become bullet or numbered lines, tables become an
aligned ``pre`` block and raw HTML in the model's text is shown as text. ``to_plain_text``
renders the same structure without markup (the fallback when a platform rejects our markup).

Both renderings are never longer than the markdown source in visible characters, except for
ordered lists numbered past 9 by "1." shortcuts and aligned tables: callers that must fit a
limit measure the result (``html_visible_text``) and split again when needed.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from markdown_it import MarkdownIt
from markdown_it.token import Token

from gateway.kernel.frozen import frozen

__all__ = ["Markup", "PLAIN", "SLACK_MRKDWN", "TELEGRAM_HTML", "html_visible_text", "render",
           "slack_escape", "to_plain_text", "to_slack_mrkdwn", "to_telegram_html"]

_SAFE_LINK = re.compile(r"^(https?|tg|mailto):", re.IGNORECASE)
_LANGUAGE = re.compile(r"^[A-Za-z0-9_+#.-]{1,32}$")
_TAG = re.compile(r"<[^>]*>")


def _escape_text(text: str) -> str:
    return html.escape(text, quote=False)


def _escape_attr(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;") \
        .replace('"', "&quot;")


def _identity(text: str) -> str:
    return text


@frozen
class Markup:
    """How one target writes each construct; ``None`` tags mean "text only"."""

    escape: Callable[[str], str]
    bold: tuple[str, str] = ("", "")
    italic: tuple[str, str] = ("", "")
    strike: tuple[str, str] = ("", "")
    code: tuple[str, str] = ("", "")
    quote: tuple[str, str] = ("", "")
    pre: Callable[[str, str], str] | None = None
    """``pre(escaped_code, language)`` → the code block; None: the code as plain lines."""
    link: Callable[[str, str], str] | None = None
    """``link(escaped_label, url)`` → the link; None: ``label (url)``."""


def _telegram_pre(code: str, language: str) -> str:
    if language:
        return f'<pre><code class="language-{language}">{code}</code></pre>'
    return f"<pre>{code}</pre>"


def _telegram_link(label: str, url: str) -> str:
    return f'<a href="{_escape_attr(url)}">{label}</a>'


TELEGRAM_HTML = Markup(escape=_escape_text, bold=("<b>", "</b>"), italic=("<i>", "</i>"),
                       strike=("<s>", "</s>"), code=("<code>", "</code>"),
                       quote=("<blockquote>", "</blockquote>"), pre=_telegram_pre,
                       link=_telegram_link)
PLAIN = Markup(escape=_identity)


# --- Slack's mrkdwn: *bold* _italic_ ~strike~ `code` ```pre``` <url|label>; & < > escaped ----

def slack_escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _slack_pre(code: str, language: str) -> str:
    return f"```\n{code}\n```"  # Slack shows no language


def _slack_link(label: str, url: str) -> str:
    return f"<{slack_escape(url).replace('|', '%7C')}|{label}>"


SLACK_MRKDWN = Markup(escape=slack_escape, bold=("*", "*"), italic=("_", "_"),
                      strike=("~", "~"), code=("`", "`"), pre=_slack_pre, link=_slack_link)

_parser = MarkdownIt("commonmark", {"html": False}).enable(["strikethrough", "table"])


def render(markdown: str, markup: Markup) -> str:
    """Render ``markdown`` for ``markup``; surrounding whitespace is dropped."""
    return _Renderer(markup).run(_parser.parse(markdown)).strip()


def to_telegram_html(markdown: str) -> str:
    return render(markdown, TELEGRAM_HTML)


def to_slack_mrkdwn(markdown: str) -> str:
    return render(markdown, SLACK_MRKDWN)


def to_plain_text(markdown: str) -> str:
    return render(markdown, PLAIN)


def html_visible_text(markup: str) -> str:
    """The text a reader sees of HTML we rendered (tags dropped, entities decoded)."""
    return html.unescape(_TAG.sub("", markup))


@dataclass(slots=True)
class _List:
    ordered: bool
    number: int
    items: int = 0


@dataclass(slots=True)
class _Renderer:
    markup: Markup
    out: list[str] = field(default_factory=list)
    lists: list[_List] = field(default_factory=list)
    quote_depth: int = 0
    fresh: bool = True
    """Nothing written yet in the current container: the next block needs no separator."""

    def run(self, tokens: Sequence[Token]) -> str:
        i = 0
        while i < len(tokens):
            i = self._block(tokens, i)
        return "".join(self.out)

    def _start_block(self) -> None:
        if not self.fresh:
            self.out.append("\n" if self.lists else "\n\n")
        self.fresh = False

    def _block(self, tokens: Sequence[Token], i: int) -> int:
        token = tokens[i]
        kind = token.type
        m = self.markup
        if kind == "paragraph_open" and not token.hidden:
            self._start_block()
        elif kind == "heading_open":
            self._start_block()
            self.out.append(m.bold[0])
        elif kind == "heading_close":
            self.out.append(m.bold[1])
        elif kind == "inline":
            if self.fresh:  # a tight list item's text, right after its marker
                self.fresh = False
            self.out.append(self._inline(token.children or []))
        elif kind in ("bullet_list_open", "ordered_list_open"):
            self._start_block()
            self.fresh = True
            start = token.attrGet("start")
            self.lists.append(_List(kind == "ordered_list_open",
                                    int(start) if start is not None else 1))
        elif kind in ("bullet_list_close", "ordered_list_close"):
            self.lists.pop()
            self.fresh = False
        elif kind == "list_item_open":
            current = self.lists[-1]
            if current.items:
                self.out.append("\n")
            current.items += 1
            marker = f"{current.number}. " if current.ordered else "• "
            current.number += 1
            self.out.append("  " * (len(self.lists) - 1) + marker)
            self.fresh = True
        elif kind == "blockquote_open":
            self._start_block()
            if self.quote_depth == 0:  # Telegram cannot nest quotes: the outer one holds all
                self.out.append(m.quote[0])
            self.quote_depth += 1
            self.fresh = True
        elif kind == "blockquote_close":
            self.quote_depth -= 1
            if self.quote_depth == 0:
                self.out.append(m.quote[1])
            self.fresh = False
        elif kind in ("fence", "code_block"):
            self._start_block()
            self.out.append(self._code_block(token.content, token.info))
        elif kind == "hr":
            self._start_block()
            self.out.append("———")
        elif kind == "html_block":
            self._start_block()
            self.out.append(m.escape(token.content.rstrip("\n")))
        elif kind == "table_open":
            self._start_block()
            return self._table(tokens, i)
        return i + 1

    def _code_block(self, content: str, info: str) -> str:
        code = content.rstrip("\n")
        words = info.split()
        language = words[0] if words and _LANGUAGE.match(words[0]) else ""
        if self.markup.pre is None:
            return code
        return self.markup.pre(self.markup.escape(code), language)

    def _table(self, tokens: Sequence[Token], i: int) -> int:
        """A table as aligned monospace rows: chat apps have no tables, but they have ``pre``."""
        rows: list[list[str]] = []
        while i < len(tokens) and tokens[i].type != "table_close":
            token = tokens[i]
            if token.type == "tr_open":
                rows.append([])
            elif token.type == "inline" and rows:
                rows[-1].append(_PlainInline().run(token.children or []))
            i += 1
        widths = [max((len(r[c]) for r in rows if c < len(r)), default=0)
                  for c in range(max((len(r) for r in rows), default=0))]
        lines = [" | ".join(cell.ljust(widths[c]) for c, cell in enumerate(row)).rstrip()
                 for row in rows]
        if len(lines) > 1:
            lines.insert(1, "-+-".join("-" * w for w in widths))
        text = "\n".join(lines)
        pre = self.markup.pre
        self.out.append(pre(self.markup.escape(text), "") if pre else text)
        return i + 1

    def _inline(self, children: Sequence[Token]) -> str:
        m = self.markup
        out: list[str] = []
        links: list[tuple[str | None, int]] = []  # (safe href, where its label starts)
        for token in children:
            kind = token.type
            if kind == "text":
                out.append(m.escape(token.content))
            elif kind in ("softbreak", "hardbreak"):
                out.append("\n")
            elif kind in ("strong_open", "strong_close"):
                out.append(m.bold[kind.endswith("close")])
            elif kind in ("em_open", "em_close"):
                out.append(m.italic[kind.endswith("close")])
            elif kind in ("s_open", "s_close"):
                out.append(m.strike[kind.endswith("close")])
            elif kind == "code_inline":
                out.append(m.code[0] + m.escape(token.content) + m.code[1])
            elif kind == "link_open":
                href = str(token.attrGet("href") or "")
                links.append((href if _SAFE_LINK.match(href) else None, len(out)))
            elif kind == "link_close" and links:
                href_or_none, start = links.pop()
                if href_or_none is not None:
                    label = "".join(out[start:])
                    del out[start:]
                    out.append(self._link(label, href_or_none))
            elif kind == "image":
                label = m.escape(token.content or "image")
                src = str(token.attrGet("src") or "")
                out.append(self._link(label, src) if _SAFE_LINK.match(src) and m.link else label)
            elif kind == "html_inline":
                out.append(m.escape(token.content))
        return "".join(out)

    def _link(self, label: str, href: str) -> str:
        if self.markup.link is not None:
            return self.markup.link(label, href)
        shown = href.removeprefix("mailto:")
        return label if label in (href, shown) or not label else f"{label} ({shown})"


class _PlainInline:
    """An inline run's text without any markup (table cells)."""

    def run(self, children: Sequence[Token]) -> str:
        parts = []
        for token in children:
            if token.type in ("text", "code_inline", "html_inline"):
                parts.append(token.content)
            elif token.type in ("softbreak", "hardbreak"):
                parts.append(" ")
            elif token.type == "image":
                parts.append(token.content)
        return "".join(parts)
