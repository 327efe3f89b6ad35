"""Subagents: the agent hands a self-contained task to a helper with a fresh context.

A subagent runs the same tool loop in its own session (``subagent:<parent session>:<id>``,
stored like any other, so ``parley sessions show`` explains it) with a minimal system prompt
and the parent's tools less the ones that reach out on their own (message, cron, spawn): it
cannot talk to people, schedule jobs or spawn further subagents. Iterations, run time and the
number running at once are bounded by ``agent.tools.spawn``.

In the foreground the result is the spawn tool's result, inside the parent's turn. In the
background the tool returns at once and the result comes back later as an inbound system
message (``kind="subagent"``) in the parent's session, routed by the turn context: the main
agent then takes it up in a turn of its own and tells the chat it came from. That keeps the
result in the conversation's history, and the durable inbox keeps it across a restart.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Any

from agent.budget import TokenCounter
from agent.context import context_hash
from agent.errors import ProviderError
from agent.provider import Provider
from agent.runner import Runner, RunResult
from agent.sessions import SessionRecorder, TurnRecord
from agent.snapshots import RecordingTranscript, text_hash
from agent.tools.base import ToolError, ToolRegistry
from agent.turn import TurnContext, TurnNotes, TurnServices
from agent.usage import Ledger
from gateway.kernel.bus import BusClosed, MessageBus
from gateway.kernel.config import Config
from gateway.kernel.events import InboundMessage, new_id, utcnow
from gateway.kernel.store import Store

_log = logging.getLogger(__name__)

EXCLUDED_GROUPS = frozenset({"message", "cron", "spawn"})
"""Tool groups a subagent never gets: no messages to people, no jobs, no further subagents."""
EXCLUDED_NAMES = frozenset({"message", "send_message", "cron", "spawn"})
RESULT_TAG = "[Subagent result — from a background task you started, not from the user]"

SYSTEM_PROMPT = """\
# Subagent
You are a subagent. The main agent handed you the task in the next message; you do not see \
its conversation and nobody reads your messages but the main agent. Work on the task with \
your tools, then end with one complete, concise answer: what you found or did, with the \
details the main agent needs (paths, numbers, sources). Say plainly what you could not do.
Workspace: {workspace}
Current time: {now}"""


def subagent_registry(parent: ToolRegistry) -> ToolRegistry:
    """The parent's tools (MCP ones too) less those a subagent must not have."""
    tools = (parent.get(name) for name in parent.names)
    return ToolRegistry((t for t in tools if t is not None and t.group not in EXCLUDED_GROUPS
                         and t.name not in EXCLUDED_NAMES),
                        core=parent.core.patterns if parent.core is not None else None)


class SubagentManager:
    """Runs subagents for the gateway; ``spawn`` is the ``Spawner`` turns get."""

    def __init__(self, *, config: Config, provider: Provider, registry: ToolRegistry,
                 bus: MessageBus | None = None, store: Store | None = None,
                 ledger: Ledger | None = None) -> None:
        """``ledger``: where a subagent's model calls are counted, as its asker's."""
        self.config = config
        self.settings = config.agent.tools.spawn
        self.provider = provider
        self.registry = registry
        self.bus = bus
        self.store = store
        self.ledger = ledger
        self.counter = TokenCounter(config.agent.model)
        self.recorder = SessionRecorder(store, self.counter, ledger) \
            if store is not None else None
        self.running = 0
        self.finished = 0
        self._tasks: set[asyncio.Task[None]] = set()

    async def spawn(self, ctx: TurnContext, task: str, *, background: bool) -> str:
        if not task.strip():
            raise ToolError("the task is empty; describe what the subagent should do")
        if self.running >= self.settings.max_concurrent:
            raise ToolError(f"{self.running} subagents are already running (the limit); wait "
                            "for one to finish, or do the task yourself")
        if background and ctx.reply_target is None:
            raise ToolError("this turn has no chat to report back to; run the subagent in the "
                            "foreground (background: false)")
        sub_id = new_id()[-8:]  # the random end (the start is the time)
        self.running += 1
        if not background:
            try:
                result = await self._run(ctx, task, sub_id)
            finally:
                self.running -= 1
            return f"[subagent {sub_id}: {result.stop_reason}]\n{result.text}"
        job = asyncio.create_task(self._background(ctx, task, sub_id), name=f"subagent:{sub_id}")
        self._tasks.add(job)
        job.add_done_callback(self._tasks.discard)
        return (f"Subagent {sub_id} started in the background. Its result will arrive in this "
                "chat as a new message; do not wait for it or poll.")

    async def _background(self, ctx: TurnContext, task: str, sub_id: str) -> None:
        try:
            result = await self._run(ctx, task, sub_id)
        except Exception:
            _log.exception("subagent %s failed", sub_id)
            return
        finally:
            self.running -= 1
        if self.bus is None:
            return
        # Routed by the turn context, never by the model: back into the parent's session,
        # answered to the chat the parent turn answers (a cron turn's target, say).
        parent = ctx.message
        msg = InboundMessage(
            channel=parent.channel, chat_id=parent.chat_id, sender_id="subagent",
            sender_name=f"subagent {sub_id}", kind="subagent", chat_type=parent.chat_type,
            trust=parent.trust,
            thread_id=parent.thread_id, session_override=ctx.session_key,
            deliver_to=ctx.reply_target, deliver_thread=ctx.reply_thread,
            text=f"{RESULT_TAG}\nTask: {task}\nOutcome: {result.stop_reason}\n\n{result.text}")
        try:
            await self.bus.publish_inbound(msg)
        except BusClosed:
            _log.warning("subagent %s finished while the gateway was stopping; its result "
                         "for %s was not delivered", sub_id, ctx.session_key)

    async def _run(self, ctx: TurnContext, task: str, sub_id: str) -> RunResult:
        key = f"subagent:{ctx.session_key}:{sub_id}"
        session_id = ctx.session_id
        if self.store is not None:
            session_id = (await self.store.active_session(key)).id
        sub_ctx = dataclasses.replace(
            ctx, message=dataclasses.replace(ctx.message, kind="subagent", session_override=key),
            session_id=session_id, turn_id=new_id(), services=TurnServices(), notes=TurnNotes())
        system = SYSTEM_PROMPT.format(workspace=ctx.workspace,
                                      now=ctx.received_at.strftime("%Y-%m-%d %H:%M %Z (%A)"))
        user = {"role": "user", "content": task}
        messages = [{"role": "system", "content": system}, user]
        snapshot, texts = self._snapshot(sub_ctx, key, messages)
        runner = Runner(self.provider, subagent_registry(self.registry),
                        max_iterations=self.settings.max_iterations,
                        max_result_chars=self.config.agent.tools.max_result_chars)
        started = utcnow()
        # what was done, should it time out or fail; and each model call's snapshot entry
        transcript = RecordingTranscript(snapshot, texts, messages)
        _log.info("subagent %s started for %s", sub_id, ctx.session_key)
        try:
            async with asyncio.timeout(self.settings.timeout):
                result = await runner.run(messages=messages, ctx=sub_ctx, hooks=transcript)
        except TimeoutError:
            result = transcript.so_far
            result.stop_reason = "timeout"
            result.text = (f"The subagent stopped after {self.settings.timeout:g}s without "
                           "finishing.")
        except ProviderError as exc:
            result = transcript.so_far
            result.stop_reason = "error"
            result.text = f"The subagent could not reach the model: {exc.user_message}"
        self.finished += 1
        _log.info("subagent %s finished: %s", sub_id, result.stop_reason)
        if self.recorder is not None:
            await self.recorder.finish(
                TurnRecord(session_id=session_id, turn_id=sub_ctx.turn_id, inbound_id=None,
                           started_at=started, user_message=user,
                           user_tokens=self.recorder.counter.count_message(user), sources=[],
                           snapshot=snapshot, texts=texts,
                           usage=self.ledger.tags(ctx.message) if self.ledger else None),
                result, status=result.stop_reason)
        return result

    def _snapshot(self, ctx: TurnContext, key: str, messages: list[dict[str, Any]]
                  ) -> tuple[dict[str, Any], dict[str, str]]:
        """A subagent's snapshot, like a turn's: its prompt stored by content hash, so
        ``parley context show subagent:... --full`` rebuilds each of its model calls."""
        system, user = messages[0]["content"], messages[1]
        counter = self.counter
        layers = {"subagent": counter.count_text(system), "user": counter.count_message(user)}
        snapshot = {
            "kind": "subagent", "session_key": key, "turn_id": ctx.turn_id,
            "hash": context_hash(messages), "trust": ctx.message.trust,
            "model": self.config.agent.model, "total_tokens": sum(layers.values()) + 4,
            "max_context_tokens": 0, "layers": layers,
            "sources": {"parent": ctx.message.session_key}, "trimmed": [],
            "bootstrap_cuts": [], "texts": {"system": [["subagent", text_hash(system)]]}}
        return snapshot, {text_hash(system): system}

    async def stop(self) -> None:
        """Cancel background subagents (their results are lost); safe to call twice."""
        tasks = list(self._tasks)
        for job in tasks:
            job.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def status(self) -> dict[str, int]:
        return {"running": self.running, "finished": self.finished}
