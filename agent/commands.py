"""Slash commands: answered by the gateway itself, never sent to the model."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from gateway.kernel.events import InboundMessage
from gateway.kernel.frozen import frozen
from gateway.kernel.store import Store, UsageRow
from gateway.kernel.values import COMMAND_DESCRIPTIONS

if TYPE_CHECKING:
    from agent.model_choice import ModelChoice
    from agent.usage import Ledger


@frozen
class CommandInfo:
    model: str
    tools: list[str]
    """The tools offered to the sender of the command (their trust level's)."""
    queued: int = 0
    models: ModelChoice | None = None
    ledger: Ledger | None = None


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
    cost = (await store.usage_total(session_id=session.id)).cost
    last = f"{session.last_context_tokens:,}" if session.last_context_tokens else "none yet"
    return "\n".join([
        f"Model: {info.model}",
        f"Session: {session.key} (#{session.id})",
        f"Messages: {session.message_count}",
        f"Last context: {last} tokens",
        f"Usage: {calls} model call(s), {tokens_in:,} tokens in, {tokens_out:,} out, "
        f"cost {cost:.4f}",
        f"Waiting messages: {info.queued}",
        f"Your trust level: {msg.trust}",
        f"Tools: {', '.join(info.tools) or 'none'}",
    ])


def _figures(row: UsageRow) -> str:
    return (f"{row.calls} model call(s), {row.tokens:,} tokens ({row.prompt_tokens:,} in, "
            f"{row.completion_tokens:,} out), cost {row.cost:.4f}")


async def _usage(msg: InboundMessage, store: Store, info: CommandInfo) -> str:
    """The speaker's own figures; the owner also sees everyone's."""
    person = f"{msg.channel}:{msg.sender_id}"
    day = info.ledger.periods()[1] if info.ledger is not None else None
    lines = [f"Your usage today ({day}): "
             f"{_figures(await store.usage_total(person=person, day=day))}"] if day else []
    lines.append(f"Your usage in all: {_figures(await store.usage_total(person=person))}")
    if msg.trust == "owner":
        if day:
            lines.append(f"Everyone today: {_figures(await store.usage_total(day=day))}")
        lines.append(f"Everyone in all: {_figures(await store.usage_total())}")
    return "\n".join(lines)


async def _model(msg: InboundMessage, store: Store, info: CommandInfo) -> str:
    if info.models is None:
        return f"Model: {info.model}"
    return await info.models.command(msg, parse_command(msg.text)[1])


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


COMMANDS: dict[str, Handler] = {"help": _help, "start": _start, "new": _new, "status": _status,
                                 "usage": _usage, "model": _model}
IMMEDIATE = frozenset({"help", "start", "status", "usage"})
"""Commands answered at once, even while the session is busy with a turn."""


async def run_command(msg: InboundMessage, store: Store, info: CommandInfo) -> str:
    name, _ = parse_command(msg.text)
    handler = COMMANDS.get(name)
    if handler is None:
        return f"Unknown command /{name}. Try /help."
    return await handler(msg, store, info)
