"""Translation between python-telegram-bot objects and Parley's events, as pure functions.

Nothing here touches the network or the clock, so every rule (who addressed the bot, what the
agent reads, how a reply is cut into messages, which error is worth a retry) is tested with
plain ``telegram.Message`` objects.
"""

from __future__ import annotations

import mimetypes
import os
import re
from collections.abc import Callable, Iterable, Sequence
from datetime import timedelta

import httpx
from telegram import Chat, Message, MessageEntity, User
from telegram.error import (
    BadRequest,
    ChatMigrated,
    Forbidden,
    InvalidToken,
    NetworkError,
    RetryAfter,
    TelegramError,
    TimedOut,
)

from channels.access import AccessRules
from channels.chunking import chunk_markdown, utf16_len
from channels.common import redact
from channels.format import html_visible_text, to_plain_text, to_telegram_html
from channels.incoming import Attachment, Incoming, Sender, Wording, human_size
from gateway.kernel.config import TelegramChannelConfig
from gateway.kernel.events import ChatType, Media, MediaKind
from gateway.kernel.frozen import frozen
from gateway.kernel.values import Delivery

# Time periods as timedelta (PTB's future default): with ints, building a RetryAfter warns
# (PTBDeprecationWarning) on every 429. Read by PTB at call time, so setting it here suffices.
os.environ.setdefault("PTB_TIMEDELTA", "true")

NAME = "telegram"
TEXT_LIMIT = 4096
"""Telegram's limit for one message, in UTF-16 code units after entity parsing."""
ALLOWED_UPDATES = ("message",)
PHOTO_MIMES = frozenset({"image/jpeg", "image/png", "image/webp"})
MAX_PHOTO_BYTES = 10 * 1024 * 1024
MAX_UPLOAD_BYTES = 50 * 1024 * 1024
QUOTE_CHARS = 300


# --- who spoke, where, and to whom --------------------------------------------------------------

def chat_type(chat: Chat) -> ChatType | None:
    """``direct`` for private chats, ``group`` for groups and supergroups, None for channels."""
    if chat.type == Chat.PRIVATE:
        return "direct"
    if chat.type in (Chat.GROUP, Chat.SUPERGROUP):
        return "group"
    return None


def is_group_chat_id(chat_id: str) -> bool:
    """Telegram gives groups (and channels) negative ids and users positive ones."""
    return chat_id.startswith("-")


def thread_of(message: Message) -> str | None:
    """The forum topic a message belongs to; other reply threads do not split sessions."""
    if message.is_topic_message and message.message_thread_id:
        return str(message.message_thread_id)
    return None


def display_name(user: User) -> str:
    return user.full_name.strip() or (f"@{user.username}" if user.username else str(user.id))


def _entity_text(text: str, entity: MessageEntity) -> str:
    data = text.encode("utf-16-le")
    return data[entity.offset * 2:(entity.offset + entity.length) * 2].decode("utf-16-le")


def _py_index(text: str, utf16_offset: int) -> int:
    return len(text.encode("utf-16-le")[:utf16_offset * 2].decode("utf-16-le"))


def _text_and_entities(message: Message) -> tuple[str, Sequence[MessageEntity]]:
    if message.text is not None:
        return message.text, message.entities
    return message.caption or "", message.caption_entities


@frozen
class Addressed:
    """How a group message reached for the bot, if it did."""

    mention: bool = False
    reply: bool = False
    command: bool = False

    @property
    def any(self) -> bool:
        return self.mention or self.reply or self.command


def addressing(message: Message, *, bot_id: int, bot_username: str,
               commands: Iterable[str]) -> Addressed:
    """@mention of the bot, a reply to one of its messages, or a command meant for it.

    A bare ``/help`` counts when it is one of our commands; ``/help@other_bot`` never does.
    """
    text, entities = _text_and_entities(message)
    me = "@" + bot_username.lower()
    known = {c.lower() for c in commands}
    mention = command = False
    for entity in entities:
        if entity.type == MessageEntity.MENTION:
            mention = mention or _entity_text(text, entity).lower() == me
        elif entity.type == MessageEntity.TEXT_MENTION:
            mention = mention or (entity.user is not None and entity.user.id == bot_id)
        elif entity.type == MessageEntity.BOT_COMMAND and entity.offset == 0:
            name, _, target = _entity_text(text, entity)[1:].partition("@")
            command = target.lower() == me[1:] if target else name.lower() in known
    replied = message.reply_to_message
    reply = (replied is not None and replied.from_user is not None
             and replied.from_user.id == bot_id and replied.forum_topic_created is None)
    return Addressed(mention=mention, reply=reply, command=command)


def strip_bot_mention(text: str, entities: Sequence[MessageEntity], bot_username: str) -> str:
    """``@parley_bot what's up?`` → ``what's up?``; other mentions stay."""
    me = "@" + bot_username.lower()
    spans = sorted(((_py_index(text, e.offset), _py_index(text, e.offset + e.length))
                    for e in entities if e.type == MessageEntity.MENTION
                    and _entity_text(text, e).lower() == me), reverse=True)
    for start, end in spans:
        if text[end:end + 1] == " ":
            end += 1
        elif text[start - 1:start] == " ":
            start -= 1
        text = text[:start] + text[end:]
    return text.strip().lstrip(",:").strip() if spans else text


def _shorten(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 1].rstrip() + "…"


def reply_context(message: Message, bot_id: int) -> str | None:
    """What the user replied to, so "what does this mean?" has its "this"."""
    replied = message.reply_to_message
    if replied is None or replied.forum_topic_created is not None:
        return None
    if message.is_topic_message and replied.message_id == message.message_thread_id:
        return None  # the topic's first message, not a real reply
    quoted = message.quote.text if message.quote else (replied.text or replied.caption or "")
    who = replied.from_user
    name = "you" if who is not None and who.id == bot_id else \
        display_name(who) if who is not None else "someone"
    return f'[Replying to {name}: "{_shorten(quoted, QUOTE_CHARS) or "(media)"}"]'


def message_text(message: Message, *, bot_id: int, bot_username: str) -> str:
    """What the agent reads: the text (or caption) without the bot's @mention, plus context."""
    text, entities = _text_and_entities(message)
    body = strip_bot_mention(text, entities, bot_username)
    if body.startswith("/"):
        return body  # a command stays a command, even when sent as a reply
    lines = [line for line in (reply_context(message, bot_id), body) if line]
    if message.sticker is not None:
        lines.append(f"[sticker {message.sticker.emoji or ''}]".replace(" ]", "]"))
    return "\n".join(lines)


# --- media in -------------------------------------------------------------------------------------

def media_ref(message: Message) -> Attachment | None:
    """The message's file (Telegram carries at most one): the largest photo size, or its
    document, voice, audio or video."""
    if message.photo:
        best = max(message.photo, key=lambda p: (p.width * p.height, p.file_size or 0))
        return _file(best.file_id, "image", best.file_size, "image/jpeg", "photo")
    if message.voice is not None:
        v = message.voice
        return _file(v.file_id, "audio", v.file_size, v.mime_type or "audio/ogg",
                     "voice message")
    if message.audio is not None:
        a = message.audio
        return _file(a.file_id, "audio", a.file_size, a.mime_type, "audio file", a.file_name)
    if message.video is not None:
        v2 = message.video
        return _file(v2.file_id, "video", v2.file_size, v2.mime_type, "video", v2.file_name)
    if message.video_note is not None:
        n = message.video_note
        return _file(n.file_id, "video", n.file_size, "video/mp4", "video message")
    if message.animation is not None:
        g = message.animation
        return _file(g.file_id, "video", g.file_size, g.mime_type, "animation", g.file_name)
    if message.document is not None:
        d = message.document
        mime = d.mime_type or (mimetypes.guess_type(d.file_name)[0] if d.file_name else None)
        label = f'document "{d.file_name}"' if d.file_name else "document"
        return _file(d.file_id, media_kind(mime), d.file_size, mime, label, d.file_name)
    return None


def _file(file_id: str, kind: MediaKind, size: int | None, mime: str | None, label: str,
          name: str | None = None) -> Attachment:
    return Attachment(source=file_id, kind=kind, size=size, mime=mime, label=label, name=name)


def media_kind(mime: str | None) -> MediaKind:
    head = (mime or "").split("/", 1)[0]
    return head if head in ("image", "audio", "video") else "file"  # type: ignore[return-value]


_SAFE_SUFFIX = re.compile(r"\.[A-Za-z0-9]{1,10}")


def file_suffix(att: Attachment, file_path: str | None) -> str:
    """A safe extension for the stored copy: from Telegram's path, the name, or the MIME type."""
    for candidate in (file_path, att.name):
        if candidate:
            suffix = "." + candidate.rsplit(".", 1)[-1] if "." in candidate else ""
            if _SAFE_SUFFIX.fullmatch(suffix):
                return suffix.lower()
    return (mimetypes.guess_extension(att.mime) if att.mime else None) or ".bin"


def too_big_reply(refused: Sequence[Attachment], limit: int) -> str:
    what = ", ".join(a.label + (f" ({human_size(a.size)})" if a.size else "") for a in refused)
    return f"Sorry, that {what} is too big for me: I can take files up to {human_size(limit)}."


WORDING = Wording(
    title="Telegram", place="chat", command="{}", context_mark="[{label}]",
    failed_note="[The user attached a {label} that could not be downloaded.]",
    too_big_note="[The user attached a {label} ({size}) that was not downloaded: it is over "
                 "the {limit} limit.]",
    too_big_reply=too_big_reply)


# --- one message, for the shared pipeline ----------------------------------------------------

def incoming(message: Message, *, bot_id: int, bot_username: str,
             commands: Iterable[str]) -> Incoming | None:
    """None for what no person said in a private chat or a group (a channel post)."""
    chat, user = message.chat, message.from_user
    kind = chat_type(chat)
    if user is None or kind is None:
        return None
    direct = kind == "direct"
    ref = media_ref(message)
    replied = message.reply_to_message
    return Incoming(
        platform=NAME, id=str(message.message_id), where=str(chat.id), chat_id=str(chat.id),
        thread_id=thread_of(message),
        place_ids=(str(chat.id), *((f"@{chat.username}",) if chat.username else ())),
        direct=direct,
        sender=Sender(id=str(user.id), name=display_name(user), first_name=user.first_name,
                      is_bot=user.is_bot, handle=user.username),
        addressed=direct or addressing(message, bot_id=bot_id, bot_username=bot_username,
                                       commands=commands).any,
        text=message_text(message, bot_id=bot_id, bot_username=bot_username),
        attachments=(ref,) if ref else (), reply_to=str(replied.message_id) if replied else None,
        received_at=message.date)


def access_rules(config: TelegramChannelConfig) -> AccessRules:
    """``allow_groups`` opens a group to everyone in it; it does not confine the bot."""
    return AccessRules.of(dm_policy=config.dm_policy, group_policy=config.group_policy,
                          group_history=config.group_history, allow_from=config.allow_from,
                          members=config.members,
                          allow_places=config.allow_groups)


# --- replies out --------------------------------------------------------------------------------

@frozen
class TextPart:
    html: str | None
    """Telegram HTML, or None when the chunk is sent as plain text only."""
    plain: str


@frozen
class MediaPart:
    media: Media


Part = TextPart | MediaPart


def plan_parts(text: str, media: Sequence[Media]) -> list[Part]:
    """One message per part, in order; the same input always gives the same parts, so a retry
    can resume after the parts already sent."""
    parts: list[Part] = list(text_parts(text))
    parts.extend(MediaPart(m) for m in media)
    return parts


def text_parts(markdown: str, limit: int = TEXT_LIMIT) -> list[TextPart]:
    out: list[TextPart] = []
    for chunk in chunk_markdown(markdown, limit, utf16_len):
        out.extend(_fit(chunk, limit, limit))
    return out


def _fit(chunk: str, limit: int, budget: int) -> list[TextPart]:
    """Rendered HTML is almost never longer than its markdown; when it is, cut finer."""
    plain = to_plain_text(chunk)
    if utf16_len(plain) > limit or not plain.strip():
        plain = chunk
    html = to_telegram_html(chunk)
    visible = html_visible_text(html)
    if not visible.strip():
        return [TextPart(None, plain)]
    over = utf16_len(visible) - limit
    if over <= 0:
        return [TextPart(html, plain)]
    smaller = budget - over - 8
    if smaller < 64:
        return [TextPart(None, c) for c in chunk_markdown(chunk, limit, utf16_len)]
    return [p for piece in chunk_markdown(chunk, smaller, utf16_len)
            for p in _fit(piece, limit, smaller)]


def photo_or_document(media: Media, size: int | None) -> str:
    """``photo`` for pictures Telegram shows inline, else ``document`` (sent as a file)."""
    mime = media.mime or mimetypes.guess_type(media.path or media.url or "")[0]
    if media.kind == "image" and mime in PHOTO_MIMES and (size or 0) <= MAX_PHOTO_BYTES:
        return "photo"
    return "document"


def is_parse_error(exc: TelegramError) -> bool:
    """Telegram refused our HTML ("Bad Request: can't parse entities: ...")."""
    return isinstance(exc, BadRequest) and "parse entities" in exc.message.lower()


def retry_seconds(exc: RetryAfter) -> float:
    value: int | float | timedelta = exc.retry_after
    return value.total_seconds() if isinstance(value, timedelta) else float(value)


def map_errors(exc: TelegramError, secrets: Iterable[str] = ()) -> Delivery:
    """Every python-telegram-bot error → what the delivery worker should do about it."""
    text = redact(f"{type(exc).__name__}: {exc.message}", secrets)
    if isinstance(exc, RetryAfter):
        return Delivery(ok=False, error=text, retry_after=retry_seconds(exc))
    if isinstance(exc, Forbidden | InvalidToken | ChatMigrated | BadRequest):
        return Delivery(ok=False, error=text, permanent=True)  # blocked, gone, or malformed
    if isinstance(exc, TimedOut | NetworkError) and not never_sent(exc):
        return Delivery(ok=False, error=text, unknown=True)  # Telegram may have the message
    return Delivery(ok=False, error=text)  # not sent, or refused: worth another try


def never_sent(exc: TelegramError) -> bool:
    """The request certainly did not reach Telegram: no connection was made (PTB keeps the
    httpx error as the cause). A read timeout or a connection lost while waiting for the
    answer leaves the outcome unknown."""
    return isinstance(exc.__cause__, httpx.ConnectError | httpx.ConnectTimeout |
                      httpx.PoolTimeout)


def start_error(exc: Exception, base_url: str, clean: Callable[[str], str]) -> str:
    """The one line a failed start (getMe) says: a refused token, an unreachable API, an
    error, or an answer PTB could not read (``clean`` hides the token)."""
    where = f"the Bot API at {base_url}"
    if isinstance(exc, InvalidToken):
        return (f"channels.telegram.token was refused by {where} (check the token "
                "@BotFather gave you)")
    if isinstance(exc, NetworkError) and never_sent(exc):
        return f"{where} is not reachable (getMe: {clean(exc.message)})"
    if isinstance(exc, TelegramError):
        return f"getMe failed at {where}: {clean(exc.message)}"
    text = clean(str(exc)).splitlines()[0] if str(exc) else ""
    return f"{where} gave a malformed getMe answer ({type(exc).__name__}: {text})"
