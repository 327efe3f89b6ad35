"""The serialised-form memo is bounded by the bytes it holds, and serialises a kept object once."""

from __future__ import annotations

import json
from typing import Any

from agent.json_memo import IdentityMemo


def test_a_kept_object_is_serialised_once_and_the_bytes_stay_bounded() -> None:
    calls: list[Any] = []

    def encode(value: Any) -> bytes:
        calls.append(value)
        return json.dumps(value).encode()

    memo = IdentityMemo(encode, max_bytes=200)
    history = [{"role": "user", "content": f"message {i:02d}"} for i in range(3)]
    for _ in range(5):
        assert [memo(m) for m in history] == [json.dumps(m).encode() for m in history]
    assert len(calls) == 3  # the same dicts, turn after turn: serialised once
    for turn in range(50):  # fresh dicts every turn (a system prompt, a runtime block)
        memo({"role": "system", "content": "x" * 40, "turn": turn})
        assert memo.bytes <= 200
    fresh = {"role": "user", "content": "same text"}
    assert memo(fresh) == memo(dict(fresh))  # an equal but other dict gets the same bytes
