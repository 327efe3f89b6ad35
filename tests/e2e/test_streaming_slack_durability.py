"""One final message on Slack across a ``kill -9``: the half-written message the stream
posted is recorded (``reply_streams``) like Telegram's and Discord's, and after the restart
the turn is answered again into that same message — one complete answer in the channel,
never a second copy. The gateway is a real subprocess; Slack is the fake in this process."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from channels.slack_convert import plan_parts
from tests.e2e.test_durability import _drain_stderr, _start_gateway
from tests.e2e.test_streaming_durability import _kill_9, _recorded, _second_run, write_config
from tests.e2e.waiting import until
from tests.fakes.openai_server import Gate, ScriptedLLM
from tests.fakes.slack_server import FakeSlack

OWNER, DM = "U0OWNER", "D1"
ANSWER = "The plan: pack tonight, take the 08:15 train, lunch in Lyon, back by nine."


@pytest.mark.timeout(90)
async def test_kill_9_mid_stream_leaves_one_complete_answer(tmp_path: Path,
                                                            llm: ScriptedLLM) -> None:
    async with FakeSlack() as slack:
        config = write_config(tmp_path, llm, "slack", {
            "bot_token": slack.bot_token, "app_token": slack.app_token,
            "api_base": slack.api_base, "allow_from": [OWNER]})
        never = Gate()  # the model is still writing when the gateway dies
        llm.reply(ANSWER, pieces=[ANSWER[:20], ANSWER[20:]], pauses={2: never})
        proc, _ = await _start_gateway(config)
        drain = asyncio.create_task(_drain_stderr(proc))
        await slack.wait_for(lambda: slack.connections >= 1, timeout=30)
        await slack.say(OWNER, DM, "plan the trip")
        [half] = await slack.wait_posts(DM)
        assert half.text == ANSWER[:20].rstrip()
        db = tmp_path / "data" / "parley.db"
        await until(lambda: _recorded(db) == 1, "the shown message recorded", timeout=30)
        await _kill_9(proc, drain)

        llm.reply(ANSWER, pieces=[ANSWER[:40], ANSWER[40:]])
        final = plan_parts(ANSWER, ())[0]

        async def finished() -> None:
            await slack.wait_for(lambda: half.text == final, timeout=30)
            await until(lambda: _recorded(db) == 0, "the stream's record forgotten",
                        timeout=30)

        await _second_run(config, finished)
        assert slack.posts[DM] == [half]  # the same message, finished; no second copy
        assert slack.deleted == []
        assert llm.calls == 2
