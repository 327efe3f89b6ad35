"""Which model answers a conversation: ``/model`` per conversation, per-chat defaults.

A conversation (its session key) uses the alias chosen with ``/model <alias>``
(``agent.models.aliases``), kept in the database so a restart keeps it; else its chat's default
(``agent.chats["channel:chat_id"].model``), else its server's
(``agent.chats["discord:server:<guild_id>"]``), else its channel's (``agent.chats["channel"]``),
else ``agent.model``. ``/model default`` forgets the choice. Which trust levels may switch is
``agent.models.switch``. A chat's ``prompt`` is added to the system prompt the same way.

The choices are read once at start and kept in memory: a turn asks no database for them.
"""

from __future__ import annotations

from gateway.kernel.config import AgentConfig
from gateway.kernel.config_usage import DEFAULT_ALIAS, ChatDefaults
from gateway.kernel.events import InboundMessage
from gateway.kernel.store import Store


class ModelChoice:
    def __init__(self, config: AgentConfig, store: Store) -> None:
        self.config = config
        self.store = store
        self._chosen: dict[str, str] = {}

    async def load(self) -> None:
        """The conversations' choices, from the database (once, at start)."""
        self._chosen = await self.store.conversation_models()

    def _chat(self, msg: InboundMessage) -> ChatDefaults | None:
        chats = self.config.chats
        if not chats:
            return None
        channel, chat_id = msg.deliver_to or (msg.channel, msg.chat_id)
        server = msg.server_id if msg.deliver_to is None else None
        return chats.get(f"{channel}:{chat_id}") or (
            chats.get(f"{channel}:server:{server}") if server else None) or chats.get(channel)

    def default_alias(self, msg: InboundMessage) -> str | None:
        chat = self._chat(msg)
        return chat.model if chat is not None else None

    def alias(self, msg: InboundMessage) -> str | None:
        """The alias ``msg``'s turn uses; None: ``agent.model``."""
        chosen = self._chosen.get(msg.session_key)
        if chosen is not None and chosen in self.config.models.aliases:
            return chosen
        return self.default_alias(msg)

    def model_name(self, alias: str | None) -> str:
        return self.config.models.aliases[alias].model if alias else self.config.model

    def prompt(self, msg: InboundMessage) -> str | None:
        """The chat's own addition to the system prompt, if it has one."""
        chat = self._chat(msg)
        return chat.prompt if chat is not None else None

    def may_switch(self, msg: InboundMessage) -> bool:
        return msg.trust in self.config.models.switch

    def listing(self, msg: InboundMessage) -> str:
        """What ``/model`` alone says: the model in use and what this speaker may choose."""
        current = self.alias(msg)
        lines = [f"Model: {self.model_name(current)}" + (f" ({current})" if current else "")]
        aliases = self.config.models.aliases
        if not aliases:
            lines.append("No other models are configured (agent.models.aliases).")
        elif not self.may_switch(msg):
            lines.append("Switching models is not open to you here.")
        else:
            lines.append("You can switch with /model <name>:")
            default = self.default_alias(msg)
            lines.append(f"- default: {self.model_name(default)}")
            lines += [f"- {name}: {alias.model}" + (" ← now" if name == current else "")
                      for name, alias in aliases.items()]
        return "\n".join(lines)

    async def command(self, msg: InboundMessage, args: str) -> str:
        """``/model``, ``/model <alias>``, ``/model default``."""
        name = args.strip()
        if not name:
            return self.listing(msg)
        if not self.may_switch(msg):
            return "Switching models is not open to you here."
        key = msg.session_key
        if name == DEFAULT_ALIAS:
            await self.store.set_conversation_model(key, None)
            self._chosen.pop(key, None)
            return f"Back to the default model: {self.model_name(self.alias(msg))}."
        if name not in self.config.models.aliases:
            known = ", ".join(["default", *self.config.models.aliases])
            return f"There is no model {name!r} here. Choose one of: {known}."
        await self.store.set_conversation_model(key, name)
        self._chosen[key] = name
        return f"This conversation now uses {name} ({self.model_name(name)})."
