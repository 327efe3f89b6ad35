"""The ``agent.usage``, ``agent.limits``, ``agent.models`` and ``agent.chats`` sections: what
a model call costs, who may spend how much, which models a conversation may switch to, and a
chat's own default model and prompt.

``agent/usage.py`` prices the calls, ``agent/limits.py`` applies the limits,
``agent/model_choice.py`` the aliases and per-chat defaults.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator

from gateway.kernel.config_fields import OptionalStr, Section

Level = Literal["owner", "member", "guest"]
SWITCH_LEVELS: tuple[Level, ...] = ("owner", "member")
_ALIAS = re.compile(r"^[A-Za-z0-9_.-]{1,32}$")
DEFAULT_ALIAS = "default"
"""``/model default``: the chat's default model (``agent.chats``), else ``agent.model``."""


class PriceConfig(Section):
    """What one model costs, per million tokens (in the currency of your provider's bill)."""

    input: float = Field(0.0, ge=0)
    output: float = Field(0.0, ge=0)


class UsageConfig(Section):
    prices: dict[str, PriceConfig] = Field(default_factory=dict)
    """Model name → price; wins over litellm's price map. A model neither here nor in the
    map (a local server's) costs nothing."""


class LimitSet(Section):
    """Limits of one scope; an unset limit does not apply."""

    messages_per_minute: int | None = Field(None, gt=0)
    tokens_per_day: int | None = Field(None, gt=0)
    cost_per_day: float | None = Field(None, gt=0)

    @property
    def any(self) -> bool:
        return any(v is not None for v in (self.messages_per_minute, self.tokens_per_day,
                                           self.cost_per_day))

    def over(self, other: LimitSet) -> LimitSet:
        """``other``'s limits where set, else these."""
        return LimitSet(**{**self.model_dump(), **other.model_dump(exclude_none=True)})


def _check_keys(keys: list[str], what: str) -> None:
    for key in keys:
        channel, _, rest = key.partition(":")
        if not channel or not rest:
            raise ValueError(f"{key!r} is not a {what}: write channel:id "
                             "(e.g. telegram:123456789)")


class LimitsConfig(Section):
    """Per trust level (each person of that level on their own), per person
    (``channel:sender_id``, over their level's), per chat (``channel:chat_id``: everyone in it
    together) and overall (everyone together). Minutes and days are the clock's, days in
    ``agent.timezone``."""

    owner: LimitSet = LimitSet()
    member: LimitSet = LimitSet()
    guest: LimitSet = LimitSet()
    people: dict[str, LimitSet] = Field(default_factory=dict)
    chats: dict[str, LimitSet] = Field(default_factory=dict)
    overall: LimitSet = LimitSet()
    cap_owner: bool = False
    """False: the owner is held only by ``owner`` and ``people`` limits set for them, never
    by a chat's or the overall ones."""

    @field_validator("people")
    @classmethod
    def _people(cls, people: dict[str, LimitSet]) -> dict[str, LimitSet]:
        _check_keys(list(people), "person")
        return people

    @field_validator("chats")
    @classmethod
    def _chats(cls, chats: dict[str, LimitSet]) -> dict[str, LimitSet]:
        _check_keys(list(chats), "chat")
        return chats

    @property
    def any(self) -> bool:
        return any(s.any for s in (self.owner, self.member, self.guest, self.overall,
                                   *self.people.values(), *self.chats.values()))


class FallbackAlias(Section):
    model: str = Field(min_length=1)
    api_base: OptionalStr = None
    api_key: OptionalStr = None


class ModelAlias(Section):
    """One model a conversation may switch to, with its own server, key and fallbacks."""

    model: str = Field(min_length=1)
    api_base: OptionalStr = None
    api_key: OptionalStr = None
    fallbacks: list[str | FallbackAlias] = Field(default_factory=list)
    """Tried in order when this one fails; a plain name shares this alias's server and key."""


class ModelsConfig(Section):
    aliases: dict[str, ModelAlias] = Field(default_factory=dict)
    """Name → model, e.g. ``fast``, ``smart``, ``local``; ``/model <name>`` switches to it."""
    switch: list[Level] = Field(default_factory=lambda: list(SWITCH_LEVELS))
    """Trust levels that may use ``/model`` to switch."""

    @field_validator("aliases")
    @classmethod
    def _names(cls, aliases: dict[str, ModelAlias]) -> dict[str, ModelAlias]:
        for name in aliases:
            if not _ALIAS.match(name):
                raise ValueError(f"{name!r} is not an alias name (letters, digits, _ . -)")
            if name == DEFAULT_ALIAS:
                raise ValueError(f"{DEFAULT_ALIAS!r} is reserved: /model default goes back to "
                                 "the chat's default")
        return aliases


class ChatDefaults(Section):
    """A chat's (``channel:chat_id``) or a whole channel's (``channel``) own defaults."""

    model: OptionalStr = None
    """An alias of ``agent.models.aliases``: the model until someone uses /model."""
    prompt: OptionalStr = None
    """Added to the system prompt of this chat's turns."""


def check_chat_defaults(chats: dict[str, ChatDefaults], models: ModelsConfig) -> None:
    """Every chat default names a configured alias; raises ValueError naming the key."""
    for key, chat in chats.items():
        if chat.model is not None and chat.model not in models.aliases:
            known = ", ".join(sorted(models.aliases)) or "none configured"
            raise ValueError(f"chats.{key}.model: {chat.model!r} is not an alias of "
                             f"agent.models.aliases ({known})")

