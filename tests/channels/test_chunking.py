"""Splitting long answers: under the limit, at natural boundaries, never inside code."""

from __future__ import annotations

import re

import pytest

from channels.chunking import chunk_markdown, utf16_len
from channels.format import to_telegram_html
from tests.fakes.telegram_server import parse_html


def paragraphs(n: int, words: int = 30) -> str:
    return "\n\n".join(" ".join(f"p{i}w{j}" for j in range(words)) for i in range(n))


def test_short_text_is_one_chunk_and_blank_text_none() -> None:
    assert chunk_markdown("hello", 100) == ["hello"]
    assert chunk_markdown("\n\n  \n", 100) == []


def test_splits_at_paragraphs_and_loses_nothing() -> None:
    text = paragraphs(12)
    chunks = chunk_markdown(text, 500)
    assert len(chunks) > 1
    assert all(len(c) <= 500 for c in chunks)
    assert "\n\n".join(chunks) == text  # every cut was a paragraph break


def test_long_paragraph_splits_at_lines_then_spaces_then_anywhere() -> None:
    lines = "\n".join(f"line {i} " + "x" * 20 for i in range(40))
    chunks = chunk_markdown(lines, 200)
    assert "\n".join(chunks) == lines and all(len(c) <= 200 for c in chunks)
    words = " ".join(f"w{i}" for i in range(200))
    chunks = chunk_markdown(words, 100)
    assert " ".join(chunks) == words and all(len(c) <= 100 for c in chunks)
    blob = "y" * 250
    assert chunk_markdown(blob, 100) == ["y" * 100, "y" * 100, "y" * 50]


def test_prefers_a_paragraph_break_when_the_chunk_is_half_full() -> None:
    first = "a" * 60
    second = "\n".join("b" * 30 for _ in range(5))
    chunks = chunk_markdown(f"{first}\n\n{second}", 100)
    assert chunks[0] == first


def test_code_block_is_closed_and_reopened_with_its_language() -> None:
    code = "\n".join(f"print({i})  # {'.' * 20}" for i in range(60))
    text = f"Here is the script:\n\n```python\n{code}\n```\n\nRun it."
    chunks = chunk_markdown(text, 400)
    assert chunks[0] == "Here is the script:"
    assert all(len(c) <= 400 for c in chunks)
    for chunk in chunks[1:]:
        assert chunk.startswith("```python\n")
        assert chunk.count("```") == 2, chunk  # every chunk's fence is balanced
    assert chunks[-1].endswith("```\n\nRun it.") or chunks[-1] == "Run it."
    rebuilt = "\n".join(line for c in chunks[1:] for line in c.splitlines()
                        if not line.startswith("```") and line != "Run it." and line)
    assert rebuilt == code  # no code line lost or duplicated
    for chunk in chunks:  # and each renders as a proper code block
        parse_html(to_telegram_html(chunk))


def test_fence_in_a_list_item_reopens_with_its_indentation() -> None:
    body = "\n".join(f"  echo {i}" for i in range(30))
    chunks = chunk_markdown(f"- item\n\n  ```sh\n{body}\n  ```\n- next", 120)
    inner = [c for c in chunks if "echo" in c]
    assert len(inner) > 1
    assert all(c.startswith("  ```sh\n") and c.count("```") == 2 for c in inner)


def test_tilde_fences_and_longer_markers_are_kept() -> None:
    body = "\n".join(f"row {i}" for i in range(50))
    chunks = chunk_markdown(f"~~~~text\n{body}\n~~~~", 100)
    assert all(c.startswith("~~~~text\n") and c.endswith("~~~~") for c in chunks)


def test_utf16_length_counts_astral_characters_twice() -> None:
    assert utf16_len("a😀é") == 4
    chunks = chunk_markdown("😀" * 100, 50, utf16_len)
    assert [len(c) for c in chunks] == [25, 25, 25, 25]
    assert all(utf16_len(c) <= 50 for c in chunks)


@pytest.mark.parametrize("limit", [64, 200, 4096])
def test_every_chunk_fits_and_renders(limit: int) -> None:
    code = "\n".join(f"let v{i} = {i} < {i + 1};" for i in range(300))
    text = "\n\n".join([paragraphs(5, 60), f"```js\n{code}\n```", "**Done** 🎉" * 80,
                        "- " + "\n- ".join(f"item {i}" for i in range(100))])
    chunks = chunk_markdown(text, limit, utf16_len)
    for chunk in chunks:
        assert utf16_len(chunk) <= limit
        visible = parse_html(to_telegram_html(chunk))
        assert utf16_len(visible) <= limit
    kept = re.sub(r"\s+", "", "".join(chunks).replace("```js", "").replace("```", ""))
    assert kept == re.sub(r"\s+", "", text.replace("```js", "").replace("```", ""))


def test_rejects_a_useless_limit() -> None:
    with pytest.raises(ValueError):
        chunk_markdown("abc", 3)
