"""Telegram's HTML parse mode, as the fake Bot API checks it: the visible text of a message,
or Telegram's own wording for what it cannot parse; and lengths in UTF-16 units, as Telegram
counts them.

Separate from the server (``telegram_server``) because tests of our formatting use it on its
own, without a server.
"""

from __future__ import annotations

import re

_TAGS = frozenset({"b", "strong", "i", "em", "u", "ins", "s", "strike", "del", "code", "pre",
                   "a", "blockquote", "tg-spoiler", "span", "tg-emoji"})
_TAG = re.compile(r"<(/?)([A-Za-z][A-Za-z0-9-]*)((?:\s+[A-Za-z-]+\s*=\s*(?:\"[^\"]*\"|'[^']*'"
                  r"|[^\s>]+))*)\s*(/?)>")
_ENTITY = re.compile(r"&(#[0-9]+|#x[0-9A-Fa-f]+|[A-Za-z]+);")
_NAMED = {"lt": "<", "gt": ">", "amp": "&", "quot": '"'}


def utf16_len(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


class HtmlError(ValueError):
    """HTML Telegram refuses; the text is its wording after "can't parse entities: "."""


def parse_html(text: str) -> str:
    """The visible text of a message in Telegram's HTML parse mode, or HtmlError with
    Telegram's wording (the part after "can't parse entities: ")."""
    out: list[str] = []
    stack: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        offset = len(text[:i].encode())
        if ch == "<":
            m = _TAG.match(text, i)
            if m is None:
                raise HtmlError(f'Unsupported start tag "" at byte offset {offset}')
            closing, name = m.group(1) == "/", m.group(2).lower()
            if closing:
                if not stack:
                    raise HtmlError(f"Unexpected end tag at byte offset {offset}")
                if stack[-1] != name:
                    raise HtmlError(f'Unmatched end tag at byte offset {offset}, expected '
                                    f'"</{stack[-1]}>", found "</{name}>"')
                stack.pop()
            else:
                if name not in _TAGS:
                    raise HtmlError(f'Unsupported start tag "{name}" at byte offset {offset}')
                if stack and stack[-1] in ("code", "pre") and not (
                        stack[-1] == "pre" and name == "code"):
                    raise HtmlError(f'Unsupported start tag "{name}" at byte offset {offset}')
                if name == "a" and "href" not in m.group(3):
                    raise HtmlError(f"Empty href at byte offset {offset}")
                stack.append(name)
            i = m.end()
        elif ch == "&" and (m := _ENTITY.match(text, i)) is not None:
            body = m.group(1)
            if body.startswith("#x"):
                out.append(chr(int(body[2:], 16)))
            elif body.startswith("#"):
                out.append(chr(int(body[1:])))
            elif body in _NAMED:
                out.append(_NAMED[body])
            else:
                raise HtmlError(f'Unsupported HTML entity "&{body};" at byte offset {offset}')
            i = m.end()
        else:
            out.append(ch)
            i += 1
    if stack:
        raise HtmlError(f'Can\'t find end tag corresponding to start tag "{stack[-1]}"')
    return "".join(out)
