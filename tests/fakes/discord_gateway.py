"""The fake Discord's gateway websocket: HELLO, heartbeats and their acks, IDENTIFY
(READY and a GUILD_CREATE per guild, or close 4004/4014), RESUME with the missed events, and
the ways tests cut it (``drop_gateway``, ``invalidate_session``).

Separate from the REST routes (``discord_rest``): the two halves share only
``DiscordState``.
"""

from __future__ import annotations

import asyncio
import json
import zlib

from aiohttp import WSMsgType, web

from tests.fakes.discord_state import APP_ID, JSON, PRIVILEGED_INTENTS, Connection, DiscordState


class DiscordGateway(DiscordState):
    """The ``/gateway`` websocket handler and what it says."""

    async def drop_gateway(self, code: int | None = None) -> None:
        """Cut the live connection: no close frame (a network failure), or close with ``code``
        (4000 unknown error, 4014 disallowed intents, ...). The session survives for RESUME."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        conn.put(None)
        if code is None:
            transport = conn.request.transport
            if transport is not None:
                transport.abort()
        else:
            await conn.ws.close(code=code)
        await self._notify()

    async def invalidate_session(self) -> None:
        """Forget the session and cut the connection: the client's RESUME is refused
        (INVALID_SESSION) and it must IDENTIFY again; what happened meanwhile is not replayed."""
        self._session_id = None
        self._events.clear()
        await self.drop_gateway()

    async def _gateway(self, request: web.Request) -> web.StreamResponse:
        if not self.gateway_open:
            self.gateway_urls.append(str(request.rel_url))
            return web.Response(status=503, text="Service Unavailable")
        ws = web.WebSocketResponse(max_msg_size=0)
        await ws.prepare(request)
        self.gateway_urls.append(str(request.rel_url))
        compress = request.query.get("compress")
        conn = Connection(ws, request, zlib.compressobj() if compress == "zlib-stream"
                           else None)
        self._connections.append(conn)
        writer = asyncio.create_task(self._write(conn), name="fake-discord-writer")
        self._tasks.add(writer)
        writer.add_done_callback(self._tasks.discard)
        conn.put({"op": 10, "d": {"heartbeat_interval": int(self.heartbeat_interval * 1000)},
                  "s": None, "t": None})
        try:
            async for frame in ws:
                if frame.type is not WSMsgType.TEXT:
                    continue
                await self._on_frame(conn, json.loads(frame.data))
        finally:
            self.sessions.discard(conn)
            if self._conn is conn:
                self._conn = None
            conn.put(None)
            await self._notify()
        return ws

    async def _write(self, conn: Connection) -> None:
        while True:
            payload = await conn.outbox.get()
            if payload is None or conn.ws.closed:
                return
            data = conn.encode(payload)
            try:
                if isinstance(data, bytes):
                    await conn.ws.send_bytes(data)
                else:
                    await conn.ws.send_str(data)
            except (ConnectionError, RuntimeError):
                return

    async def _on_frame(self, conn: Connection, frame: JSON) -> None:
        op, data = frame.get("op"), frame.get("d")
        if op == 1:
            self.heartbeats += 1
            if self.ack_heartbeats:
                conn.put({"op": 11, "d": None, "s": None, "t": None})
        elif op == 2:
            await self._identify(conn, data or {})
        elif op == 6:
            await self._resume(conn, data or {})
        await self._notify()

    async def _identify(self, conn: Connection, data: JSON) -> None:
        self.identifies.append(data)
        self.deaf = False  # deafness is the old connection's
        if data.get("token") != self.token:
            await conn.ws.close(code=4004, message=b"Authentication failed.")
            return
        intents = int(data.get("intents") or 0)
        if intents & PRIVILEGED_INTENTS and not self.privileged_intents:
            await conn.ws.close(code=4014, message=b"Disallowed intent(s).")
            return
        self._session_id = f"session-{next(self._ids)}"
        self._seq = 0
        self._events.clear()
        self._conn = conn
        self._opened(conn)
        self.dispatch("READY", {
            "v": 10, "user": self.bot, "session_id": self._session_id,
            "resume_gateway_url": self.gateway_url, "private_channels": [],
            "guilds": [{"id": g["id"], "unavailable": True} for g in self.guilds.values()],
            "application": {"id": str(APP_ID), "flags": 0}})
        for guild in self.guilds.values():
            self.dispatch("GUILD_CREATE", guild)

    def _opened(self, conn: Connection) -> None:
        self.sessions.add(conn)
        self.most_sessions = max(self.most_sessions, len(self.sessions))

    async def _resume(self, conn: Connection, data: JSON) -> None:
        self.resumes.append(data)
        self.deaf = False  # deafness is the old connection's
        if data.get("token") != self.token:
            await conn.ws.close(code=4004, message=b"Authentication failed.")
            return
        if data.get("session_id") != self._session_id or self._session_id is None:
            conn.put({"op": 9, "d": False, "s": None, "t": None})
            return
        after = int(data.get("seq") or 0)
        self._conn = conn
        self._opened(conn)
        for seq, payload in self._events:
            if seq > after:
                self.replayed += 1
                conn.put(payload)
        self.dispatch("RESUMED", {})
