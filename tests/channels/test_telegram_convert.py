"""Telegram's translation rules, as pure functions on plain ``telegram.Message`` objects: who
addressed the bot, what the agent reads, which session a message belongs to, how a reply is cut
into parts, which error is worth a retry; and the config checks."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

import pytest
from telegram import Message
from telegram.error import BadRequest, Forbidden, NetworkError, RetryAfter, TimedOut

from channels.common import SecretFilter
from channels.incoming import Incoming, to_inbound
from channels.telegram_convert import (
    addressing,
    incoming,
    map_errors,
    media_ref,
    message_text,
    plan_parts,
    reply_context,
)
from gateway.kernel.config import ConfigError, parse_config
from gateway.kernel.events import Media
from tests.fakes.telegram_server import TOKEN, FakeTelegram, parse_html

BOT_ID = 777000111
BOT: dict[str, Any] = {"id": BOT_ID, "is_bot": True, "first_name": "Parley",
                       "username": "parley_bot"}
ADA = {"id": 1001, "is_bot": False, "first_name": "Ada", "last_name": "Lovelace",
       "username": "ada"}
BOB = {"id": 1002, "is_bot": False, "first_name": "Bob"}
GROUP = {"id": -100123, "type": "supergroup", "title": "Friends"}
COMMANDS = ["new", "status", "help", "start"]


def msg(text: str | None = None, *, chat: dict[str, Any] | None = None,
        user: dict[str, Any] = ADA, **extra: Any) -> Message:
    data: dict[str, Any] = {"message_id": 7, "date": 1_800_000_000, "from": user,
                            "chat": chat or {"id": user["id"], "type": "private"}, **extra}
    if text is not None:
        data["text"] = text
        data["entities"] = FakeTelegram.entities(text)
    return Message.de_json(data, None)

def converted(message: Message) -> Incoming:
    """What the shared pipeline gets for ``message``."""
    found = incoming(message, bot_id=BOT_ID, bot_username="parley_bot", commands=COMMANDS)
    assert found is not None
    return found


# --- translation ----------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "extra", "expected"), [
    ("@parley_bot hi", {}, (True, False, False)),
    ("hi @Parley_Bot", {}, (True, False, False)),
    ("hi @other_bot", {}, (False, False, False)),
    ("/status@parley_bot", {}, (False, False, True)),
    ("/status", {}, (False, False, True)),
    ("/status@other_bot", {}, (False, False, False)),
    ("/weather", {}, (False, False, False)),
    ("thanks", {"reply_to_message": {"message_id": 3, "date": 1, "chat": GROUP, "from": BOT,
                                     "text": "answer"}}, (False, True, False)),
    ("thanks", {"reply_to_message": {"message_id": 3, "date": 1, "chat": GROUP, "from": BOB,
                                     "text": "x"}}, (False, False, False)),
])
def test_who_the_group_message_addresses(text: str, extra: dict[str, Any],
                                         expected: tuple[bool, bool, bool]) -> None:
    found = addressing(msg(text, chat=GROUP, **extra), bot_id=BOT_ID,
                       bot_username="parley_bot", commands=COMMANDS)
    assert (found.mention, found.reply, found.command) == expected


def test_text_mention_of_the_bot_counts() -> None:
    message = msg("Parley, hi", chat=GROUP)
    message = Message.de_json({**message.to_dict(), "entities": [
        {"type": "text_mention", "offset": 0, "length": 6, "user": BOT}]}, None)
    assert addressing(message, bot_id=BOT_ID, bot_username="parley_bot",
                      commands=COMMANDS).mention


def test_mention_is_stripped_even_after_emoji() -> None:
    """Entity offsets are UTF-16 units: an emoji before the mention counts twice."""
    text = message_text(msg("😀😀 @parley_bot what's the plan?", chat=GROUP),
                        bot_id=BOT_ID, bot_username="parley_bot")
    assert text == "😀😀 what's the plan?"
    assert message_text(msg("@parley_bot, status?", chat=GROUP), bot_id=BOT_ID,
                        bot_username="parley_bot") == "status?"


def test_inbound_from_a_direct_message() -> None:
    inbound = to_inbound(converted(msg("/status")), text="/status")
    assert (inbound.channel, inbound.chat_id, inbound.sender_id) == ("telegram", "1001", "1001")
    assert inbound.sender_name == "Ada Lovelace" and inbound.chat_type == "direct"
    assert inbound.message_id == "7" and inbound.kind == "command"
    assert inbound.received_at.tzinfo is not None and inbound.session_key == "telegram:1001"


def test_inbound_from_a_forum_topic_and_a_reply_thread() -> None:
    topic = to_inbound(converted(msg("hi", chat=GROUP, user=BOB, message_thread_id=55,
                                     is_topic_message=True)), text="hi")
    assert topic.session_key == "telegram:-100123:55" and topic.chat_type == "group"
    assert topic.sender_name == "Bob"
    plain = to_inbound(converted(msg("hi", chat=GROUP, message_thread_id=3)), text="hi")
    assert plain.thread_id is None  # a reply thread in a normal group is not a topic


def test_replying_to_someone_gives_the_agent_the_quote() -> None:
    replied = {"message_id": 3, "date": 1, "chat": GROUP, "from": BOB,
               "text": "The meeting moved to Friday at 10"}
    text = message_text(msg("@parley_bot what does this mean?", chat=GROUP,
                            reply_to_message=replied), bot_id=BOT_ID,
                        bot_username="parley_bot")
    assert text == '[Replying to Bob: "The meeting moved to Friday at 10"]\nwhat does this mean?'
    assert message_text(msg("/new", chat=GROUP, reply_to_message=replied), bot_id=BOT_ID,
                        bot_username="parley_bot") == "/new"
    topic_root = {"message_id": 55, "date": 1, "chat": GROUP, "from": BOB,
                  "forum_topic_created": {"name": "Trips", "icon_color": 1}}
    assert reply_context(msg("hi", chat=GROUP, message_thread_id=55, is_topic_message=True,
                             reply_to_message=topic_root), BOT_ID) is None


def test_largest_photo_is_chosen() -> None:
    sizes = [{"file_id": "small", "file_unique_id": "s", "width": 90, "height": 90},
             {"file_id": "big", "file_unique_id": "b", "width": 1280, "height": 960,
              "file_size": 99},
             {"file_id": "mid", "file_unique_id": "m", "width": 320, "height": 240}]
    ref = media_ref(msg(chat=None, photo=sizes, caption="look"))
    assert ref is not None and (ref.source, ref.kind, ref.size) == ("big", "image", 99)


def test_errors_map_to_what_delivery_should_do() -> None:
    limited = map_errors(RetryAfter(timedelta(seconds=7)))
    assert limited.retry_after == 7 and not limited.permanent
    assert map_errors(Forbidden("Forbidden: bot was blocked by the user")).permanent
    assert map_errors(BadRequest("Bad Request: chat not found")).permanent
    for retryable in (NetworkError("boom"), TimedOut()):
        delivery = map_errors(retryable)
        assert not delivery.ok and not delivery.permanent and delivery.retry_after is None
    leaked = map_errors(NetworkError(f"POST /bot{TOKEN}/sendMessage failed"), [TOKEN])
    assert TOKEN not in (leaked.error or "")


def test_reply_parts_are_html_with_a_plain_twin() -> None:
    parts = plan_parts("**Hi** there\n\n" + "word " * 2000, [Media(kind="file", path="/x")])
    *texts, media = parts
    assert len(texts) >= 2
    assert texts[0].html is not None and texts[0].html.startswith("<b>Hi</b>")  # type: ignore[union-attr]
    assert texts[0].plain.startswith("Hi there")  # type: ignore[union-attr]
    assert all(len(parse_html(p.html)) <= 4096 for p in texts if p.html)  # type: ignore[union-attr]
    assert media.media.path == "/x"  # type: ignore[union-attr]


def test_secret_filter_rewrites_messages_arguments_and_tracebacks() -> None:
    secret_filter = SecretFilter(TOKEN)
    record = logging.LogRecord("httpx", logging.INFO, __file__, 1, "POST %s", (f"/bot{TOKEN}/x",),
                               None)
    assert secret_filter.filter(record) and record.getMessage() == "POST /bot[token]/x"
    try:
        raise RuntimeError(f"token {TOKEN} refused")
    except RuntimeError:
        import sys
        record = logging.LogRecord("telegram.Bot", logging.ERROR, __file__, 1, "failed", None,
                                   sys.exc_info())
    secret_filter.filter(record)
    assert record.exc_text is not None and TOKEN not in record.exc_text


# --- config ---------------------------------------------------------------------------------

def config_errors(section: dict[str, Any]) -> dict[str, str]:
    with pytest.raises(ConfigError) as info:
        parse_config({"channels": {"telegram": section}}, env={})
    return dict(info.value.errors)


def test_config_names_what_is_missing() -> None:
    errors = config_errors({"enabled": True, "token": "${TELEGRAM_BOT_TOKEN:-}"})
    assert "required when channels.telegram.enabled is true" in \
        errors["channels.telegram.token"]
    errors = config_errors({"enabled": True, "token": "t", "mode": "webhook"})
    assert "webhook_url" in errors["channels.telegram"]
    errors = config_errors({"enabled": True, "token": "t", "poll_timeout": "60s"})
    assert "watchdog must be at least twice poll_timeout" in errors["channels.telegram"]
    errors = config_errors({"webhook_secret": "has spaces"})
    assert "channels.telegram.webhook_secret" in errors
    config = parse_config({"channels": {"telegram": {"allow_from": [123, "@ada"],
                                                     "allow_groups": [-100123]}}}, env={})
    telegram = config.channels.telegram
    assert telegram.allow_from == ["123", "@ada"] and telegram.allow_groups == ["-100123"]
    shown = repr(parse_config({"channels": {"telegram": {
        "token": "tok-value", "webhook_secret": "hook-value"}}}, env={}).channels.telegram)
    assert "tok-value" not in shown and "hook-value" not in shown
