"""Translation between discord.py objects and Parley's events, as pure functions.

``describe()`` is the one function that reads a ``discord.Message``: it copies what Parley
needs into a ``Post`` (plain data). Every rule after that (who addressed the bot, what the
agent reads, which session a message belongs to, how a reply is cut into messages, which error
is worth a retry) works on plain values and is tested without a network; ``incoming()`` turns
a ``Post`` into what the shared inbound pipeline takes.
"""

from __future__ import annotations

import hashlib
import mimetypes
import re
import warnings
from collections.abc import Iterable, Sequence
from datetime import datetime

with warnings.catch_warnings():
    # discord.py's voice player imports ``audioop``, deprecated since Python 3.11 (we use no
    # voice). Every module of ours that uses discord.py imports it through this one.
    warnings.filterwarnings("ignore", message="'audioop' is deprecated",
                            category=DeprecationWarning)
    import discord

from channels.access import AccessRules
from channels.chunking import chunk_markdown
from channels.common import redact
from channels.incoming import Attachment, Incoming, Sender, Wording, human_size
from gateway.kernel.config import DiscordChannelConfig
from gateway.kernel.events import ChatType, Media, MediaKind
from gateway.kernel.frozen import frozen
from gateway.kernel.values import Delivery

NAME = "discord"
TEXT_LIMIT = 2000
"""Discord's limit for one message's content, in characters."""
IMAGE_MIMES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})
"""Pictures the model is shown; other files are saved and referenced by path."""
QUOTE_CHARS = 300
_SYSTEM_FREE = frozenset({discord.MessageType.default, discord.MessageType.reply})


# --- one message, as plain data -------------------------------------------------------------------

@frozen
class Post:
    """A Discord message as plain data."""

    id: str
    channel_id: str
    """Where it was posted: the thread's own id for a message in a thread."""
    guild_id: str | None
    parent_id: str | None
    """The channel a thread belongs to; None outside threads."""
    author_id: str
    author_name: str
    author_is_bot: bool
    content: str
    created_at: datetime
    mentions: tuple[tuple[str, str], ...] = ()
    """(user id, display name) of every user mentioned."""
    role_mentions: tuple[str, ...] = ()
    role_names: tuple[tuple[str, str], ...] = ()
    reply_to: str | None = None
    reply_author_id: str | None = None
    reply_author_name: str | None = None
    reply_text: str | None = None
    attachments: tuple[Attachment, ...] = ()
    stickers: tuple[str, ...] = ()
    system: bool = False
    """A join, pin, thread-created... notice, not something anyone said."""

    @property
    def direct(self) -> bool:
        return self.guild_id is None


def display_name(user: discord.abc.User) -> str:
    """Server nickname, else the global display name, else the username."""
    return user.display_name.strip() or user.name


def describe(message: discord.Message, *, parent_id: int | None = None) -> Post:
    """``parent_id``: the parent channel when the message was posted in a thread."""
    guild = message.guild
    ref = message.reference
    resolved = ref.resolved if ref is not None else None
    reply_author = resolved.author if isinstance(resolved, discord.Message) else None
    role_ids = sorted({r.id for r in message.role_mentions} | set(message.raw_role_mentions))
    roles = [guild.get_role(r) for r in role_ids] if guild is not None else []
    return Post(
        id=str(message.id), channel_id=str(message.channel.id),
        guild_id=str(guild.id) if guild is not None else None,
        parent_id=str(parent_id) if parent_id is not None else None,
        author_id=str(message.author.id), author_name=display_name(message.author),
        author_is_bot=message.author.bot or message.webhook_id is not None,
        content=message.content, created_at=message.created_at,
        mentions=tuple((str(u.id), display_name(u)) for u in message.mentions),
        role_mentions=tuple(str(r) for r in role_ids),
        role_names=tuple((str(r.id), r.name) for r in roles if r is not None),
        reply_to=str(ref.message_id) if ref is not None and ref.message_id else None,
        reply_author_id=str(reply_author.id) if reply_author is not None else None,
        reply_author_name=display_name(reply_author) if reply_author is not None else None,
        reply_text=resolved.content if isinstance(resolved, discord.Message) else None,
        attachments=tuple(attachment(a.filename, a.size, a.content_type, a.url)
                          for a in message.attachments),
        stickers=tuple(s.name for s in message.stickers),
        system=message.type not in _SYSTEM_FREE)


# --- who spoke, where, and to whom ----------------------------------------------------------------

@frozen
class Place:
    chat_id: str
    thread_id: str | None
    chat_type: ChatType


def place_of(post: Post) -> Place:
    """DMs and channels are ``discord:<channel_id>``; a thread is its parent's chat with the
    thread as ``thread_id`` (``discord:<parent_id>:<thread_id>``)."""
    if post.direct:
        return Place(post.channel_id, None, "direct")
    if post.parent_id is not None:
        return Place(post.parent_id, post.channel_id, "group")
    return Place(post.channel_id, None, "group")


@frozen
class Addressed:
    mention: bool = False
    reply: bool = False

    @property
    def any(self) -> bool:
        return self.mention or self.reply


def addressing(post: Post, *, bot_id: str, bot_roles: Iterable[str] = ()) -> Addressed:
    """Mentioned (``<@id>``, or a role the bot has), or a reply to one of the bot's messages.

    Another bot (with ``allow_bots``) addresses us only by mentioning us: a reply alone does
    not count, or two bots that reply to each other would never stop.
    """
    roles = set(bot_roles)
    mention = any(uid == bot_id for uid, _ in post.mentions) or bool(
        roles.intersection(post.role_mentions)) or _mention_pattern(bot_id).search(
        post.content) is not None
    reply = post.reply_author_id == bot_id and not post.author_is_bot
    return Addressed(mention=mention, reply=reply)


def _mention_pattern(user_id: str) -> re.Pattern[str]:
    return re.compile(rf"<@!?{re.escape(user_id)}>")


def readable_text(post: Post, *, bot_id: str, bot_roles: Iterable[str] = ()) -> str:
    """The content as a person reads it: the bot's own mention (user or role) removed, other
    mentions as ``@Name``."""
    text = _mention_pattern(bot_id).sub("", post.content)
    for role in bot_roles:
        text = text.replace(f"<@&{role}>", "")
    stripped = text != post.content
    names = dict(post.mentions)
    text = re.sub(r"<@!?(\d+)>", lambda m: f"@{names.get(m.group(1), 'someone')}", text)
    roles = dict(post.role_names)
    text = re.sub(r"<@&(\d+)>", lambda m: f"@{roles.get(m.group(1), 'role')}", text)
    text = re.sub(r"[ \t]{2,}", " ", text).strip()
    return text.lstrip(",:").strip() if stripped else text


def _shorten(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 1].rstrip() + "…"


def reply_context(post: Post, bot_id: str) -> str | None:
    """What the user replied to, so "what does this mean?" has its "this"."""
    if post.reply_to is None or post.reply_text is None:
        return None
    who = "you" if post.reply_author_id == bot_id else post.reply_author_name or "someone"
    return f'[Replying to {who}: "{_shorten(post.reply_text, QUOTE_CHARS) or "(attachment)"}"]'


def message_text(post: Post, *, bot_id: str, bot_roles: Iterable[str] = ()) -> str:
    """What the agent reads: the readable text plus what it replied to and stickers."""
    body = readable_text(post, bot_id=bot_id, bot_roles=bot_roles)
    if body.startswith("/"):
        return body  # a command stays a command, even when sent as a reply
    lines = [line for line in (reply_context(post, bot_id), body) if line]
    lines.extend(f"[sticker {name}]" for name in post.stickers)
    return "\n".join(lines)


def incoming(post: Post, *, bot_id: str, bot_roles: Iterable[str] = ()) -> Incoming | None:
    """None for the bot's own messages and system notices (joins, pins, ...)."""
    if post.author_id == bot_id or post.system:
        return None
    place = place_of(post)
    return Incoming(
        platform=NAME, id=post.id, where=post.channel_id, chat_id=place.chat_id,
        thread_id=place.thread_id, guild_id=post.guild_id,
        place_ids=(post.channel_id, *((post.parent_id,) if post.parent_id else ())),
        direct=post.direct,
        sender=Sender(id=post.author_id, name=post.author_name, is_bot=post.author_is_bot),
        addressed=post.direct or addressing(post, bot_id=bot_id, bot_roles=bot_roles).any,
        text=message_text(post, bot_id=bot_id, bot_roles=bot_roles),
        attachments=post.attachments, reply_to=post.reply_to, received_at=post.created_at)


def access_rules(config: DiscordChannelConfig) -> AccessRules:
    """``allow_guilds`` and ``allow_channels`` open those places to everyone, and confine the
    bot to them."""
    return AccessRules.of(dm_policy=config.dm_policy, group_policy=config.group_policy,
                          group_history=config.group_history, allow_from=config.allow_from,
                          members=config.members,
                          allow_places=config.allow_channels, allow_guilds=config.allow_guilds,
                          confined=True)


# --- media in -------------------------------------------------------------------------------------

def media_kind(mime: str | None) -> MediaKind:
    if mime in IMAGE_MIMES:
        return "image"
    head = (mime or "").split("/", 1)[0]
    return head if head in ("audio", "video") else "file"  # type: ignore[return-value]


_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def stored_name(message_id: str, index: int, filename: str) -> str:
    """``<message id>-<n>-<name>``: unique, and safe as a file name on any system."""
    name = _UNSAFE.sub("_", filename).strip("._") or "file"
    if len(name) > 80:
        stem, dot, suffix = name.rpartition(".")
        name = (stem[:70] + dot + suffix[:9]) if dot and len(suffix) < 10 else name[:80]
    return f"{message_id}-{index}-{name}"


def attachment(filename: str, size: int, content_type: str | None, url: str) -> Attachment:
    mime = content_type.split(";")[0].strip() if content_type else \
        mimetypes.guess_type(filename)[0]
    return Attachment(source=url, kind=media_kind(mime), mime=mime, size=size, label=filename,
                      name=filename)


def too_big_reply(refused: Sequence[Attachment], limit: int) -> str:
    names = ", ".join(f"{a.label} ({human_size(a.size or 0)})" for a in refused)
    which = "that file is" if len(refused) == 1 else "those files are"
    return f"Sorry, {which} too big for me: {names}. I can take files up to {human_size(limit)}."


WORDING = Wording(
    title="Discord", place="channel", command="`{}`", context_mark="[attached {label}]",
    failed_note='[The user attached "{label}", which could not be downloaded.]',
    too_big_note='[The user attached "{label}" ({size}), which was not downloaded: it is over '
                 "the {limit} limit.]",
    too_big_reply=too_big_reply)


# --- replies out --------------------------------------------------------------------------------

@frozen
class TextPart:
    content: str


@frozen
class FilePart:
    media: Media


Part = TextPart | FilePart

_CODE = re.compile(r"```.*?(?:```|\Z)|`[^`\n]+`", re.DOTALL)
_MASS_MENTION = re.compile(r"@(everyone|here)\b")


def neutralise_mass_mentions(text: str) -> str:
    """``@everyone``/``@here`` outside code get a zero-width space, so they never read as a
    ping even where ``allowed_mentions`` is not honoured (a copy, a forward)."""
    out: list[str] = []
    pos = 0
    for match in _CODE.finditer(text):
        out.append(_MASS_MENTION.sub("@\u200b\\1", text[pos:match.start()]))
        out.append(match.group())
        pos = match.end()
    out.append(_MASS_MENTION.sub("@\u200b\\1", text[pos:]))
    return "".join(out)


def plan_parts(text: str, media: Sequence[Media], limit: int = TEXT_LIMIT) -> list[Part]:
    """One Discord message per part, in order: text chunks (cut at paragraphs or lines, never
    inside a code block), then one message per file. The same input always gives the same
    parts, so a retry resumes after the parts already sent."""
    parts: list[Part] = [TextPart(c) for c in
                         chunk_markdown(neutralise_mass_mentions(text), limit)]
    parts.extend(FilePart(m) for m in media)
    return parts


def nonce_for(idempotency_key: str, part: int) -> str:
    """Discord's ``nonce`` (at most 25 characters) with ``enforce_nonce``: a part sent again
    within minutes (its answer lost on the way) returns the message already created."""
    return hashlib.blake2b(f"{idempotency_key}:{part}".encode(), digest_size=12).hexdigest()


def allowed_mentions(*, allow_mentions: bool, reply_ping: bool) -> discord.AllowedMentions:
    """Never @everyone/@here; users and roles only when allowed; the replied-to user pinged
    only with ``reply_ping``."""
    if allow_mentions:
        return discord.AllowedMentions(everyone=False, users=True, roles=True,
                                       replied_user=reply_ping)
    mentions = discord.AllowedMentions.none()
    mentions.replied_user = reply_ping
    return mentions


def is_too_large(exc: discord.HTTPException) -> bool:
    return exc.status == 413 or exc.code == 40005


def map_errors(exc: BaseException, secrets: Iterable[str] = ()) -> Delivery:
    """Every error a send can raise → what the delivery worker should do about it.

    discord.py already waited out 429s (its rate limiter) and retried 500/502/504 a few times;
    what reaches us is worth an outbox retry only when Discord or the network may recover.
    """
    text = redact(f"{type(exc).__name__}: {exc}", secrets)
    if isinstance(exc, discord.RateLimited):
        return Delivery(ok=False, error=text, retry_after=exc.retry_after)
    if isinstance(exc, discord.HTTPException):
        if exc.status == 429:  # without Discord's own headers: Cloudflare, wait a while
            return Delivery(ok=False, error=text, retry_after=_retry_after(exc) or 60.0)
        if exc.status >= 500:
            return Delivery(ok=False, error=text)
        if exc.status in (400, 401, 403, 404, 413):
            return Delivery(ok=False, error=text, permanent=True)  # malformed, gone, forbidden
    return Delivery(ok=False, error=text)  # 5xx, network errors, timeouts: worth another try


def _retry_after(exc: discord.HTTPException) -> float | None:
    try:
        return float(exc.response.headers.get("Retry-After", ""))
    except (AttributeError, ValueError):
        return None
