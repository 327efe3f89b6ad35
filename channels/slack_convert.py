"""Slack ↔ our events, pure: an Events API ``message`` event → ``Incoming`` (who addressed
whom, the text the agent reads, the session's chat and thread, the files), the access rules,
the wording, and a reply cut into parts that fit a Slack message, rendered as mrkdwn.

Sessions: a direct message or a channel is one session (``slack:<channel id>``); a thread is
one of its own (``slack:<channel id>:<thread_ts>``). In a channel the bot answers when
mentioned (``<@bot>``), per ``group_policy``.
"""

from __future__ import annotations

import html
import mimetypes
import re
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from channels.access import AccessRules
from channels.chunking import chunk_markdown
from channels.format import to_slack_mrkdwn
from channels.incoming import Attachment, Incoming, Sender, Wording, human_size
from gateway.kernel.config_channels import SlackChannelConfig
from gateway.kernel.events import Media, MediaKind

NAME = "slack"
TEXT_LIMIT = 4000
"""Slack's advice for one message's text (it truncates past 40,000)."""
_CHUNK_LIMIT = 3900
"""The markdown of one part, measured escaped (``slack_len``): room for mrkdwn's own marks."""
IGNORED_SUBTYPES = frozenset({"message_changed", "message_deleted", "channel_join",
                              "channel_leave", "bot_add", "bot_remove", "channel_topic",
                              "channel_purpose", "channel_name", "pinned_item",
                              "unpinned_item", "ekm_access_denied", "message_replied"})
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def slack_len(text: str) -> int:
    """Characters once ``& < >`` are escaped as Slack wants; adds up over concatenation."""
    return len(text) + 4 * text.count("&") + 3 * (text.count("<") + text.count(">"))


def access_rules(config: SlackChannelConfig) -> AccessRules:
    """``allow_channels`` opens those channels to everyone, and confines the bot to them."""
    return AccessRules.of(dm_policy=config.dm_policy, group_policy=config.group_policy,
                          group_history=config.group_history, allow_from=config.allow_from,
                          members=config.members, allow_places=config.allow_channels,
                          confined=True)


def _too_big_reply(refused: Sequence[Attachment], limit: int) -> str:
    names = ", ".join(a.label for a in refused)
    return f"Sorry, I can't take {names}: files over {human_size(limit)} are not accepted."


WORDING = Wording(
    title="Slack", place="channel", command="`{}`", context_mark="[shared {label}]",
    failed_note='[The user shared "{label}", which could not be downloaded.]',
    too_big_note='[The user shared "{label}" ({size}), which was not downloaded: it is over '
                 "the {limit} limit.]",
    too_big_reply=_too_big_reply)


def media_kind(mime: str | None) -> MediaKind:
    top = (mime or "").split("/")[0]
    return top if top in ("image", "audio", "video") else "file"  # type: ignore[return-value]


def stored_name(ts: str, index: int, filename: str) -> str:
    """``<ts>-<n>-<name>``: unique in a channel, and safe as a file name on any system."""
    name = _UNSAFE.sub("_", filename).strip("._")[-80:] or "file"
    return f"{ts.replace('.', '_')}-{index}-{name}"


def _attachments(event: dict[str, Any]) -> tuple[Attachment, ...]:
    out = []
    for f in event.get("files") or ():
        url = f.get("url_private_download") or f.get("url_private")
        if not url:
            continue
        name = str(f.get("name") or f.get("title") or "file")
        mime = f.get("mimetype") or mimetypes.guess_type(name)[0]
        size = f.get("size")
        out.append(Attachment(source=str(url), kind=media_kind(mime), mime=mime,
                              size=int(size) if isinstance(size, int) else None, label=name,
                              name=name))
    return tuple(out)


def is_own(event: dict[str, Any], bot_user: str, bot_id: str | None) -> bool:
    return event.get("user") == bot_user or (bot_id is not None and
                                             event.get("bot_id") == bot_id)


def profile_name(profile: dict[str, Any]) -> str | None:
    """What Slack shows for a person: the display name, else the full name."""
    return profile.get("display_name") or profile.get("real_name") or None


def to_incoming(event: dict[str, Any], *, bot_user: str,
                names: dict[str, str] | None = None) -> Incoming | None:
    """A ``message`` event as an ``Incoming``; None for what is not a person's new message
    (edits, deletions, joins, the bot's own messages are filtered before). ``names``: user id
    → name, for events that carry no profile."""
    if event.get("type") != "message" or event.get("subtype") in IGNORED_SUBTYPES:
        return None
    channel, user, ts = event.get("channel"), event.get("user"), event.get("ts")
    if not (isinstance(channel, str) and isinstance(user, str) and isinstance(ts, str)):
        return None
    direct = event.get("channel_type") == "im"
    mention = f"<@{bot_user}>"
    raw = str(event.get("text") or "")
    addressed = direct or mention in raw
    text = html.unescape(raw.replace(mention, "").strip() if mention in raw else raw)
    text = re.sub(r"[ \t]{2,}", " ", text).strip()
    thread = event.get("thread_ts")
    thread_id = str(thread) if thread and thread != ts else None
    profile = event.get("user_profile") or {}
    name = profile_name(profile) or (names or {}).get(user) or user
    return Incoming(platform=NAME, id=ts, where=channel, chat_id=channel,
                    thread_id=thread_id, guild_id=None, place_ids=(channel,), direct=direct,
                    sender=Sender(id=user, name=str(name),
                                  first_name=profile.get("first_name") or None,
                                  is_bot=bool(event.get("bot_id")),
                                  # Slack ids are letters and digits (U024BE7LH): the access
                                  # lists compare such entries as names, so the id is one too
                                  handle=user),
                    addressed=addressed, text=text, attachments=_attachments(event),
                    reply_to=None, received_at=_when(ts))


def _when(ts: str) -> datetime:
    try:
        return datetime.fromtimestamp(float(ts), UTC)
    except ValueError:
        return datetime.now(UTC)


# --- replies out --------------------------------------------------------------------------------

Part = str | Media
"""A reply's part: mrkdwn text, or a file."""


def plan_parts(text: str, media: Sequence[Media]) -> list[Part]:
    """The text in mrkdwn parts of at most ``TEXT_LIMIT`` characters (cut before rendering,
    so a code fence is closed and reopened, never split), then one part per file."""
    parts: list[Part] = [*_rendered(text, _CHUNK_LIMIT)] if text.strip() else []
    return [*parts, *media]


def _rendered(text: str, limit: int) -> list[str]:
    """Chunks of ``text`` rendered; one that renders longer than a message is cut smaller."""
    out: list[str] = []
    for chunk in chunk_markdown(text, limit, slack_len):
        rendered = to_slack_mrkdwn(chunk)
        if len(rendered) > TEXT_LIMIT and limit > 100:
            out.extend(_rendered(chunk, limit // 2))
        elif rendered:
            out.append(rendered)
    return out
