"""Token counting with tiktoken, offline.

tiktoken downloads its encodings on first use; litellm's package ships ``cl100k_base`` and
``o200k_base``, so we point ``TIKTOKEN_CACHE_DIR`` there without importing litellm itself.
A message is counted once, when it is stored; the count travels with it from then on.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
from functools import lru_cache
from pathlib import Path
from typing import Any

import tiktoken

MESSAGE_OVERHEAD = 4
IMAGE_TOKENS = 765
_O200K = re.compile(r"(^|/)(gpt-4o|gpt-4\.1|gpt-4\.5|gpt-5|o\d|chatgpt-4o)", re.I)


def _point_tiktoken_at_litellm() -> None:
    if os.environ.get("TIKTOKEN_CACHE_DIR"):
        return
    spec = importlib.util.find_spec("litellm")
    if spec and spec.submodule_search_locations:
        folder = Path(next(iter(spec.submodule_search_locations)))
        tokenizers = folder / "litellm_core_utils" / "tokenizers"
        if tokenizers.is_dir():
            os.environ["TIKTOKEN_CACHE_DIR"] = str(tokenizers)


def encoding_name(model: str) -> str:
    return "o200k_base" if _O200K.search(model) else "cl100k_base"


@lru_cache(maxsize=4)
def _encoding(name: str) -> tiktoken.Encoding:
    _point_tiktoken_at_litellm()
    return tiktoken.get_encoding(name)


class TokenCounter:
    def __init__(self, model: str) -> None:
        self.encoding = _encoding(encoding_name(model))

    def count_text(self, text: str) -> int:
        return len(self.encoding.encode(text, disallowed_special=())) if text else 0

    def count_message(self, message: dict[str, Any]) -> int:
        tokens = MESSAGE_OVERHEAD
        content = message.get("content")
        if isinstance(content, str):
            tokens += self.count_text(content)
        elif isinstance(content, list):
            for part in content:
                if part.get("type") == "text":
                    tokens += self.count_text(part.get("text", ""))
                elif part.get("type") == "image_url":
                    tokens += IMAGE_TOKENS
        for call in message.get("tool_calls") or ():
            fn = call.get("function", {})
            tokens += self.count_text(fn.get("name", "")) + self.count_text(
                fn.get("arguments", "")) + 3
        if message.get("name"):
            tokens += self.count_text(message["name"])
        return tokens

    def count_tools(self, schemas: list[dict[str, Any]]) -> int:
        """What the tool list costs in the prompt (approximated by its JSON)."""
        if not schemas:
            return 0
        return self.count_text(json.dumps(schemas, separators=(",", ":")))
