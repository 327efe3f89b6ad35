"""The message tool: send text and workspace files now, and hear whether they arrived.

The target is the turn's own chat (a scheduled turn's target chat) unless the model names
another one, which must be listed in ``agent.tools.message.allowed_targets``. The gateway
delivers at once with a few quick retries and the tool returns the real result, so the model
never reports "sent" for a message that was not. Once the current chat got a message this way
the turn's final reply is stored but not sent again.
"""

from __future__ import annotations

import mimetypes

from agent.tools.base import ToolError, ToolRetry, tool
from agent.tools.files import resolve_for
from agent.turn import TurnContext
from gateway.kernel.events import Media, MediaKind, OutboundKind, OutboundMessage

MAX_FILES = 10


def _media(ctx: TurnContext, path: str) -> Media:
    target = resolve_for(ctx, path, restrict=True)
    if not target.is_file():
        raise ToolRetry(f"file not found in the workspace: {path}")
    mime = mimetypes.guess_type(target.name)[0] or "application/octet-stream"
    major = mime.split("/", 1)[0]
    kind: MediaKind = major if major in ("image", "audio", "video") else "file"  # type: ignore[assignment]
    return Media(kind=kind, path=str(target), mime=mime, size=target.stat().st_size)


def _parse_target(to: str) -> tuple[str, str]:
    channel, _, chat_id = to.strip().partition(":")
    if not channel or not chat_id:
        raise ToolRetry(f"to={to!r} is not a chat; write channel:chat_id, or leave it out to "
                        "message the current chat")
    return channel, chat_id


@tool(group="message")
async def message(ctx: TurnContext, text: str, files: list[str] | None = None,
                  to: str | None = None) -> str:
    """Send a message right now, optionally with workspace files attached, and learn whether it
    was delivered. Use it to send files, or to say something before you finish working. If you
    answered the user with this tool, your final reply is not sent again.

    Args:
        text: the message text.
        files: workspace file paths to attach (images are shown as pictures).
        to: another chat as channel:chat_id, only one the owner allowed; leave it out to message
            the current chat.
    """
    current = ctx.reply_target
    target = _parse_target(to) if to else current
    if target is None:
        raise ToolRetry("this turn has no chat of its own; name an allowed chat in `to`")
    name = f"{target[0]}:{target[1]}"
    if target != current and ctx.access.trust != "owner":
        raise ToolError(f"messaging {name} is not allowed in this conversation; only the "
                        "current chat can be messaged")
    if target != current and name not in ctx.tools.message.allowed_targets:
        raise ToolError(f"messaging {name} is not allowed; only the current chat and the chats "
                        "in agent.tools.message.allowed_targets can be messaged")
    if not text.strip() and not files:
        raise ToolRetry("nothing to send: give text, files or both")
    if files and len(files) > MAX_FILES:
        raise ToolRetry(f"at most {MAX_FILES} files per message")
    media = tuple(_media(ctx, p) for p in files or ())
    send = ctx.services.send
    if send is None:
        raise ToolError("messages cannot be sent from here")
    is_current = target == current
    turn_kind = ctx.message.kind
    kind: OutboundKind = turn_kind if turn_kind in ("cron", "heartbeat") else "reply"  # type: ignore[assignment]
    delivery = await send(OutboundMessage(
        channel=target[0], chat_id=target[1], text=text, media=media, kind=kind,
        thread_id=ctx.reply_thread if is_current else None,
        reply_to=ctx.message.message_id if is_current else None,  # it answers the message
        turn_id=ctx.turn_id))
    if not delivery.ok:
        why = delivery.error or "the channel refused it"
        raise ToolError(f"NOT delivered to {name}: {why}. Nothing was sent; tell the user or "
                        "try another way." if delivery.permanent else
                        f"NOT delivered to {name} after retrying: {why}. Nothing was sent.")
    attached = f" with {len(media)} file(s)" if media else ""
    if is_current:
        ctx.notes.answered_current_chat = True
        return (f"Delivered to the current chat{attached}. Your final reply is kept in the "
                "conversation but not sent again, so do not repeat the message.")
    return f"Delivered to {name}{attached}."


MESSAGE_TOOLS = [message]
