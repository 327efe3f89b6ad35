"""Markdown → Telegram HTML and plain text: what a reader sees in the chat."""

from __future__ import annotations

import pytest

from channels.chunking import utf16_len
from channels.format import html_visible_text, to_plain_text, to_telegram_html
from tests.fakes.telegram_server import HtmlError, parse_html


@pytest.mark.parametrize(("markdown", "html"), [
    ("**bold** and __bold__", "<b>bold</b> and <b>bold</b>"),
    ("*it* and _it_", "<i>it</i> and <i>it</i>"),
    ("~~gone~~", "<s>gone</s>"),
    ("use `x < y && z`", "use <code>x &lt; y &amp;&amp; z</code>"),
    ("[docs](https://example.com/a?b=1&c=2)",
     '<a href="https://example.com/a?b=1&amp;c=2">docs</a>'),
    ("<https://example.com>", '<a href="https://example.com">https://example.com</a>'),
    ("# Title\n\nbody", "<b>Title</b>\n\nbody"),
    ("> quoted\n> more", "<blockquote>quoted\nmore</blockquote>"),
    ("a  \nb", "a\nb"),
])
def test_inline_and_simple_blocks(markdown: str, html: str) -> None:
    assert to_telegram_html(markdown) == html


def test_code_block_keeps_its_language_and_escapes_everything() -> None:
    html = to_telegram_html("```python\nif a < b and c > d:\n    print('&')\n```")
    assert html == ('<pre><code class="language-python">if a &lt; b and c &gt; d:\n'
                    "    print('&amp;')</code></pre>")
    assert to_telegram_html("```\nplain\n```") == "<pre>plain</pre>"
    # A made-up "language" with markup characters cannot inject an attribute.
    assert to_telegram_html('```"><b>\nx\n```') == "<pre>x</pre>"


def test_lists_become_bullets_and_numbers() -> None:
    markdown = "Steps:\n\n1. one\n2. two\n   - nested\n   - more\n3. three\n\n- a\n- b"
    assert to_telegram_html(markdown) == (
        "Steps:\n\n1. one\n2. two\n  • nested\n  • more\n3. three\n\n• a\n• b")
    assert to_telegram_html("3. from three\n4. on") == "3. from three\n4. on"


def test_raw_html_and_unsafe_links_are_shown_as_text() -> None:
    assert to_telegram_html("<b>hi</b> <script>x</script>") == \
        "&lt;b&gt;hi&lt;/b&gt; &lt;script&gt;x&lt;/script&gt;"
    assert to_telegram_html("[click](javascript:alert(1))") == "[click](javascript:alert(1))"
    assert to_telegram_html("![cat](https://e.com/c.png)") == '<a href="https://e.com/c.png">cat</a>'


def test_nested_quotes_collapse_into_one() -> None:
    html = to_telegram_html("> outer\n>\n> > inner")
    assert html == "<blockquote>outer\n\ninner</blockquote>"


def test_tables_become_aligned_monospace() -> None:
    html = to_telegram_html("| name | n |\n|---|---|\n| **Ada** | 1 |\n| Bob | 22 |")
    assert html == "<pre>name | n\n-----+---\nAda  | 1\nBob  | 22</pre>"


def test_plain_text_rendering_drops_markup() -> None:
    markdown = "**Hi** [docs](https://e.com) <https://x.y>\n\n- a\n\n```py\ncode\n```"
    assert to_plain_text(markdown) == "Hi docs (https://e.com) https://x.y\n\n• a\n\ncode"


MESSY = [
    "**unclosed bold and *mixed _emphasis",
    "a < b > c & d &amp; e &lt;",
    "`code with **stars**` and **bold `code` inside**",
    "[link with **bold** and `code`](https://e.com) then <not a tag>",
    "> quote with ```fence``` and\n> - list\n> - items",
    "```\nunclosed fence <b>\n",
    "- item\n\n  ```sh\n  echo <hi>\n  ```\n- next **bold",
    "*** --- ___\n\n***",
    "&#x41; &copy; &nbsp; &bogus;",
    "emoji 😀 **bold 🎉** `😀`",
    "1. a\n1. b\n1. c",
    "| a |\n|---|\n| <b> |",
]


@pytest.mark.parametrize("markdown", MESSY)
def test_whatever_the_model_writes_telegram_accepts(markdown: str) -> None:
    """The fake applies Telegram's HTML rules; our output always parses, and the reader sees
    no more characters than the markdown had (so chunking by markdown length is safe)."""
    html = to_telegram_html(markdown)
    try:
        visible = parse_html(html)
    except HtmlError as exc:  # pragma: no cover - the assertion message is the point
        raise AssertionError(f"Telegram would refuse {html!r}: {exc}") from None
    assert visible == html_visible_text(html)
    assert utf16_len(visible) <= utf16_len(markdown)
