"""Live replies on the local channel (``channels.local.streaming``): ``partial`` records a
script follows with the same long poll, then the final ``reply`` with the same ``stream`` key
and ``"final": true``. The model is held between pieces (ScriptedLLM pauses); throttling is
decided on a FakeClock."""

from __future__ import annotations

from typing import Any

import pytest

from channels.local import LocalChannel
from gateway.app import Gateway
from tests.conftest import MakeConfig
from tests.e2e.waiting import until
from tests.fakes.clock import FakeClock
from tests.fakes.openai_server import Gate, ScriptedLLM

CHAT = "live"


def records(gw: Gateway) -> list[dict[str, Any]]:
    local: LocalChannel = gw.local
    return list(local._records.get(CHAT, ()))


def kinds(gw: Gateway) -> list[str]:
    return [r["kind"] for r in records(gw)]


@pytest.mark.parametrize("transport", ["auto", "litellm"])
async def test_partials_grow_then_one_final(make_config: MakeConfig, llm: ScriptedLLM,
                                            transport: str) -> None:
    pause = Gate()
    llm.reply("Hello there, general Kenobi.", pieces=["Hello ", "there, ", "general Kenobi."],
              pauses={2: pause})
    config = make_config(agent={"transport": transport},
                         channels={"local": {"streaming": {"enabled": True, "interval": 0,
                                                           "min_chars": 0}}})
    async with Gateway(config, grace=2.0) as gw:
        local: LocalChannel = gw.local
        await local.inject(CHAT, "hi")
        await until(lambda: "partial" in kinds(gw), "a first partial record")
        assert records(gw)[0]["text"] == "Hello "
        assert llm.in_flight == 1  # shown while the model still writes
        pause.release()
        await until(lambda: "reply" in kinds(gw), "the final reply")
        found, _ = await local.wait_messages(CHAT, after=0, timeout=0)
    final = found[-1]
    assert final["kind"] == "reply" and final["final"] is True
    assert final["text"] == "Hello there, general Kenobi."
    partials = [r for r in found if r["kind"] == "partial"]
    assert partials and all(r["final"] is False and r["stream"] == final["stream"]
                            for r in partials)
    assert all(final["text"].startswith(r["text"]) for r in partials)
    assert [r["seq"] for r in found] == sorted(r["seq"] for r in found)
    assert sum(r["kind"] == "reply" for r in found) == 1


async def test_streaming_off_sends_the_reply_whole(make_config: MakeConfig,
                                                   llm: ScriptedLLM) -> None:
    llm.reply("just the answer")
    async with Gateway(make_config(), grace=2.0) as gw:
        assert await gw.local.ask(CHAT, "hi") == "just the answer"
        assert kinds(gw) == ["reply"] and "final" not in records(gw)[0]
    assert "stream" not in llm.requests[0]  # the model call is not streamed either


async def test_updates_are_throttled_on_the_clock(make_config: MakeConfig,
                                                  llm: ScriptedLLM) -> None:
    second, third = Gate(), Gate()
    llm.reply("one two three four", pieces=["one ", "two ", "three four"],
              pauses={2: second, 3: third})
    clock = FakeClock()
    config = make_config(channels={"local": {"streaming": {
        "enabled": True, "interval": "1s", "min_chars": 0}}})
    async with Gateway(config, grace=2.0, clock=clock) as gw:
        await gw.local.inject(CHAT, "count")
        await until(lambda: kinds(gw) == ["partial"], "the first piece shown at once")
        asleep = clock.sleeping  # the gateway's schedules sleep on the clock too
        second.release()
        await clock.settled(asleep + 1)  # the desk waits for the interval: nothing shown meanwhile
        assert [r["text"] for r in records(gw)] == ["one "]
        clock.advance(1.0)
        await until(lambda: len(records(gw)) == 2, "the second piece after the interval")
        assert records(gw)[1]["text"] == "one two "
        third.release()
        await until(lambda: "reply" in kinds(gw), "the final reply")
        assert records(gw)[-1]["text"] == "one two three four"


async def test_tool_steps_show_as_status_then_the_answer(make_config: MakeConfig,
                                                         llm: ScriptedLLM) -> None:
    held = Gate()
    llm.tool_call("list_dir", {"path": "."}).reply("done", gate=held)
    config = make_config(channels={"local": {"streaming": {
        "enabled": True, "interval": 0, "min_chars": 0, "status": True}}})
    async with Gateway(config, grace=2.0) as gw:
        await gw.local.inject(CHAT, "look")
        await until(lambda: "partial" in kinds(gw), "the status line")
        assert "running list_dir" in records(gw)[0]["text"]
        held.release()
        await until(lambda: "reply" in kinds(gw), "the final reply")
        assert records(gw)[-1]["text"] == "done"
