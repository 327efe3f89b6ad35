"""A fake Discord (REST API v10 and gateway websocket) on loopback that discord.py really uses.

Why: mocking discord.py would test our mocks; this server speaks Discord's wire format instead,
so the real library runs end to end: login, the gateway handshake (HELLO, IDENTIFY, READY,
GUILD_CREATE), heartbeats, RESUME after a dropped connection, its REST client, its rate
limiter and its error mapping (``Forbidden``, ``NotFound``, ``HTTPException``).

    async with FakeDiscord() as dc:
        config = {"token": dc.token, "api_base": dc.api_base}
        ada = dc.user(1001, "ada", global_name="Ada")
        dm = dc.dm_channel(ada)
        dc.post(dm, ada, "hello")                     # MESSAGE_CREATE on the gateway
        [reply] = await dc.wait_sent(dm["id"])         # what the bot sent to that channel

Gateway: ``GET /gateway`` names ``ws://.../gateway``; the socket sends HELLO, acknowledges
heartbeats (unless ``ack_heartbeats`` is False), answers IDENTIFY with READY and a
GUILD_CREATE per guild (closing with 4004 for a wrong token and 4014 for a privileged intent
the application may not use, per ``privileged_intents``), and RESUME with the events missed
since the client's sequence, then RESUMED (an unknown session gets INVALID_SESSION).
``compress=zlib-stream`` in the connect URL gets one zlib stream with a sync flush per
message, as Discord sends it; otherwise JSON text frames. ``drop_gateway()`` cuts the
connection; events dispatched meanwhile wait for the client's RESUME.

REST: the bot user and application, channels, message create/edit with Discord's validation
(empty → 50006, over 2000 characters → 50035, files over 25 MiB → 40005; ``nonce`` with
``enforce_nonce`` returns the message already created), message history, typing, and
attachment downloads. Every answer is ``Content-Type: application/json`` exactly, as discord.py
expects; ``fail_next()`` answers 429 with ``retry_after`` (and the ``Via`` header that tells
discord.py it is Discord's limit, not a Cloudflare ban), a 5xx, or drops the connection,
before or after the message was created.

The fake is put together from ``discord_state`` (the world, the session's event log, the
waits), ``discord_gateway`` (the websocket) and ``discord_rest`` (the REST routes); this module
holds ``FakeDiscord`` itself: the server's lifecycle and addresses.
"""

from __future__ import annotations

import asyncio
from types import TracebackType
from typing import Self

from aiohttp import web

from tests.fakes.discord_gateway import DiscordGateway
from tests.fakes.discord_rest import ApiError, DiscordRest
from tests.fakes.discord_state import BOT_ID, TOKEN, Sent

__all__ = ["BOT_ID", "ApiError", "FakeDiscord", "Sent", "TOKEN"]


class FakeDiscord(DiscordGateway, DiscordRest):
    """Discord's REST API and gateway on one loopback port; ``async with`` starts and stops it."""

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> Self:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_get("/gateway", self._gateway)
        app.router.add_route("*", "/api/v10/{path:.*}", self._api)
        app.router.add_get("/attachments/{id}/{name}", self._download)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False,
                                     shutdown_timeout=0.5)
        await self._runner.setup()
        await web.TCPSite(self._runner, self._host, 0).start()
        self._port = int(self._runner.addresses[0][1])
        return self

    async def stop(self) -> None:
        for conn in self._connections:
            conn.put(None)
            if not conn.ws.closed:
                await conn.ws.close(code=1001)
        self._conn = None
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.stop()
