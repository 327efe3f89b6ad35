"""The whole gateway with Slack switched on in its config (started from the installed channel
registry): a DM through the inbox, the agent and the outbox to the fake Slack, with 👀 on the
message while its turn runs. Nothing of ours is mocked."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from gateway.app import Gateway
from tests.conftest import MakeConfig
from tests.fakes.openai_server import ScriptedLLM
from tests.fakes.slack_server import FakeSlack

OWNER = "U0OWNER"


@pytest.fixture
async def slack() -> AsyncIterator[FakeSlack]:
    async with FakeSlack() as server:
        yield server


async def test_a_slack_dm_is_answered_by_the_agent(make_config: MakeConfig, llm: ScriptedLLM,
                                                  slack: FakeSlack) -> None:
    config = make_config(channels={"slack": {
        "enabled": True, "bot_token": slack.bot_token, "app_token": slack.app_token,
        "api_base": slack.api_base, "allow_from": [OWNER]}})
    gate = llm.hold()
    llm.reply("**Done** — see `notes.md`.")
    async with Gateway(config, grace=2.0) as gw:
        assert gw.health()["channels"]["slack"]["state"] == "connected"
        ts = await slack.say(OWNER, "D1", "write it down")
        await llm.wait_in_flight(1)
        await slack.wait_for(lambda: ("add", "D1", ts, "eyes") in slack.reactions)
        gate.release()
        [reply] = await slack.wait_posts("D1")
        await slack.wait_for(lambda: ("remove", "D1", ts, "eyes") in slack.reactions)
    assert reply.text == "*Done* — see `notes.md`."
    assert llm.requests[0]["messages"][-1] == {"role": "user", "content": "write it down"}
    runtime = llm.requests[0]["messages"][-2]["content"]
    assert "Channel: slack" in runtime and "Slack mrkdwn" in runtime
