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

Streaming is live (``openai_live``): the turn's text goes out as the model writes it, and
the stored reply has the last word (the rule is in ``openai_live``'s docstring).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from aiohttp import web
from aiohttp.typedefs import Middleware

from channels.base import ChannelBase, ChannelStatus
from channels.http_api import ApiError, json_errors, listen
from channels.local_requests import bearer_auth
from channels.openai_live import LiveAnswer, TurnFailed
from channels.openai_wire import (
    DEFAULT_MODEL,
    DONE,
    NO_RETRY,
    chunk,
    completion,
    error_body,
    error_response,
    models_list,
    parse_chat_request,
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
                 models: list[str]) -> None:
        self.config = config
        self._bus = bus
        self._models = [DEFAULT_MODEL, *models]
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
        live = LiveAnswer(self._bus, msg) if stream else None
        try:
            if not self._running or self._bus.closed:
                raise ApiError("gateway is shutting down", 503)
            try:
                await self._bus.publish_inbound(msg)
            except BusClosed:
                raise ApiError("gateway is shutting down", 503) from None
            completion_id, created = f"chatcmpl-{new_id()}", int(time.time())
            sse_out: list[web.StreamResponse] = []
            """The event stream, once its headers went out (errors are events from then on)."""
            try:
                async with asyncio.timeout(self.config.reply_timeout):
                    if live is None:
                        answer = await reply
                        if answer.kind == "error":
                            raise TurnFailed(answer.text)
                        return web.json_response(completion(completion_id, created, model,
                                                            answer.text))
                    return await self._stream(request, live.pieces(reply), sse_out,
                                              completion_id, created, model)
            except TimeoutError:
                why, status = (f"no answer within {self.config.reply_timeout:g} s; the answer "
                               "will still be kept in the session"), 504
            except TurnFailed as exc:
                why, status = str(exc), 502
            except asyncio.CancelledError:
                if self._running:
                    raise
                why, status = "gateway is shutting down", 503
            if sse_out:
                return await _end_with_error(sse_out[0], status, why)
            return error_response(status, why)
        finally:
            self._waiting.pop(msg.message_id, None)
            if live is not None:
                live.close()

    async def _stream(self, request: web.Request, parts: AsyncIterator[str],
                      out: list[web.StreamResponse], completion_id: str, created: int,
                      model: str) -> web.StreamResponse:
        """The answer as ``chat.completion.chunk`` events: the role, the text as it comes, the
        stop, and ``[DONE]``. Headers go out with the first text, so a turn that fails before
        it still gets a plain error answer; ``out`` holds the response once they did."""
        first = await anext(parts, None)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                               "Cache-Control": "no-cache", **NO_RETRY})
        await response.prepare(request)
        out.append(response)

        def event(delta: dict[str, str], finish: str | None = None) -> bytes:
            return sse(chunk(completion_id, created, model, delta, finish))

        await response.write(event({"role": "assistant", "content": ""}))
        if first:
            await response.write(event({"content": first}))
        async for piece in parts:
            await response.write(event({"content": piece}))
        await response.write(event({}, "stop"))
        await response.write(DONE)
        await response.write_eof()
        return response


async def _end_with_error(response: web.StreamResponse, status: int,
                          why: str) -> web.StreamResponse:
    """A stream whose headers went out ends with an ``error`` event (the official client
    raises it as an ``APIError``) and ``[DONE]``."""
    try:
        await response.write(sse(error_body(status, why)))
        await response.write(DONE)
        await response.write_eof()
    except (ConnectionError, RuntimeError):
        pass  # the client went away meanwhile
    return response


def create(deps: ChannelDeps) -> OpenAIChannel:
    """The gateway's factory for ``channels.openai``."""
    return OpenAIChannel(deps.config.channels.openai, deps.bus,
                         models=sorted(deps.config.agent.models.aliases))
