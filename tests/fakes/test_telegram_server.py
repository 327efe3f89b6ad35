"""The fake Bot API behaves like Telegram where our channel depends on it, seen through the
real python-telegram-bot."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest
from telegram import Bot
from telegram.error import BadRequest, Conflict, InvalidToken, NetworkError, RetryAfter

import channels.telegram_convert  # noqa: F401  (opts PTB into timedelta periods)
from tests.fakes.telegram_server import FakeTelegram, HtmlError, parse_html


@pytest.fixture
async def tg() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram() as server:
        yield server


@pytest.fixture
async def bot(tg: FakeTelegram) -> AsyncIterator[Bot]:
    async with Bot(tg.token, base_url=tg.base_url, base_file_url=tg.base_file_url) as client:
        yield client


async def test_get_me_and_a_wrong_token(tg: FakeTelegram, bot: Bot) -> None:
    assert bot.bot.username == "parley_bot"
    with pytest.raises(InvalidToken):
        async with Bot("1:wrong", base_url=tg.base_url):
            pass


async def test_long_poll_returns_as_soon_as_an_update_arrives(tg: FakeTelegram,
                                                              bot: Bot) -> None:
    poll = asyncio.create_task(bot.get_updates(timeout=30))
    await tg.wait_for(lambda: any(m == "getUpdates" for m, _ in tg.calls))
    tg.dm(tg.user(5, "Eve"), "hi")
    [update] = await asyncio.wait_for(poll, 5)
    assert update.message is not None and update.message.text == "hi"
    assert await bot.get_updates(offset=update.update_id + 1, timeout=0) == ()
    assert tg.updates == []  # confirmed by the higher offset


async def test_a_second_poll_ends_the_first_with_409(tg: FakeTelegram, bot: Bot) -> None:
    first = asyncio.create_task(bot.get_updates(timeout=30))
    await tg.wait_for(lambda: sum(m == "getUpdates" for m, _ in tg.calls) == 1)
    async with Bot(tg.token, base_url=tg.base_url) as other:  # a second instance of the bot
        assert await other.get_updates(timeout=0) == ()
    with pytest.raises(Conflict, match="terminated by other getUpdates"):
        await asyncio.wait_for(first, 5)


@pytest.mark.parametrize(("text", "parse_mode", "error"), [
    ("", None, "Message text is empty"),
    ("x" * 4097, None, "Message is too long"),
    ("<b>" + "x" * 4096 + "</b>", "HTML", None),  # tags do not count, like Telegram
    ("<b>bold", "HTML", 'Can\'t parse entities: can\'t find end tag corresponding to start '
                        'tag "b"'),
    ("1 < 2", "HTML", "Can't parse entities: unsupported start tag"),
])
async def test_send_message_validation_wording(tg: FakeTelegram, bot: Bot, text: str,
                                               parse_mode: str | None,
                                               error: str | None) -> None:
    tg.private(tg.user(5, "Eve"))
    if error is None:
        assert (await bot.send_message(5, text, parse_mode=parse_mode)).text == "x" * 4096
        return
    with pytest.raises(BadRequest) as info:
        await bot.send_message(5, text, parse_mode=parse_mode)
    assert info.value.message.startswith(error)


def test_html_rules() -> None:
    assert parse_html('<a href="https://e.com">x</a> &lt;&amp;&gt; &#128512;') == "x <&> 😀"
    for bad in ("<b><i>x</b></i>", "<pre><b>x</b></pre>", "&nbsp;", "<x>y</x>"):
        with pytest.raises(HtmlError):
            parse_html(bad)


async def test_injected_failures(tg: FakeTelegram, bot: Bot) -> None:
    tg.private(tg.user(5, "Eve"))
    tg.fail_next("sendMessage", 429, retry_after=4)
    with pytest.raises(RetryAfter) as info:
        await bot.send_message(5, "hi")
    assert info.value.retry_after == timedelta(seconds=4)
    tg.fail_next("sendMessage", drop=True)
    with pytest.raises(NetworkError):
        await bot.send_message(5, "hi")
    assert (await bot.send_message(5, "hi")).message_id == 1
    with pytest.raises(BadRequest, match="Chat not found"):
        await bot.send_message(6, "nobody")


async def test_files_edits_actions_and_commands(tg: FakeTelegram, bot: Bot) -> None:
    eve = tg.user(5, "Eve")
    tg.document(tg.private(eve), eve, b"%PDF", "a.pdf", "application/pdf")
    [update] = await bot.get_updates(timeout=0)
    assert update.message is not None and update.message.document is not None
    file = await bot.get_file(update.message.document.file_id)
    assert bytes(await file.download_as_bytearray()) == b"%PDF"
    sent = await bot.send_message(5, "draft")
    await bot.edit_message_text("final", chat_id=5, message_id=sent.message_id)
    with pytest.raises(BadRequest, match="Message is not modified"):
        await bot.edit_message_text("final", chat_id=5, message_id=sent.message_id)
    assert tg.sent_to(5)[0].text == "final" and tg.sent_to(5)[0].edits == ["draft"]
    await bot.send_chat_action(5, "typing")
    await bot.send_document(5, b"data", filename="r.txt")
    assert tg.actions == [(5, "typing", None)] and tg.sent[-1].data == b"data"
    await bot.set_my_commands([("new", "start over")])
    assert tg.commands == [{"command": "new", "description": "start over"}]
