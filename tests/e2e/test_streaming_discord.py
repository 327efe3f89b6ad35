"""Live replies on Discord (``channels.discord.streaming``) against the fake Discord: one
message sent and edited in place, 429s on edits waited out by discord.py, a long answer
split at the final, and exactly one final answer in the channel every time."""

from __future__ import annotations

from typing import Any

import pytest

from channels.chunking import chunk_markdown
from gateway.app import Gateway
from tests.conftest import MakeConfig
from tests.e2e.test_discord import ADA_ID, discord_config
from tests.fakes.discord_server import FakeDiscord
from tests.fakes.openai_server import Gate, ScriptedLLM

ANSWER = ("Here is the plan:\n\n```python\nfor stop in route:\n    visit(stop)\n```\n\n"
          "Then lunch in **Lyon**.")
PIECES = [ANSWER[:30], ANSWER[30:60], ANSWER[60:]]


@pytest.fixture
def ada(dc: FakeDiscord) -> dict[str, Any]:
    return dc.user(ADA_ID, "ada", global_name="Ada")


def live(make_config: MakeConfig, dc: FakeDiscord) -> Any:
    return discord_config(make_config, dc, streaming={"enabled": True, "interval": 0,
                                                      "min_chars": 0})


async def test_one_message_edited_in_place(make_config: MakeConfig, dc: FakeDiscord,
                                           llm: ScriptedLLM, ada: dict[str, Any]) -> None:
    second, third = Gate(), Gate()
    llm.reply(ANSWER, pieces=PIECES, pauses={2: second, 3: third})
    dm = dc.dm_channel(ada)
    async with Gateway(live(make_config, dc), grace=2.0):
        asked = dc.post(dm, ada, "plan it")
        [first] = await dc.wait_sent(dm["id"])
        assert first.reference == int(asked["id"])
        assert first.content.count("```") % 2 == 0  # an open fence is closed mid-answer
        second.release()
        await dc.wait_for(lambda: len(first.edits) >= 1)
        third.release()
        await dc.wait_for(lambda: first.content == ANSWER)
    assert dc.sent_to(dm["id"]) == [first] and len(first.edits) >= 2


async def test_rate_limited_edits_still_end_in_one_final(make_config: MakeConfig,
                                                         dc: FakeDiscord, llm: ScriptedLLM,
                                                         ada: dict[str, Any]) -> None:
    second = Gate()
    llm.reply(ANSWER, pieces=[PIECES[0], PIECES[1] + PIECES[2]], pauses={2: second})
    dm = dc.dm_channel(ada)
    async with Gateway(live(make_config, dc), grace=2.0):
        dc.post(dm, ada, "plan it")
        [first] = await dc.wait_sent(dm["id"])
        dc.fail_next("edit_message", 429, retry_after=0.05, times=2)
        second.release()
        await dc.wait_for(lambda: first.content == ANSWER)
    assert dc.sent_to(dm["id"]) == [first]
    assert sum(1 for m, p in dc.calls if m == "PATCH") >= 3  # refused twice, then done


async def test_a_long_answer_ends_split(make_config: MakeConfig, dc: FakeDiscord,
                                        llm: ScriptedLLM, ada: dict[str, Any]) -> None:
    para = "A sentence about trains and timetables, long enough to count. " * 5
    answer = "\n\n".join(f"{i}. {para}" for i in range(30))[:9000]
    pieces = [answer[i:i + 1500] for i in range(0, len(answer), 1500)]
    gates = {i: Gate() for i in range(2, len(pieces) + 1)}
    llm.reply(answer, pieces=pieces, pauses=gates)
    dm = dc.dm_channel(ada)
    expected = chunk_markdown(answer, 2000)
    async with Gateway(live(make_config, dc), grace=2.0):
        dc.post(dm, ada, "tell me everything")
        for i in sorted(gates):
            await dc.wait_for(lambda n=i - 1: sum(len(s.edits) + 1 for s in
                                                  dc.sent_to(dm["id"])) >= n)
            gates[i].release()
        await dc.wait_for(lambda: [s.content for s in dc.sent_to(dm["id"])] == expected)
    assert len(expected) == 5


async def test_reactions_taken_then_done(make_config: MakeConfig, dc: FakeDiscord,
                                         llm: ScriptedLLM, ada: dict[str, Any]) -> None:
    answer = llm.hold()
    llm.reply("done")
    dm = dc.dm_channel(ada)
    config = discord_config(make_config, dc, streaming={"reactions": True})
    async with Gateway(config, grace=2.0):
        asked = dc.post(dm, ada, "hi")
        mid = int(asked["id"])
        await llm.wait_in_flight(1)
        await dc.wait_for(lambda: dc.reactions.get(mid) == ["👀"])  # while the model works
        answer.release()
        await dc.wait_sent(dm["id"])
        await dc.wait_for(lambda: dc.reactions.get(mid) == ["✅"])
    assert dc.reaction_log == [("add", mid, "👀"), ("add", mid, "✅"), ("remove", mid, "👀")]
