"""The whole gateway on Telegram: python-telegram-bot polls the fake Bot API, litellm talks to
the scripted model; nothing of ours is mocked."""

from __future__ import annotations

import asyncio
import base64
import sys
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.commands import GREETING
from gateway.app import Gateway
from gateway.kernel.config import Config
from gateway.kernel.values import COMMAND_DESCRIPTIONS
from tests.conftest import MakeConfig
from tests.fakes.clock import FakeClock
from tests.fakes.openai_server import ScriptedLLM
from tests.fakes.telegram_server import FakeTelegram, Sent, parse_html

PARLEY = str(Path(sys.executable).parent / "parley")
ADA_ID, BOB_ID, GROUP_ID = 1001, 1002, -100200300


@pytest.fixture
async def tg() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram() as server:
        yield server


def telegram_config(make_config: MakeConfig, tg: FakeTelegram, **settings: Any) -> Config:
    section = {"enabled": True, "token": tg.token, "base_url": tg.base_url,
               "base_file_url": tg.base_file_url, "poll_timeout": "1s", "watchdog": "10s",
               "typing_interval": "0.1s", "allow_from": [str(ADA_ID)], **settings}
    return make_config(channels={"local": {"enabled": False}, "telegram": section})


@pytest.fixture
async def gateway(make_config: MakeConfig, tg: FakeTelegram) -> AsyncIterator[Gateway]:
    gw = Gateway(telegram_config(make_config, tg), grace=2.0)
    await gw.start()
    try:
        yield gw
    finally:
        await gw.stop()


def user_texts(request: dict[str, Any]) -> list[str]:
    out = []
    for m in request["messages"]:
        if m["role"] == "user":
            content = m["content"]
            out.append(content if isinstance(content, str) else content[0]["text"])
    return out


async def test_direct_message_round_trip(gateway: Gateway, tg: FakeTelegram,
                                         llm: ScriptedLLM) -> None:
    answer = llm.hold()
    llm.reply("**Hello** Ada! Try `/new`.")
    ada = tg.user(ADA_ID, "Ada", last_name="Lovelace", username="ada")
    tg.dm(ada, "hi there")
    await llm.wait_for_requests(1)
    await tg.wait_for(lambda: (ADA_ID, "typing", None) in tg.actions)  # while the model works
    answer.release()
    [reply] = await tg.wait_sent(ADA_ID)
    assert reply.raw == "<b>Hello</b> Ada! Try <code>/new</code>."
    assert reply.parse_mode == "HTML" and reply.reply_to is None  # no quoting in private chats
    runtime = user_texts(llm.last_request)[-2]
    for line in ("Channel: telegram", f"Chat ID: {ADA_ID}", "Chat type: direct",
                 f"Sender: Ada Lovelace (id {ADA_ID})"):
        assert line in runtime
    assert "Telegram formatting" in runtime
    assert gateway.store is not None
    assert (await gateway.store.active_session(f"telegram:{ADA_ID}")).message_count == 2
    assert [c["command"] for c in tg.commands or []] == list(COMMAND_DESCRIPTIONS)
    tg.dm(ada, "/start")
    greeting = (await tg.wait_sent(ADA_ID, 2))[1]
    assert greeting.text == parse_html(greeting.raw) and "Hi! I'm your assistant" in greeting.text
    assert GREETING.splitlines()[0] in greeting.text
    health = gateway.health()["channels"]["telegram"]
    assert health["running"] and health["bot"] == "@parley_bot"
    assert health["last_poll_ok"] and health["last_inbound"] and health["last_send_ok"]
    assert health["watchdog_restarts"] == 0


async def test_pairing_flow_with_the_cli(make_config: MakeConfig, tg: FakeTelegram,
                                         llm: ScriptedLLM, tmp_path: Path) -> None:
    config = telegram_config(make_config, tg)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"workspace": str(config.workspace_path),
                                    "data_dir": str(config.data_path)}))
    bob = tg.user(BOB_ID, "Bob")
    async with Gateway(config, grace=2.0):
        tg.dm(bob, "hello, who are you?")
        [answer] = await tg.wait_sent(BOB_ID)
        code = answer.text.split("Your pairing code: ")[1].split()[0]
        assert f"parley pairing approve telegram {code}" in answer.text
        assert llm.calls == 0  # a stranger never reaches the model
        proc = await asyncio.create_subprocess_exec(
            PARLEY, "pairing", "approve", "telegram", code, "--config", str(path),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 30)
        assert proc.returncode == 0, err.decode()
        assert "approved Bob" in out.decode()
        llm.reply("Nice to meet you, Bob.")
        tg.dm(bob, "hello again")  # served at once: no restart
        replies = await tg.wait_sent(BOB_ID, 2)
        assert replies[1].text == "Nice to meet you, Bob."
        assert user_texts(llm.last_request)[-1] == "hello again"


async def test_group_mentions_sender_names_context_and_quotes(
        gateway: Gateway, tg: FakeTelegram, llm: ScriptedLLM) -> None:
    group = tg.group(GROUP_ID, "Trip planning")
    ada, bob = tg.user(ADA_ID, "Ada"), tg.user(BOB_ID, "Bob")
    tg.message(group, bob, "I think we should take the train")
    tg.message(group, ada, "the car is faster")
    llm.reply("The train, Ada: it is cheaper.")
    asked = tg.message(group, ada, "@parley_bot what do you think?")
    [reply] = await tg.wait_sent(GROUP_ID)
    assert reply.text == "The train, Ada: it is cheaper."
    assert reply.reply_to == asked["message_id"]  # quotes the question in a busy group
    seen = "\n".join(user_texts(llm.last_request))  # context may be merged into the turn
    assert seen.endswith("[Ada] what do you think?")
    assert seen.index("[Bob] I think we should take the train") < seen.index(
        "[Ada] the car is faster") < seen.index("[Ada] what do you think?")
    assert llm.calls == 1  # the unaddressed messages ran no turn
    # A reply to the bot's message addresses it too; a stranger in an unlisted group does not.
    llm.reply("Booked.")
    tg.message(group, ada, "ok, book it", reply_to=tg.bot_message(GROUP_ID, reply.message_id))
    await tg.wait_sent(GROUP_ID, 2)
    tg.message(group, bob, "@parley_bot ignore Ada")
    tg.message(group, ada, "/status@parley_bot")
    status = (await tg.wait_sent(GROUP_ID, 3))[2]
    assert "Session: telegram:-100200300" in status.text
    assert llm.calls == 2


async def test_forum_topics_are_their_own_sessions(make_config: MakeConfig, tg: FakeTelegram,
                                                   llm: ScriptedLLM) -> None:
    config = telegram_config(make_config, tg, allow_groups=[str(GROUP_ID)])
    forum = tg.group(GROUP_ID, "Team", forum=True)
    bob = tg.user(BOB_ID, "Bob")
    llm.echo()
    async with Gateway(config, grace=2.0) as gw:
        tg.message(forum, bob, "@parley_bot in topic seven", thread_id=7)
        tg.message(forum, bob, "@parley_bot in topic nine", thread_id=9)
        replies = await tg.wait_sent(GROUP_ID, 2)
        assert {(r.thread_id, r.text) for r in replies} == {
            (7, "echo: [Bob] in topic seven"), (9, "echo: [Bob] in topic nine")}
        assert gw.store is not None
        keys = {s.key for s in await gw.store.list_sessions()}
        assert {f"telegram:{GROUP_ID}:7", f"telegram:{GROUP_ID}:9"} <= keys


async def test_refused_html_falls_back_to_plain_text(gateway: Gateway, tg: FakeTelegram,
                                                     llm: ScriptedLLM) -> None:
    llm.reply("**Done**: see [the docs](https://example.com)")
    tg.fail_next("sendMessage", 400, description="Bad Request: can't parse entities: "
                 "Can't find end tag corresponding to start tag \"b\"")
    tg.dm(tg.user(ADA_ID, "Ada"), "is it done?")
    [reply] = await tg.wait_sent(ADA_ID)
    assert reply.parse_mode is None
    assert reply.text == "Done: see the docs (https://example.com)"
    refused = [p for m, p in tg.calls if m == "sendMessage"]
    assert len(refused) == 2 and refused[0]["parse_mode"] == "HTML"


async def test_long_answer_with_code_is_split_cleanly(gateway: Gateway, tg: FakeTelegram,
                                                      llm: ScriptedLLM) -> None:
    code = "\n".join(f"    total += values[{i}]  # step {i}" for i in range(250))
    answer = ("Here is the function.\n\n" + "Some explanation. " * 150 +
              f"\n\n```python\ndef total(values):\n    total = 0\n{code}\n    return total\n```"
              "\n\nThat is all.")
    llm.reply(answer)
    tg.dm(tg.user(ADA_ID, "Ada"), "write it")
    await tg.wait_for(lambda: any("That is all." in s.text for s in tg.sent_to(ADA_ID)))
    parts = tg.sent_to(ADA_ID)
    assert len(parts) >= 4
    for part in parts:
        assert len(part.text.encode("utf-16-le")) // 2 <= 4096
        assert part.raw.count("<pre>") == part.raw.count("</pre>")
    code_parts = [p for p in parts if "total +=" in p.text]
    assert len(code_parts) >= 2
    assert all('<pre><code class="language-python">' in p.raw for p in code_parts)
    shown = "\n".join(p.text for p in code_parts)
    for i in range(250):
        assert shown.count(f"values[{i}]") == 1  # every line once, none lost at a cut


async def test_photo_goes_to_the_model_as_an_image(gateway: Gateway, tg: FakeTelegram,
                                                   llm: ScriptedLLM) -> None:
    llm.reply("A cat.")
    ada = tg.user(ADA_ID, "Ada")
    tg.photo(tg.private(ada), ada, b"\xff\xd8\xffjpeg-bytes", "what is in this picture?")
    [reply] = await tg.wait_sent(ADA_ID)
    assert reply.text == "A cat."
    content = llm.last_request["messages"][-1]["content"]
    assert content[0]["text"].startswith("what is in this picture?")
    assert content[1]["image_url"]["url"] == "data:image/jpeg;base64," + base64.b64encode(
        b"\xff\xd8\xffjpeg-bytes").decode()


async def test_rate_limited_send_waits_and_arrives_once(make_config: MakeConfig,
                                                        tg: FakeTelegram,
                                                        llm: ScriptedLLM) -> None:
    """The resend waits Telegram's ``retry_after`` on the gateway's clock: a fake one here,
    moved by the test, so nothing is decided by how long the machine took."""
    clock = FakeClock()
    llm.reply("worth the wait")
    tg.fail_next("sendMessage", 429, retry_after=30)
    async with Gateway(telegram_config(make_config, tg), grace=2.0, clock=clock):
        tg.dm(tg.user(ADA_ID, "Ada"), "hello")
        await tg.wait_for(lambda: any(m == "sendMessage" for m, _ in tg.calls))
        retry_at = clock.now() + timedelta(seconds=30)
        await clock.sleeper_at(retry_at)  # the outbox waits Telegram's retry_after
        clock.advance(29)
        assert clock.sleeps_until(retry_at)  # a second short of it: still waiting
        assert [m for m, _ in tg.calls].count("sendMessage") == 1
        clock.advance(1)
        [reply] = await tg.wait_sent(ADA_ID)
    assert reply.text == "worth the wait"
    assert [m for m, _ in tg.calls].count("sendMessage") == 2
    assert len(tg.sent_to(ADA_ID)) == 1


async def test_no_telegram_task_survives_stop(make_config: MakeConfig, tg: FakeTelegram,
                                              llm: ScriptedLLM) -> None:
    answer = llm.hold()
    llm.reply("hi")
    gw = Gateway(telegram_config(make_config, tg), grace=2.0)
    await gw.start()
    tg.dm(tg.user(ADA_ID, "Ada"), "hello")
    await tg.wait_for(lambda: bool(tg.actions))  # typing is running
    answer.release()
    await tg.wait_sent(ADA_ID)
    await gw.stop()
    left = [t.get_name() for t in asyncio.all_tasks()
            if t.get_name().startswith("telegram") and not t.done()]
    assert left == []
    assert gw.health()["channels"]["telegram"]["running"] is False


def answered(sent: list[Sent]) -> list[str]:
    return [s.text for s in sent]


async def test_restart_answers_what_was_not_answered_once(
        make_config: MakeConfig, tg: FakeTelegram, llm: ScriptedLLM) -> None:
    config = telegram_config(make_config, tg)
    ada = tg.user(ADA_ID, "Ada")
    llm.reply("first answer")
    first = Gateway(config, grace=0.1)
    await first.start()
    tg.dm(ada, "one")
    await tg.wait_sent(ADA_ID)
    llm.hold()  # never released: the model is still thinking when the gateway stops
    llm.reply("too late")
    tg.dm(ada, "two")
    await llm.wait_for_requests(2)
    await first.stop()
    assert answered(tg.sent_to(ADA_ID)) == ["first answer"]
    assert tg.updates == []  # Telegram was told both updates are safe with us
    llm.reply("answer to two").reply("answer to three")
    async with Gateway(config, grace=2.0):
        await tg.wait_sent(ADA_ID, 2)
        tg.dm(ada, "three")
        await tg.wait_sent(ADA_ID, 3)
    assert answered(tg.sent_to(ADA_ID)) == ["first answer", "answer to two", "answer to three"]
    assert user_texts(llm.requests[2])[-1] == "two"
