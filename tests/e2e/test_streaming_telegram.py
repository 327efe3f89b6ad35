"""Live replies on Telegram (``channels.telegram.streaming``) against the fake Bot API:
drafts in private chats, one message edited in place in groups (and where drafts are
refused), 429s on edits waited out, long answers split at the final, and exactly one final
answer in the chat every time. The model is held between pieces; waits on the throttle and
on retry_after run on a FakeClock."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest

from channels.telegram_convert import text_parts
from gateway.app import Gateway
from tests.conftest import MakeConfig
from tests.e2e.test_telegram import ADA_ID, GROUP_ID, telegram_config
from tests.fakes.clock import FakeClock
from tests.fakes.openai_server import Gate, ScriptedLLM
from tests.fakes.telegram_server import FakeTelegram, parse_html

ANSWER = ("Here is the plan: **first** we pack, then we take the `08:15` train, "
          "and at noon we eat in Lyon & rest.")
PIECES = [ANSWER[:30], ANSWER[30:60], ANSWER[60:]]


@pytest.fixture
async def tg() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram() as server:
        yield server


def streaming(make_config: MakeConfig, tg: FakeTelegram, **live: Any) -> Any:
    return telegram_config(make_config, tg, allow_groups=[str(GROUP_ID)], streaming={
        "enabled": True, "interval": 0, "min_chars": 0, **live})


def shown(html: str) -> str:
    return parse_html(html)


async def test_private_chat_streams_drafts_then_one_final(make_config: MakeConfig,
                                                          tg: FakeTelegram,
                                                          llm: ScriptedLLM) -> None:
    second, third = Gate(), Gate()
    llm.reply(ANSWER, pieces=PIECES, pauses={2: second, 3: third})
    async with Gateway(streaming(make_config, tg), grace=2.0):
        tg.dm(tg.user(ADA_ID, "Ada"), "plan the trip")
        await tg.wait_for(lambda: len(tg.drafts) == 1)
        second.release()
        await tg.wait_for(lambda: len(tg.drafts) == 2)
        assert tg.sent_to(ADA_ID) == []  # nothing in the chat while it is written
        third.release()
        [final] = await tg.wait_sent(ADA_ID)
    texts = [text for _, _, text in tg.drafts]
    assert len({draft for _, draft, _ in tg.drafts}) == 1  # one animated draft
    whole = ANSWER.replace("**", "").replace("`", "")
    assert all(whole.startswith(t.rstrip()) for t in texts) and len(texts) >= 2
    assert final.text == "Here is the plan: first we pack, then we take the 08:15 train, " \
                         "and at noon we eat in Lyon & rest."
    assert final.edits == [] and len(tg.sent_to(ADA_ID)) == 1


async def test_group_edits_one_message_in_place(make_config: MakeConfig, tg: FakeTelegram,
                                                llm: ScriptedLLM) -> None:
    second, third = Gate(), Gate()
    llm.reply(ANSWER, pieces=PIECES, pauses={2: second, 3: third})
    group = tg.group(GROUP_ID, "Trip")
    async with Gateway(streaming(make_config, tg), grace=2.0):
        asked = tg.message(group, tg.user(ADA_ID, "Ada"), "@parley_bot plan the trip")
        [first] = await tg.wait_sent(GROUP_ID)
        assert first.reply_to == asked["message_id"]  # quotes the question, as replies do
        second.release()
        await tg.wait_for(lambda: len(first.edits) == 1)
        third.release()
        await tg.wait_for(lambda: first.text.endswith("rest."))
    [final] = tg.sent_to(GROUP_ID)
    assert final is first and len(first.edits) >= 2
    assert first.raw == text_parts(ANSWER)[0].html
    assert tg.drafts == []


async def test_refused_drafts_fall_back_to_editing(make_config: MakeConfig, tg: FakeTelegram,
                                                   llm: ScriptedLLM) -> None:
    tg.drafts_offered = False  # an older Bot API server
    second = Gate()
    llm.reply(ANSWER, pieces=PIECES[:1] + ["".join(PIECES[1:])], pauses={2: second})
    async with Gateway(streaming(make_config, tg), grace=2.0):
        tg.dm(tg.user(ADA_ID, "Ada"), "plan the trip")
        [first] = await tg.wait_sent(ADA_ID)
        second.release()
        await tg.wait_for(lambda: first.text.endswith("rest."))
    assert len(tg.sent_to(ADA_ID)) == 1 and tg.drafts == []


async def test_rate_limited_edits_wait_retry_after(make_config: MakeConfig, tg: FakeTelegram,
                                                   llm: ScriptedLLM) -> None:
    second, third = Gate(), Gate()
    llm.reply(ANSWER, pieces=PIECES, pauses={2: second, 3: third})
    group = tg.group(GROUP_ID, "Trip")
    clock = FakeClock()
    async with Gateway(streaming(make_config, tg), grace=2.0, clock=clock):
        tg.message(group, tg.user(ADA_ID, "Ada"), "@parley_bot plan the trip")
        [first] = await tg.wait_sent(GROUP_ID)
        tg.fail_next("editMessageText", 429, retry_after=7)
        asleep = clock.sleeping  # the gateway's schedules sleep on the clock too
        second.release()
        await clock.settled(asleep + 1)  # the desk waits out retry_after on the clock
        assert first.edits == []
        clock.advance(7)
        await tg.wait_for(lambda: len(first.edits) == 1)
        tg.fail_next("editMessageText", 429, retry_after=1)  # the final edit, too
        third.release()
        # Whoever meets this 429 waits it out on the clock: the desk (its edit of the last
        # piece; the stream's end wakes it) or, when the turn ended before the desk edited
        # again, the final's delivery, which tries again one second on.
        again = clock.now() + timedelta(seconds=1)
        await tg.wait_for(lambda: first.text.endswith("rest.") or clock.sleeps_until(again),
                          timeout=15)
        clock.advance(1)
        await tg.wait_for(lambda: first.text.endswith("rest."), timeout=15)
    assert tg.sent_to(GROUP_ID) == [first]
    refused = [c for c in tg.calls if c[0] == "editMessageText"]
    assert len(refused) >= 4  # two refused, each tried again


@pytest.mark.parametrize("where", ["private", "group"])
async def test_a_long_answer_streams_and_ends_split(make_config: MakeConfig, tg: FakeTelegram,
                                                    llm: ScriptedLLM, where: str) -> None:
    para = "A sentence about trains and timetables, long enough to count. " * 5
    answer = "\n\n".join(f"{i}. {para}" for i in range(30))[:9000]
    pieces = [answer[i:i + 1500] for i in range(0, len(answer), 1500)]
    gates = {i: Gate() for i in range(2, len(pieces) + 1)}
    llm.reply(answer, pieces=pieces, pauses=gates)
    group = tg.group(GROUP_ID, "Trip")
    ada = tg.user(ADA_ID, "Ada")
    chat = GROUP_ID if where == "group" else ADA_ID
    expected = [shown(p.html or p.plain) for p in text_parts(answer)]
    assert len(expected) == 3
    async with Gateway(streaming(make_config, tg), grace=2.0):
        if where == "group":
            tg.message(group, ada, "@parley_bot tell me everything")
        else:
            tg.dm(ada, "tell me everything")
        def updates() -> int:
            return len(tg.drafts) + sum(len(s.edits) + 1 for s in tg.sent_to(chat))

        for i in sorted(gates):
            await tg.wait_for(lambda n=i - 1: updates() >= n)  # piece i-1 is shown
            gates[i].release()
        await tg.wait_sent(chat, 3)
        await tg.wait_for(lambda: [s.text for s in tg.sent_to(chat)] == expected)
    assert updates() >= len(pieces) + 2  # it streamed: several updates, then three parts


async def test_reactions_taken_queued_then_done_or_failed(make_config: MakeConfig,
                                                          tg: FakeTelegram,
                                                          llm: ScriptedLLM) -> None:
    answer = llm.hold()
    llm.reply("first answer")
    llm.reply("second answer")
    llm.error(400, "the model refused")
    group = tg.group(GROUP_ID, "Trip")
    ada = tg.user(ADA_ID, "Ada")
    config = telegram_config(make_config, tg, allow_groups=[str(GROUP_ID)],
                             streaming={"reactions": True})  # reactions without streaming
    async with Gateway(config, grace=2.0):
        first = tg.message(group, ada, "@parley_bot first")
        await llm.wait_in_flight(1)
        await tg.wait_for(lambda: (GROUP_ID, first["message_id"], ["👀"]) in tg.reactions)
        second = tg.message(group, ada, "@parley_bot second")
        await tg.wait_for(lambda: (GROUP_ID, second["message_id"], ["🥱"]) in tg.reactions)
        answer.release()
        await tg.wait_sent(GROUP_ID, 2)
        await tg.wait_for(lambda: (GROUP_ID, second["message_id"], ["👌"]) in tg.reactions)
        third = tg.message(group, ada, "@parley_bot third")
        await tg.wait_for(lambda: (GROUP_ID, third["message_id"], ["😢"]) in tg.reactions)

    def seen(message: dict[str, Any]) -> list[list[str]]:
        return [e for c, m, e in tg.reactions if m == message["message_id"]]

    assert seen(first) == [["👀"], ["👌"]]
    assert seen(second) == [["🥱"], ["👀"], ["👌"]]
    assert seen(third) == [["👀"], ["😢"]]


async def test_a_refused_final_edit_leaves_one_answer(make_config: MakeConfig,
                                                      tg: FakeTelegram,
                                                      llm: ScriptedLLM) -> None:
    rest = Gate()
    llm.reply(ANSWER, pieces=[ANSWER[:30], ANSWER[30:]], pauses={2: rest})
    group = tg.group(GROUP_ID, "Trip")
    config = streaming(make_config, tg, min_chars=10_000)  # no edit before the final's
    async with Gateway(config, grace=2.0):
        tg.message(group, tg.user(ADA_ID, "Ada"), "@parley_bot plan the trip")
        [half] = await tg.wait_sent(GROUP_ID)
        tg.fail_next("editMessageText", 400, description="Bad Request: message can't be edited")
        rest.release()
        await tg.wait_for(lambda: tg.deleted == [half])
    [final] = tg.sent_to(GROUP_ID)
    assert final.text.endswith("rest.") and final is not half


async def test_tool_steps_show_as_one_status_line_then_the_answer(make_config: MakeConfig,
                                                                  tg: FakeTelegram,
                                                                  llm: ScriptedLLM) -> None:
    answer = Gate()
    llm.tool_call("list_dir", {"path": "."}).reply("Nothing there.", gate=answer)
    group = tg.group(GROUP_ID, "Trip")
    async with Gateway(streaming(make_config, tg, status=True), grace=2.0):
        tg.message(group, tg.user(ADA_ID, "Ada"), "@parley_bot what is in the folder?")
        [status] = await tg.wait_sent(GROUP_ID)
        assert status.text == "running list_dir…" and status.raw.startswith("<i>")
        answer.release()
        await tg.wait_for(lambda: status.text == "Nothing there.")
    assert tg.sent_to(GROUP_ID) == [status]  # the status line became the answer
