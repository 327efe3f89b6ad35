"""Slash commands: answered by the gateway itself, never sent to the model."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from gateway.kernel.events import InboundMessage
from gateway.kernel.store import Store
from gateway.kernel.values import COMMAND_DESCRIPTIONS


@dataclass(frozen=True, slots=True)
class CommandInfo:
    model: str
    tools: list[str]
    """The tools offered to the sender of the command (their trust level's)."""
    queued: int = 0


HELP = "Commands:\n" + "\n".join(f"/{name} — {text}" for name, text in
                                   COMMAND_DESCRIPTIONS.items())
GREETING = "Hi! I'm your assistant. Just write to me.\n\n" + HELP

Handler = Callable[[InboundMessage, Store, CommandInfo], Awaitable[str]]


def parse_command(text: str) -> tuple[str, str]:
    """``/New@parley_bot  args`` → (``new``, ``args``)."""
    head, _, rest = text.strip().partition(" ")
    name = head[1:].split("@", 1)[0].lower()
    return name, rest.strip()


async def _help(msg: InboundMessage, store: Store, info: CommandInfo) -> str:
    return HELP


async def _start(msg: InboundMessage, store: Store, info: CommandInfo) -> str:
    return GREETING


async def _new(msg: InboundMessage, store: Store, info: CommandInfo) -> str:
    old = await store.active_session(msg.session_key)
    await store.new_session(msg.session_key)
    kept = f" The previous one ({old.message_count} messages) is kept." if old.message_count \
        else ""
    return f"Started a new conversation.{kept}"


async def _status(msg: InboundMessage, store: Store, info: CommandInfo) -> str:
    session = await store.active_session(msg.session_key)
    calls, tokens_in, tokens_out = await store.usage(session.id)
    last = f"{session.last_context_tokens:,}" if session.last_context_tokens else "none yet"
    return "\n".join([
        f"Model: {info.model}",
        f"Session: {session.key} (#{session.id})",
        f"Messages: {session.message_count}",
        f"Last context: {last} tokens",
        f"Usage: {calls} model call(s), {tokens_in:,} tokens in, {tokens_out:,} out",
        f"Waiting messages: {info.queued}",
        f"Your trust level: {msg.trust}",
        f"Tools: {', '.join(info.tools) or 'none'}",
    ])


SHARED_STATE = frozenset({"new", "compact", "stop"})
"""Commands that change a conversation everyone in a group shares."""


def refused(msg: InboundMessage) -> str | None:
    """Why ``msg``'s command is not run, or None: a guest in a group may not reset, compact or
    stop the conversation the others are having."""
    name = parse_command(msg.text)[0]
    if name in SHARED_STATE and msg.trust == "guest" and msg.chat_type == "group":
        return (f"/{name} changes the conversation everyone here shares; only members and "
                "the owner can use it in a group.")
    return None


COMMANDS: dict[str, Handler] = {"help": _help, "start": _start, "new": _new, "status": _status}
IMMEDIATE = frozenset({"help", "start", "status"})
"""Commands answered at once, even while the session is busy with a turn."""


async def run_command(msg: InboundMessage, store: Store, info: CommandInfo) -> str:
    name, _ = parse_command(msg.text)
    handler = COMMANDS.get(name)
    if handler is None:
        return f"Unknown command /{name}. Try /help."
    return await handler(msg, store, info)
