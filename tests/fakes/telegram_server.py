"""A fake Telegram Bot API server on loopback that python-telegram-bot really talks to.

Why: mocking PTB would test our mocks; this server speaks the Bot API's wire format instead
(``POST {base_url}{token}/{method}`` with form or multipart bodies, ``{"ok": ..., "result"}``
answers, Telegram's error wording), so the real library runs end to end: its request building,
JSON parsing and error mapping (``BadRequest``, ``RetryAfter``, ``Forbidden``, ...).

    async with FakeTelegram() as tg:
        config = {"token": tg.token, "base_url": tg.base_url, "base_file_url": tg.base_file_url}
        ada = tg.user(1001, "Ada", username="ada")
        tg.dm(ada, "hello")                       # queued for getUpdates
        [reply] = await tg.wait_sent(ada["id"])    # what the bot sent to that chat

Implemented: getMe, getUpdates (long poll, offsets confirm, a newer call ends an older one
with 409 as Telegram does), setWebhook/deleteWebhook/getWebhookInfo (with delivery of queued
updates to the webhook URL), sendMessage and editMessageText (empty text, over 4096 UTF-16
units after entity parsing, and HTML Telegram cannot parse are refused with its wording),
sendChatAction, sendPhoto/sendDocument (multipart uploads, file ids or URLs), getFile and file
downloads, setMyCommands/getMyCommands. ``fail_next()`` injects 429 with ``retry_after``, 5xx
or a dropped connection; ``stall_updates`` makes getUpdates hang like a dead connection;
``malform_next()`` does a call's work but answers ``ok`` without a required field (a server
that differs from Telegram's); ``set_gone(True)`` takes the whole API away until
``set_gone(False)``, counting the calls that found it gone.

The fake is put together from ``telegram_state`` (chats, updates, files, what the bot sent,
the waits), ``telegram_methods`` (the Bot API) and ``telegram_html`` (the HTML parse mode);
this module holds ``FakeTelegram`` itself: the server's lifecycle and addresses.
"""

from __future__ import annotations

import asyncio
from types import TracebackType
from typing import Self

from aiohttp import web

from tests.fakes.telegram_html import HtmlError, parse_html
from tests.fakes.telegram_methods import ApiError, TelegramMethods
from tests.fakes.telegram_state import TOKEN, Sent

__all__ = ["ApiError", "FakeTelegram", "HtmlError", "Sent", "TOKEN", "parse_html"]


class FakeTelegram(TelegramMethods):
    """The Bot API and file downloads on one loopback port; ``async with`` starts and stops it."""

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> Self:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/bot{token}/{method}", self._api)
        app.router.add_get("/file/bot{token}/{path:.+}", self._download)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False,
                                     shutdown_timeout=0.5)
        await self._runner.setup()
        await web.TCPSite(self._runner, self._host, 0).start()
        self._port = int(self._runner.addresses[0][1])
        return self

    async def set_stall(self, stalled: bool) -> None:
        """Make getUpdates hang (True) like a dead connection, or answer again (False)."""
        async with self._changed:
            self.stall_updates = stalled
            self._changed.notify_all()

    async def stop(self) -> None:
        if self._webhook_task is not None:
            self._webhook_task.cancel()
            await asyncio.gather(self._webhook_task, return_exceptions=True)
            self._webhook_task = None
        runner, self._runner = self._runner, None
        if runner is not None:
            async with self._changed:
                self._poll_generation += 1  # wake every long poll
                self.stall_updates = False
                self._changed.notify_all()
            await runner.cleanup()

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.stop()
