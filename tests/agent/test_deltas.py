"""The answer's text while it is written (``agent/deltas.py``), on both model routes: the
pieces as they come, reasoning left out across chunk boundaries, retries taken back, and a
server that answers a stream request with one JSON body read as a whole answer."""

from __future__ import annotations

import pytest

from agent.deltas import ThinkFilter
from agent.llm_types import without_reasoning
from tests.agent.test_provider import MakeProvider
from tests.agent.test_provider import provider as provider  # noqa: F401 - the fixture
from tests.fakes.openai_server import ScriptedLLM

HELLO = [{"role": "user", "content": "hello"}]


class Seen:
    def __init__(self) -> None:
        self.pieces: list[str] = []
        self.restarts = 0

    def text(self, piece: str) -> None:
        self.pieces.append(piece)

    def restart(self) -> None:
        self.restarts += 1
        self.pieces.clear()


async def test_pieces_arrive_as_written(llm: ScriptedLLM,
                                        provider: MakeProvider) -> None:  # noqa: F811
    llm.reply("one two three", pieces=["one ", "two ", "three"])
    seen = Seen()
    r = await provider().complete(HELLO, deltas=seen)  # agent.stream is off: asked anyway
    assert llm.last_request["stream"] is True
    assert r.content == "one two three"
    assert "".join(seen.pieces) == "one two three" and len(seen.pieces) == 3


@pytest.mark.parametrize("stream", [False, True])
async def test_stream_request_answered_with_plain_json(llm: ScriptedLLM,
                                                       provider: MakeProvider,
                                                       stream: bool) -> None:
    """Point 5: some proxies answer ``stream: true`` with one JSON body. The direct route
    reads it as it is; litellm's stream parser drops its message, so that route asks once
    more without streaming."""
    p = provider(stream=stream)
    llm.reply("the whole answer", whole=True)
    if not p.direct("openai/test-model"):
        llm.reply("the whole answer")
    seen = Seen()
    r = await p.complete(HELLO, deltas=seen)
    assert llm.requests[0]["stream"] is True
    assert r.content == "the whole answer"
    assert "".join(seen.pieces) == "the whole answer"
    llm.assert_all_used()


async def test_stream_request_answered_with_plain_json_without_deltas(
        llm: ScriptedLLM, provider: MakeProvider) -> None:
    p = provider(stream=True)
    llm.reply("the whole answer", whole=True)
    if not p.direct("openai/test-model"):
        llm.reply("the whole answer")
    r = await p.complete(HELLO)
    assert r.content == "the whole answer"
    llm.assert_all_used()


async def test_a_retry_takes_back_what_was_shown(llm: ScriptedLLM,
                                                 provider: MakeProvider) -> None:
    llm.error(503).reply("second try", pieces=["second ", "try"])
    seen = Seen()
    r = await provider().complete(HELLO, deltas=seen)
    assert r.content == "second try" and seen.restarts == 2
    assert "".join(seen.pieces) == "second try"


def _shown(pieces: list[str]) -> str:
    out = ""
    f = ThinkFilter()
    for piece in pieces:
        restart, visible = f.feed(piece)
        if restart:
            out = ""
        out += visible
    return out


@pytest.mark.parametrize("text", [
    "<think>plan the answer</think>\n\nThe answer.",
    "  <THINK>a</think>b",
    "reasoning without its tag</think>  The answer.",
    "plain answer with a < sign and </thin words",
    "answer that talks about <think> tags and </think> closing",
    "<think>all reasoning, cut off",
    "x</think>",
])
def test_reasoning_never_shown_across_chunk_boundaries(text: str) -> None:
    expected = without_reasoning(text) or ""
    for size in (1, 2, 3, 5, 7, len(text)):
        pieces = [text[i:i + size] for i in range(0, len(text), size)]
        assert _shown(pieces) == expected, (size, pieces)
