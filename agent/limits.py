"""Spending caps and rate limits, checked once per turn before the model is asked.

Which limits hold for a message (``agent.limits``): its sender's trust level's, over which a
person's own entry wins; the chat's; and the overall ones. The owner is held only by limits
set for the owner (or for them by name) unless ``cap_owner`` is on. The counts come from the
ledger's tallies (``agent/usage.py``), so they survive a restart; a minute or a day that ends
starts the count afresh.

A turn over a limit never reaches the model. Its sender hears one short notice per limit and
period (recorded in ``limit_notices``, so a restart does not repeat it); further messages in
that period are marked answered in silence.
"""

from __future__ import annotations

from agent.usage import ALL, Ledger, Tally, chat_of, person_of
from gateway.kernel.config_usage import LimitsConfig, LimitSet
from gateway.kernel.events import InboundMessage
from gateway.kernel.frozen import frozen
from gateway.kernel.store import Store


@frozen
class Verdict:
    """A limit the turn would go over."""

    person: str
    scope: str
    limit: str
    period: str
    text: str

    @property
    def notice_key(self) -> tuple[str, str]:
        """One notice per person, limit and period."""
        return f"{self.person}|{self.scope}|{self.limit}", self.period


def _whose(scope: str) -> str:
    if scope == ALL:
        return "everyone's together"
    return "this chat's" if scope.startswith("chat:") else "your"


def _over(scope: str, limits: LimitSet, tally: Tally) -> tuple[str, str, str] | None:
    """(limit, period, notice) of the first limit ``tally`` has reached, or None."""
    whose = _whose(scope)
    if limits.messages_per_minute is not None and tally.turns >= limits.messages_per_minute:
        return ("messages_per_minute", tally.minute,
                f"(That's {whose} limit of {limits.messages_per_minute} messages a minute: "
                "I'll answer again in a minute.)")
    if limits.tokens_per_day is not None and tally.tokens >= limits.tokens_per_day:
        return ("tokens_per_day", tally.day,
                f"({whose.capitalize()} usage for today has reached its limit of "
                f"{limits.tokens_per_day:,} tokens: I'll answer again tomorrow.)")
    if limits.cost_per_day is not None and tally.cost >= limits.cost_per_day:
        return ("cost_per_day", tally.day,
                f"({whose.capitalize()} spending for today has reached its limit of "
                f"{limits.cost_per_day:g}: I'll answer again tomorrow.)")
    return None


class Limits:
    def __init__(self, config: LimitsConfig, ledger: Ledger, store: Store) -> None:
        self.config = config
        self.ledger = ledger
        self.store = store
        self._noticed: set[tuple[str, str]] = set()
        self.enabled = config.any
        """Any limit set at all: else no turn is checked."""

    def applicable(self, msg: InboundMessage) -> list[tuple[str, LimitSet]]:
        """The scopes whose limits hold for ``msg``, with those limits."""
        config, person = self.config, person_of(msg)
        out: list[tuple[str, LimitSet]] = []
        own = getattr(config, msg.trust)
        if person in config.people:
            own = own.over(config.people[person])
        if own.any:
            out.append((f"person:{person}", own))
        if msg.trust != "owner" or config.cap_owner:
            chat = config.chats.get(chat_of(msg))
            if chat is not None and chat.any:
                out.append((f"chat:{chat_of(msg)}", chat))
            if config.overall.any:
                out.append((ALL, config.overall))
        return out

    async def check(self, msg: InboundMessage) -> Verdict | None:
        """The limit ``msg``'s turn would go over, or None (then the turn is counted)."""
        if msg.kind != "user":
            return None
        scopes = self.applicable(msg)
        for scope, limits in scopes:
            over = _over(scope, limits, await self.ledger.tally(scope))
            if over is not None:
                return Verdict(person_of(msg), scope, *over)
        self.ledger.turn_started([scope for scope, _ in scopes] +
                                 ([] if any(s == ALL for s, _ in scopes) else [ALL]))
        return None

    async def first_notice(self, verdict: Verdict) -> bool:
        """Whether ``verdict``'s notice is still to be sent (and now counts as sent)."""
        key = verdict.notice_key
        if key in self._noticed:
            return False
        self._noticed.add(key)
        if len(self._noticed) > 10_000:  # old periods: the database keeps them
            self._noticed = {key}
        return await self.store.add_notice(*key)
