"""What a turn sends the model, assembled from what is stored.

The history since the session's last compaction (at most ``max_recent_messages``), built by
the ContextBuilder with the hints of the chat the answer goes to and the size of the tool
list, which is counted again only when the tools change (an MCP server's come and go).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agent.budget import WINDOW_KEY, TokenCounter, WindowPlan, WindowTooSmall
from agent.context import BuiltContext, ContextBuilder, TurnState
from agent.history import SESSIONS_KEPT, HistoryCache
from agent.model_choice import ModelChoice
from agent.provider import Provider, context_window
from agent.runner import TurnBudget
from agent.tools.base import NO_LOADED, ToolRegistry
from agent.trust import ALL_TOOLS, Audience, ToolFilter
from gateway.kernel.config import Config
from gateway.kernel.events import InboundMessage
from gateway.kernel.store import Compaction, Store, StoredMessage
from gateway.kernel.values import ChannelHints

RUNTIME_TOKENS = 150
"""About what the runtime block takes without memory recall (time, chat, sender, hints)."""


class ContextAssembly:
    def __init__(self, *, config: Config, store: Store, provider: Provider,
                 registry: ToolRegistry, counter: TokenCounter,
                 hints: Callable[[str], ChannelHints],
                 models: ModelChoice | None = None) -> None:
        """``models``: the model each conversation uses and its chat's own prompt."""
        self.config = config
        self.store = store
        self.provider = provider
        self.registry = registry
        self.counter = counter
        self.hints = hints
        self.models = models
        self._builder: ContextBuilder | None = None
        self._history = HistoryCache(store, config.agent.context.max_recent_messages)
        self._called: dict[int, tuple[int, int, frozenset[str]]] = {}
        """By a history's first message id: how many messages were read, the last one's id,
        the tools they called (``_tools_called``)."""
        self._window_problem: str | None = None
        self._tools_tokens: dict[tuple[ToolFilter, frozenset[str]],
                                 tuple[list[dict[str, Any]], int]] = {}

    @property
    def builder(self) -> ContextBuilder:
        """Built on first use: asking litellm for the model's window imports litellm."""
        if self._builder is None:
            window = None
            if self.config.agent.context.max_context_tokens is None:
                window = context_window(self.config.agent.model,
                                        ask_litellm=self.provider.needs_litellm)
            self._builder = ContextBuilder(self.config, self.counter, window=window)
        return self._builder

    @property
    def room(self) -> int:
        """Tokens a request may take: the window less what is kept for the reply."""
        return self.builder.max_context_tokens - self.builder.reply_reserve

    def plan(self) -> WindowPlan:
        """How the window is shared out for the owner (the largest prompt, every tool):
        ``plan().problem()`` refuses a window too small, ``plan().warning`` names a tight
        one."""
        return _plan(self.config, self.builder, self._schema_tokens(ALL_TOOLS))

    async def history(self, session_id: int,
                      compaction: Compaction | None) -> tuple[list[StoredMessage], bool]:
        """Messages since the last compaction, at most ``max_recent_messages``; and whether
        there were more (then the session is due for compaction). Only the rows written
        since the session's last turn are read (``agent/history.py``)."""
        return await self._history.history(session_id, compaction)

    def audience(self, msg: InboundMessage) -> Audience:
        """What the sender of ``msg`` may see and do (``agent/trust.py``)."""
        return self.builder.policy.audience(msg)

    def build(self, msg: InboundMessage, history: list[StoredMessage],
              compaction: Compaction | None, *, turn_id: str,
              state: TurnState | None = None, audience: Audience | None = None
              ) -> BuiltContext:
        """``audience``: the sender's, when the turn has it already (``audience(msg)``)."""
        if self._window_problem is None:  # once: the window may be known only now
            self._window_problem = self.plan().problem() or ""
        if self._window_problem:
            raise WindowTooSmall(f"{WINDOW_KEY}: {self._window_problem}")
        audience = audience or self.audience(msg)
        models = self.models
        model = models.model_name(models.alias(msg)) if models is not None else None
        chat_prompt = models.prompt(msg) if models is not None else None
        loaded = self.recently_used(audience.tools, history)
        built = self.builder.build(
            inbound=msg, history=history,
            hints=self.hints(msg.deliver_to[0] if msg.deliver_to else msg.channel),
            tools_tokens=self._schema_tokens(audience.tools, loaded),
            session_key=msg.session_key, turn_id=turn_id, compaction=compaction,
            audience=audience, model=model, chat_prompt=chat_prompt, state=state)
        built.loaded = loaded
        return built

    def recently_used(self, allowed: ToolFilter,
                      history: list[StoredMessage]) -> frozenset[str]:
        """Tools not offered at first that the conversation since its last compaction called,
        or that an always-on skill names (``tools:``): offered in full from the start
        (relevance, without a ``load_tools`` round trip)."""
        deferred = self.registry.deferred(allowed)
        if not deferred:
            return NO_LOADED
        used = set(self._tools_called(history))
        used.update(t for s in self.builder.skills.skills() if s.always and s.available
                    for t in s.tools)
        return frozenset(n for n in deferred if n in used) or NO_LOADED

    def _tools_called(self, history: list[StoredMessage]) -> frozenset[str]:
        """The tools ``history``'s assistant messages called; a session's next turn reads
        only the messages added since (its history is the last one's plus the new turn)."""
        if not history:
            return NO_LOADED
        count, last_id, called = self._called.get(history[0].id, (0, 0, NO_LOADED))
        if not (0 < count <= len(history) and history[count - 1].id == last_id):
            count, called = 0, NO_LOADED  # compacted or trimmed differently: all again
        new = {c.get("function", {}).get("name") for m in history[count:]
               if m.role == "assistant" for c in m.body.get("tool_calls") or ()}
        if new - called:
            called = frozenset(called | new)
        # bounded like the history cache: a session it no longer holds reads its whole
        # history anew, beside which one scan of it costs little
        if len(self._called) >= 2 * SESSIONS_KEPT:
            self._called.clear()
        self._called[history[0].id] = (len(history), history[-1].id, called)
        return called

    def budget(self, built: BuiltContext) -> TurnBudget:
        """What the tool loop may add to ``built`` before old tool results are shortened."""
        return TurnBudget(limit=self.room, used=built.snapshot["total_tokens"],
                          count=self.counter.count_message)

    def _schema_tokens(self, allowed: ToolFilter, loaded: frozenset[str] = NO_LOADED) -> int:
        # A new list only when tools come or go (MCP), so each audience's count is cached.
        schemas = self.registry.schemas(allowed, loaded)
        key = (allowed, loaded)
        cached = self._tools_tokens.get(key)
        if cached is None or cached[0] is not schemas:
            if len(self._tools_tokens) >= 4096:
                self._tools_tokens.clear()
            cached = self._tools_tokens[key] = (schemas, self.counter.count_tools(schemas))
        return cached[1]


def _plan(config: Config, builder: ContextBuilder, tools_tokens: int) -> WindowPlan:
    memory = config.agent.memory
    return WindowPlan(
        window=builder.max_context_tokens, reserve=builder.reply_reserve,
        system=builder.system_prompt().tokens, tools=tools_tokens,
        runtime=RUNTIME_TOKENS + (memory.recall_max_tokens if memory.enabled else 0),
        model=None if config.agent.context.max_context_tokens else config.agent.model)


def plan_for(config: Config) -> WindowPlan:
    """The window's plan from the config alone (``parley status`` without a running
    gateway): the workspace's prompt and the configured tools (exec left out)."""
    from agent.tools import build_registry

    counter = TokenCounter(config.agent.model)
    window = None
    if config.agent.context.max_context_tokens is None:
        window = context_window(config.agent.model, ask_litellm=False)
    registry = build_registry(config.agent.tools, memory=config.agent.memory,
                              timezone=config.agent.timezone)
    return _plan(config, ContextBuilder(config, counter, window=window),
                 counter.count_tools(registry.schemas(ALL_TOOLS)))
