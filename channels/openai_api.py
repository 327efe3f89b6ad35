"""The OpenAI-compatible API as a channel: ``POST /v1/chat/completions`` (plain, or streamed
as server-sent events) and ``GET /v1/models``, on a listener of its own (``channels.openai``,
off by default, loopback unless a token is set).

A request is one turn of a Parley session, taken exactly like a chat message: its new user
text (``openai_wire``: only the last message; Parley keeps the history) goes to the bus as an
``InboundMessage`` of this channel — stored in the inbox before anything else — and the agent
answers it with the same context, tools, limits and outbox as every chat. The session is the
``X-Parley-Session`` header, else the request's ``user``, else ``default``; requests of one
session take turns (each waits for the one before it). The HTTP answer waits for the turn's
reply to come back through the outbox to ``send``: what the client reads is what was stored.

Streaming: ``Deltas`` is where the streamed text comes from. Today (``whole_reply``) it waits
for the stored answer and hands it out in pieces; a live source of the turn's text deltas
plugs in there, with the rest of the stream unchanged.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING

from aiohttp import web
from aiohttp.typedefs import Middleware

from channels.base import ChannelBase, ChannelStatus
from channels.http_api import ApiError, json_errors, listen
from channels.local_requests import bearer_auth
from channels.openai_wire import (
    DEFAULT_MODEL,
    DONE,
    NO_RETRY,
    chunk,
    completion,
    error_response,
    models_list,
    parse_chat_request,
    pieces,
    sse,
)
from gateway.kernel.bus import BusClosed, MessageBus
from gateway.kernel.config_channels import OpenAIChannelConfig
from gateway.kernel.events import InboundMessage, OutboundMessage, new_id
from gateway.kernel.values import ChannelHints, Delivery

if TYPE_CHECKING:
    from channels.base import ChannelDeps

_log = logging.getLogger(__name__)

CHANNEL_NAME = "openai"
ANSWER_KINDS = frozenset({"reply", "error", "notice"})


class OpenAIChannelError(Exception):
    """The API cannot listen (address taken, not ours)."""


class TurnFailed(Exception):
    """The turn ended in Parley's error line instead of an answer."""


Deltas = Callable[[InboundMessage, "asyncio.Future[OutboundMessage]"], AsyncIterator[str]]
"""Where a streamed answer's text comes from: given the request's message and the future its
stored reply resolves, the text in order. Raises ``TurnFailed`` for an error reply. The
pieces must concatenate to the stored answer."""


async def whole_reply(msg: InboundMessage,
                      reply: asyncio.Future[OutboundMessage]) -> AsyncIterator[str]:
    """Today's ``Deltas``: the stored answer, once it came, in pieces."""
    answer = await reply
    if answer.kind == "error":
        raise TurnFailed(answer.text)
    for piece in pieces(answer.text):
        yield piece


class OpenAIChannel(ChannelBase):
    name = CHANNEL_NAME
    config_model = OpenAIChannelConfig

    @classmethod
    def from_deps(cls, deps: ChannelDeps) -> OpenAIChannel:
        """The ``parley.channels`` entry point's factory (its section: ``channels.openai``)."""
        return create(deps)

    hints = ChannelHints(markup="Markdown", max_length=None,
                         etiquette="An app or script talking through the OpenAI API; "
                                   "answer as in a normal chat.")

    def __init__(self, config: OpenAIChannelConfig, bus: MessageBus, *,
                 models: list[str], deltas: Deltas = whole_reply) -> None:
        self.config = config
        self._bus = bus
        self._models = [DEFAULT_MODEL, *models]
        self._deltas = deltas
        self._waiting: dict[str, asyncio.Future[OutboundMessage]] = {}
        """The requests waiting, by the inbound message's id."""
        self._turns: dict[str, tuple[asyncio.Lock, int]] = {}
        """One turn at a time per session: its lock, and how many requests hold or wait."""
        self._runner: web.AppRunner | None = None
        self._running = False
        self._answered = 0
        self._queued = 0
        """Requests waiting for the turn before theirs in the same session."""
        self.port: int | None = None
        self.base_url: str | None = None

    # --- the Channel side -----------------------------------------------------------------------

    async def start(self) -> None:
        if self._running:
            return
        middlewares: list[Middleware] = [json_errors(_log, "openai api",
                                                     respond=error_response)]
        if self.config.token is not None:
            middlewares.append(bearer_auth(self.config.token.get_secret_value()))
        app = web.Application(client_max_size=self.config.max_body_bytes,
                              middlewares=middlewares)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._list_models)
        host = self.config.host
        self._runner, self.port = await listen(app, host, self.config.port,
                                               what="channels.openai", error=OpenAIChannelError,
                                               shutdown_timeout=5.0)
        self.base_url = f"http://{f'[{host}]' if ':' in host else host}:{self.port}/v1"
        self._running = True
        _log.info("OpenAI-compatible API listening on %s", self.base_url)

    async def stop(self) -> None:
        self._running = False
        for future in self._waiting.values():
            if not future.done():
                future.cancel()
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    def status(self) -> ChannelStatus:
        return ChannelStatus(running=self._running,
                             detail={"url": self.base_url, "answered": self._answered,
                                     "waiting": len(self._waiting), "queued": self._queued})

    async def send(self, msg: OutboundMessage) -> Delivery:
        """An answer reaches the request waiting for it; anything else (a reply whose client
        went away, a message the agent sent on its own) is in the session all the same."""
        future = self._waiting.get(msg.reply_to or "") if msg.kind in ANSWER_KINDS else None
        if future is not None and not future.done():
            future.set_result(msg)
            self._answered += 1
        else:
            _log.debug("openai api: %s for session %s with no request waiting", msg.kind,
                       msg.chat_id)
        return Delivery(ok=True, message_ids=(msg.idempotency_key,))

    # --- HTTP -----------------------------------------------------------------------------------

    async def _list_models(self, request: web.Request) -> web.Response:
        return web.json_response(models_list(self._models, int(time.time())))

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        req = parse_chat_request(raw, request.headers, models=frozenset(self._models),
                                 max_text_chars=self.config.max_text_chars)
        lock, users = self._turns.get(req.session) or (asyncio.Lock(), 0)
        self._turns[req.session] = (lock, users + 1)
        self._queued += 1
        entered = False
        try:
            async with lock:
                entered, self._queued = True, self._queued - 1
                return await self._turn(request, req.session, req.text, req.model, req.stream)
        finally:
            if not entered:  # the client went away while waiting for the session's turn
                self._queued -= 1
            lock, users = self._turns[req.session]
            if users > 1:
                self._turns[req.session] = (lock, users - 1)
            else:
                del self._turns[req.session]

    async def _turn(self, request: web.Request, session: str, text: str, model: str,
                    stream: bool) -> web.StreamResponse:
        msg = InboundMessage(channel=CHANNEL_NAME, chat_id=session,
                             sender_id=self.config.sender_id, text=text,
                             kind="command" if text.startswith("/") else "user",
                             trust=self.config.trust)
        reply: asyncio.Future[OutboundMessage] = asyncio.get_running_loop().create_future()
        self._waiting[msg.message_id] = reply
        try:
            if not self._running or self._bus.closed:
                raise ApiError("gateway is shutting down", 503)
            try:
                await self._bus.publish_inbound(msg)
            except BusClosed:
                raise ApiError("gateway is shutting down", 503) from None
            completion_id, created = f"chatcmpl-{new_id()}", int(time.time())
            parts = self._deltas(msg, reply)
            try:
                async with asyncio.timeout(self.config.reply_timeout):
                    first = await anext(parts, None)
                    if not stream:
                        text_parts = [first or ""]
                        text_parts += [p async for p in parts]
                        return web.json_response(completion(completion_id, created, model,
                                                            "".join(text_parts)))
                    return await self._stream(request, parts, first, completion_id, created,
                                              model)
            except TimeoutError:
                return error_response(504, f"no answer within {self.config.reply_timeout:g} s; "
                                      "the answer will still be kept in the session")
            except TurnFailed as exc:
                return error_response(502, str(exc))
            except asyncio.CancelledError:
                if not self._running:
                    return error_response(503, "gateway is shutting down")
                raise
        finally:
            self._waiting.pop(msg.message_id, None)

    async def _stream(self, request: web.Request, parts: AsyncIterator[str], first: str | None,
                      completion_id: str, created: int, model: str) -> web.StreamResponse:
        """The answer as ``chat.completion.chunk`` events: the role, the text, the stop, and
        ``[DONE]``. Headers go out with the first text, so a turn that fails before it still
        gets a plain error answer."""
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                               "Cache-Control": "no-cache", **NO_RETRY})
        await response.prepare(request)

        def event(delta: dict[str, str], finish: str | None = None) -> bytes:
            return sse(chunk(completion_id, created, model, delta, finish))

        await response.write(event({"role": "assistant", "content": ""}))
        if first:
            await response.write(event({"content": first}))
        try:
            async for piece in parts:
                await response.write(event({"content": piece}))
        except TurnFailed as exc:  # a live source that fails midway: said in the stream
            await response.write(event({"content": f"\n\n{exc}"}))
        await response.write(event({}, "stop"))
        await response.write(DONE)
        await response.write_eof()
        return response


def create(deps: ChannelDeps) -> OpenAIChannel:
    """The gateway's factory for ``channels.openai``."""
    return OpenAIChannel(deps.config.channels.openai, deps.bus,
                         models=sorted(deps.config.agent.models.aliases))
