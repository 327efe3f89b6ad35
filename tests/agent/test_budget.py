"""Token counting: the right encoding per model, offline, and what a message costs."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from agent.budget import IMAGE_TOKENS, MESSAGE_OVERHEAD, TokenCounter, encoding_name

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("model", [
    "gpt-4o", "gpt-4o-mini", "openai/gpt-4o-mini", "azure/gpt-4o", "gpt-4.1",
    "openai/gpt-4.1-mini", "gpt-5", "openai/gpt-5-nano", "o1", "openai/o3", "o4-mini",
])
def test_o200k_models(model: str) -> None:
    assert encoding_name(model) == "o200k_base"


@pytest.mark.parametrize("model", [
    "anthropic/claude-3-5-sonnet", "ollama/llama3", "openai/test-model", "gpt-4",
    "gpt-3.5-turbo", "openai/gpt-4-turbo",
])
def test_cl100k_models(model: str) -> None:
    assert encoding_name(model) == "cl100k_base"


def test_counter_uses_the_models_encoding() -> None:
    assert TokenCounter("openai/gpt-4o").encoding.name == "o200k_base"
    assert TokenCounter("openai/test-model").encoding.name == "cl100k_base"


def test_tiktoken_works_offline_without_importing_litellm() -> None:
    """A fresh interpreter, no cache dir set and no network: the encodings come from litellm's
    package folder, and litellm itself is never imported."""
    script = (
        "import importlib.util, json, os, sys\n"
        "from agent.budget import TokenCounter\n"
        "n = TokenCounter('openai/gpt-4o').count_text('hello world')\n"
        "m = TokenCounter('openai/test-model').count_text('hello world')\n"
        "root = list(importlib.util.find_spec('litellm').submodule_search_locations)[0]\n"
        "print(json.dumps({'o200k': n, 'cl100k': m, 'litellm': 'litellm' in sys.modules,\n"
        "                  'cache': os.environ.get('TIKTOKEN_CACHE_DIR'), 'root': root}))\n"
    )
    env = {k: v for k, v in os.environ.items()
           if k not in ("TIKTOKEN_CACHE_DIR", "DATA_GYM_CACHE_DIR", "NO_PROXY", "no_proxy")}
    dead = "http://127.0.0.1:9"  # any download attempt fails at once
    env.update(HTTP_PROXY=dead, HTTPS_PROXY=dead, http_proxy=dead, https_proxy=dead)
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["litellm"] is False
    assert out["o200k"] == 2 and out["cl100k"] == 2
    assert out["cache"] and Path(out["cache"]).is_relative_to(out["root"])


@pytest.fixture(scope="module")
def counter() -> TokenCounter:
    return TokenCounter("openai/test-model")


def test_count_text(counter: TokenCounter) -> None:
    assert counter.count_text("") == 0
    assert counter.count_text("hello world") == 2
    # special tokens in user text are plain text, not an error
    assert counter.count_text("<|endoftext|>") > 1


@pytest.mark.parametrize("model", ["openai/test-model", "gpt-4o"])
def test_counted_line_by_line_as_whole(model: str) -> None:
    """A text is counted line by line (each line remembered) unless a line is blank or all
    spaces: the same count as the whole text's, for lines that end in punctuation, spaces or
    digits and lines that start with spaces, dashes or other scripts."""
    counter = TokenCounter(model)
    rng = random.Random(7)
    pieces = ["Time: 2026-11-27 18:40:01", "  - markup: plain", "[Runtime Context]", "x  ",
              "Channel hints:", "Chat ID: -100123", "héllo wörld ✓", "日本語のテキスト", "'s",
              "...", "}", "\t tab", "Sender: Ada (id 42)", " leading", "1234567", "$%^&",
              "ends with a space ", "emoji 🎉🎉", "a/b/c", "don't", "   "]
    texts = [counter.encoding.decode(counter.encoding.encode(t)) for t in pieces]
    for _ in range(400):
        lines = [" ".join(rng.choices(texts, k=rng.randint(1, 3)))
                 for _ in range(rng.randint(2, 12))]
        text = "\n".join(lines)
        whole = len(counter.encoding.encode(text, disallowed_special=()))
        assert counter.count_text(text) == whole, text
        assert counter.count_text(text) == whole  # remembered
    assert counter._known  # the lines were remembered


def test_count_message_text(counter: TokenCounter) -> None:
    text = "The quick brown fox jumps over the lazy dog."
    msg = {"role": "user", "content": text}
    assert counter.count_message(msg) == MESSAGE_OVERHEAD + counter.count_text(text)
    assert counter.count_message({"role": "assistant", "content": None}) == MESSAGE_OVERHEAD


def test_count_message_parts_with_images(counter: TokenCounter) -> None:
    msg = {"role": "user", "content": [
        {"type": "text", "text": "look at these"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,BBBB"}},
    ]}
    expected = MESSAGE_OVERHEAD + counter.count_text("look at these") + 2 * IMAGE_TOKENS
    assert counter.count_message(msg) == expected


def test_count_message_tool_calls_and_name(counter: TokenCounter) -> None:
    args = json.dumps({"path": "notes/today.md", "offset": 0})
    msg = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": args}},
        {"id": "c2", "type": "function", "function": {"name": "exec", "arguments": "{}"}},
    ]}
    expected = (MESSAGE_OVERHEAD
                + counter.count_text("read_file") + counter.count_text(args) + 3
                + counter.count_text("exec") + counter.count_text("{}") + 3)
    assert counter.count_message(msg) == expected
    named = {"role": "tool", "content": "ok", "name": "read_file"}
    assert counter.count_message(named) == (MESSAGE_OVERHEAD + counter.count_text("ok")
                                            + counter.count_text("read_file"))


def test_count_tools(counter: TokenCounter) -> None:
    assert counter.count_tools([]) == 0
    schemas = [{"type": "function", "function": {"name": "read_file", "parameters": {}}}]
    assert counter.count_tools(schemas) == counter.count_text(
        json.dumps(schemas, separators=(",", ":")))
