"""Live replies on Slack (``channels.slack.streaming``) against the fake Slack through the real
slack-sdk: one message posted and updated in place (``chat.update``), a 429 on an update
waited out on the gateway's clock, a long answer split at the final, exactly one final answer
every time; and the acknowledgement reactions through the shared mechanism."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from channels.slack_convert import plan_parts
from gateway.app import Gateway
from tests.conftest import MakeConfig
from tests.e2e.waiting import until
from tests.fakes.clock import FakeClock
from tests.fakes.openai_server import Gate, ScriptedLLM
from tests.fakes.slack_server import FakeSlack

OWNER = "U0OWNER"
DM = "D1"
ANSWER = ("Here is the plan:\n\n```python\nfor stop in route:\n    visit(stop)\n```\n\n"
          "Then lunch in **Lyon**.")
PIECES = [ANSWER[:30], ANSWER[30:60], ANSWER[60:]]
FINAL = plan_parts(ANSWER, ())[0]


@pytest.fixture
async def slack() -> AsyncIterator[FakeSlack]:
    async with FakeSlack() as server:
        yield server


def config(make_config: MakeConfig, slack: FakeSlack, **streaming: Any) -> Any:
    return make_config(channels={"slack": {
        "enabled": True, "bot_token": slack.bot_token, "app_token": slack.app_token,
        "api_base": slack.api_base, "allow_from": [OWNER],
        "streaming": {"enabled": True, "interval": 0, "min_chars": 0, **streaming}}})


async def test_one_message_updated_in_place_then_the_final(
        make_config: MakeConfig, slack: FakeSlack, llm: ScriptedLLM) -> None:
    second, third = Gate(), Gate()
    llm.reply(ANSWER, pieces=PIECES, pauses={2: second, 3: third})
    async with Gateway(config(make_config, slack), grace=2.0) as gw:
        await slack.say(OWNER, DM, "plan it")
        [first] = await slack.wait_posts(DM)
        assert llm.in_flight == 1  # shown while the model still writes
        assert first.text.count("```") % 2 == 0  # an open fence is closed mid-answer
        second.release()
        await slack.wait_for(lambda: len(first.edits) >= 1)
        third.release()
        await slack.wait_for(lambda: first.text == FINAL)
        await slack.wait_for(lambda: not slack._pending)  # every event delivered
        await until(lambda: gw.manager.channels["slack"].handled >= 1 + len(first.edits),
                    "the edits' message_changed events read (and ignored)")
    assert slack.posts[DM] == [first] and len(first.edits) >= 2
    assert llm.calls == 1  # an edit is not a new message to answer
    assert "lunch in *Lyon*" in first.text  # mrkdwn, as a reply is rendered


async def test_a_429_on_an_update_is_waited_out_and_the_final_stays_single(
        make_config: MakeConfig, slack: FakeSlack, llm: ScriptedLLM) -> None:
    second, third = Gate(), Gate()
    llm.reply(ANSWER, pieces=PIECES, pauses={2: second, 3: third})
    clock = FakeClock()
    async with Gateway(config(make_config, slack), grace=2.0, clock=clock):
        await slack.say(OWNER, DM, "plan it")
        [first] = await slack.wait_posts(DM)
        slack.fail_next("chat.update", "ratelimited", status=429, retry_after=30)
        asleep = clock.sleeping  # the gateway's schedules sleep on the clock too
        second.release()
        await clock.settled(asleep + 1)  # the desk waits out Retry-After on the clock
        assert first.edits == [] and slack.calls.count("chat.update") == 1
        clock.advance(30)
        await slack.wait_for(lambda: len(first.edits) == 1)
        third.release()
        await slack.wait_for(lambda: first.text == FINAL)
    assert slack.posts[DM] == [first]
    assert slack.calls.count("chat.postMessage") == 1


async def test_a_long_answer_streams_and_ends_split(
        make_config: MakeConfig, slack: FakeSlack, llm: ScriptedLLM) -> None:
    para = "A sentence about trains and timetables, long enough to count. " * 5
    answer = "\n\n".join(f"{i}. {para}" for i in range(30))[:9000]
    pieces = [answer[i:i + 1500] for i in range(0, len(answer), 1500)]
    gates = {i: Gate() for i in range(2, len(pieces) + 1)}
    llm.reply(answer, pieces=pieces, pauses=gates)
    expected = plan_parts(answer, ())
    async with Gateway(config(make_config, slack), grace=2.0):
        await slack.say(OWNER, DM, "tell me everything")
        for i in sorted(gates):
            await slack.wait_for(lambda n=i - 1: sum(len(p.edits) + 1
                                                     for p in slack.posts[DM]) >= n)
            gates[i].release()
        await slack.wait_for(lambda: [p.text for p in slack.posts[DM]] == expected)
    assert len(expected) == 3 and len(answer) == 9000
    assert sum(len(p.edits) for p in slack.posts[DM]) >= 3  # it grew in place
    assert slack.deleted == []


async def test_reactions_show_each_stage_when_asked(
        make_config: MakeConfig, slack: FakeSlack, llm: ScriptedLLM) -> None:
    answer = llm.hold()
    llm.reply("done")
    async with Gateway(config(make_config, slack, enabled=False, reactions=True), grace=2.0):
        ts = await slack.say(OWNER, DM, "hi")
        await llm.wait_in_flight(1)
        await slack.wait_for(lambda: ("add", DM, ts, "eyes") in slack.reactions)
        answer.release()
        await slack.wait_posts(DM)
        await slack.wait_for(lambda: ("remove", DM, ts, "eyes") in slack.reactions)
    assert slack.reactions == [("add", DM, ts, "eyes"), ("add", DM, ts, "white_check_mark"),
                               ("remove", DM, ts, "eyes")]
