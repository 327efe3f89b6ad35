"""The usage ledger: what each model call cost and whose it was, and the running tallies the
limits and ``/v1/health`` read without touching the database.

A call is priced by its configured model name (then the server's name for it): from
``agent.usage.prices``, else litellm's bundled price map, else nothing (a local server's model).
Its row in ``llm_calls`` carries the person (``channel:sender_id``), the chat, the trust level
and the day (in ``agent.timezone``), and is written in the turn's own transaction.

The tallies (turns this minute, tokens and cost today, per person, per chat and overall) live
in memory. A scope is read from the ledger once, the first time it is needed after a start;
from then on this process sees every turn itself, so no turn asks the database.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from zoneinfo import ZoneInfo

from agent.llm_types import LLMResponse
from agent.provider import bundled_model_info
from gateway.kernel.clock import Clock
from gateway.kernel.config_usage import UsageConfig
from gateway.kernel.events import InboundMessage
from gateway.kernel.store import LLMCallRecord, Store, UsageTags
from gateway.kernel.store_usage import Scope

ALL = "all"
"""The scope of everyone together."""


def person_of(msg: InboundMessage) -> str:
    return f"{msg.channel}:{msg.sender_id}"


def chat_of(msg: InboundMessage) -> str:
    return f"{msg.channel}:{msg.chat_id}"


class Prices:
    """Per-token prices by model name, looked up once per model."""

    def __init__(self, config: UsageConfig) -> None:
        self.configured = config.prices
        self._rates: dict[str, tuple[float, float]] = {}

    def rates(self, model: str) -> tuple[float, float]:
        """(input, output) per token."""
        rates = self._rates.get(model)
        if rates is None:
            rates = self._rates[model] = self._look_up(model)
        return rates

    def _look_up(self, model: str) -> tuple[float, float]:
        bare = model.split("/", 1)[1] if "/" in model else model
        price = self.configured.get(model) or self.configured.get(bare)
        if price is not None:
            return price.input / 1e6, price.output / 1e6
        info = bundled_model_info(model) or {}
        return (float(info.get("input_cost_per_token") or 0.0),
                float(info.get("output_cost_per_token") or 0.0))

    def cost(self, response: LLMResponse) -> float:
        model = response.target or response.model
        rates = self.rates(model)
        if rates == (0.0, 0.0) and response.target and response.model != response.target:
            rates = self.rates(response.model)
        return response.prompt_tokens * rates[0] + response.completion_tokens * rates[1]


@dataclass(slots=True)
class Tally:
    """One scope's counts in the current minute and day."""

    minute: str
    turns: int
    day: str
    tokens: int
    cost: float
    calls: int = 0

    def roll(self, minute: str, day: str) -> None:
        """A new minute or day starts from nothing."""
        if minute != self.minute:
            self.minute, self.turns = minute, 0
        if day != self.day:
            self.day, self.tokens, self.cost, self.calls = day, 0, 0.0, 0


class Ledger:
    """Prices calls, tags them with whose they are, and keeps the tallies."""

    def __init__(self, *, store: Store, clock: Clock, timezone: str,
                 config: UsageConfig) -> None:
        self.store = store
        self.clock = clock
        self.tz = ZoneInfo(timezone)
        self.prices = Prices(config)
        self._tallies: dict[str, Tally] = {}
        self._period: tuple[int, tuple[str, str]] = (-1, ("", ""))
        self._total = [0, 0, 0.0]
        """Every call in the ledger: calls, tokens, cost (read at start, then counted)."""

    async def load(self) -> None:
        """Today's and all-time totals from the ledger, for ``/v1/health`` (once, at start)."""
        await self.tally(ALL)
        total = await self.store.usage_total()
        self._total = [total.calls, total.tokens, total.cost]

    # periods ------------------------------------------------------------------------------

    def periods(self, now: datetime | None = None) -> tuple[str, str]:
        """(the minute, UTC ``YYYY-MM-DDTHH:MM``; the day, local ``YYYY-MM-DD``) of ``now``."""
        now = now or self.clock.now()
        minute = int(now.timestamp() // 60)  # time zones move days on whole minutes
        if minute != self._period[0]:
            self._period = (minute, (f"{now:%Y-%m-%dT%H:%M}",
                                     f"{now.astimezone(self.tz):%Y-%m-%d}"))
        return self._period[1]

    # recording ----------------------------------------------------------------------------

    def tags(self, msg: InboundMessage) -> UsageTags:
        now = self.clock.now()
        return UsageTags(person=person_of(msg), chat=chat_of(msg), trust=msg.trust, at=now,
                         day=self.periods(now)[1])

    def calls(self, responses: Iterable[LLMResponse]) -> list[LLMCallRecord]:
        return [LLMCallRecord(r.model, r.prompt_tokens, r.completion_tokens, r.latency_ms,
                              r.attempts, self.prices.cost(r)) for r in responses]

    async def record(self, session_id: int, turn_id: str, msg: InboundMessage,
                     responses: list[LLMResponse]) -> None:
        """Model calls outside a turn's own record (a compaction's summary, its memory
        flush): written on their own, counted as ``msg``'s sender's."""
        await self.record_calls(session_id, turn_id, msg, self.calls(responses))

    async def record_calls(self, session_id: int, turn_id: str, msg: InboundMessage,
                           calls: list[LLMCallRecord]) -> None:
        """Calls already priced (the media steps before a turn: ``agent/media``)."""
        tags = self.tags(msg)
        await self.store.save_calls(session_id=session_id, turn_id=turn_id, calls=calls,
                                    usage=tags)
        self.recorded(tags, calls)

    def recorded(self, tags: UsageTags, calls: list[LLMCallRecord]) -> None:
        """A turn's calls are in the ledger: the tallies of its scopes grow."""
        if not calls:
            return
        minute, day = self.periods()
        tokens = sum(c.prompt_tokens + c.completion_tokens for c in calls)
        cost = sum(c.cost for c in calls)
        self._total[0] += len(calls)
        self._total[1] += tokens
        self._total[2] += cost
        for scope in (f"person:{tags.person}", f"chat:{tags.chat}", ALL):
            tally = self._tallies.get(scope)
            if tally is None:  # not read yet: the ledger row counts when it is
                continue
            tally.roll(minute, day)
            if tags.day == day:
                tally.tokens += tokens
                tally.cost += cost
                tally.calls += len(calls)

    # tallies ------------------------------------------------------------------------------

    async def tally(self, scope: str) -> Tally:
        """``scope``'s counts now (``person:<p>``, ``chat:<c>`` or ``all``): from the ledger
        the first time after a start, from memory after that."""
        minute, day = self.periods()
        tally = self._tallies.get(scope)
        if tally is not None:
            tally.roll(minute, day)
            return tally
        kind, _, value = scope.partition(":")
        column: Scope | None = None if scope == ALL else (
            "person" if kind == "person" else "chat")
        turns, tokens, cost = await self.store.usage_tally(
            column, value or None, day=day, minute_from=f"{minute}:00+00:00")
        tally = self._tallies.setdefault(scope, Tally(minute, turns, day, tokens, cost))
        if scope == ALL:
            tally.calls = (await self.store.usage_total(day=day)).calls
        return tally

    def turn_started(self, scopes: Iterable[str]) -> None:
        """A turn was let through: it counts in its scopes' minute."""
        minute, day = self.periods()
        for scope in scopes:
            tally = self._tallies.get(scope)
            if tally is not None:
                tally.roll(minute, day)
                tally.turns += 1

    def totals(self) -> dict[str, dict[str, object]]:
        """Everyone's usage today and in all, for ``/v1/health`` (no I/O: what the tallies
        hold)."""
        tally = self._tallies.get(ALL)
        minute, day = self.periods()
        if tally is not None:
            tally.roll(minute, day)
        calls, tokens, cost = self._total
        return {"today": {"day": day, "calls": tally.calls if tally else 0,
                          "tokens": tally.tokens if tally else 0,
                          "cost": round(tally.cost, 6) if tally else 0.0},
                "all": {"calls": calls, "tokens": tokens, "cost": round(float(cost), 6)}}
