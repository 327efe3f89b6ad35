"""What the HTTP channels share: a refused request as an exception (``ApiError``), the check
that refuses text no Unicode encoding can carry (a lone surrogate), naming the field; and, for
those aiohttp serves (WebChat, the OpenAI-compatible API, Telegram's webhook), ``listen`` and
the middleware that turns every failure into a JSON ``{"error": ...}`` answer — never an HTML
page, never a traceback, a client that went away only a debug line. The local channel has its
own server (``http_serve``) and answers its errors itself, alike; it reads a query string with
``parse_query``."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import parse_qsl

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware


class ApiError(Exception):
    """A refused HTTP request; a validation ``message`` starts with the field at fault."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


_SURROGATE = re.compile("[\ud800-\udfff]")


def check_unicode(data: Any, where: str = "") -> None:
    """ApiError (400) naming the first field whose text holds a lone surrogate (``"\\ud800"``
    is valid JSON but no Unicode text: it cannot be stored, logged or sent on)."""
    if isinstance(data, str):
        if _SURROGATE.search(data):
            raise ApiError(f"{where or 'body'}: contains a lone surrogate (not valid Unicode "
                           "text)")
    elif isinstance(data, dict):
        for key, value in data.items():
            if _SURROGATE.search(key):
                raise ApiError(f"{where or 'body'}: a key contains a lone surrogate (not valid "
                               "Unicode text)")
            check_unicode(value, f"{where}.{key}" if where else key)
    elif isinstance(data, list):
        for i, item in enumerate(data):
            check_unicode(item, f"{where}[{i}]")


async def read_body(request: web.Request, within: float, key: str) -> bytes:
    """The request body, or 408 when it has not arrived in full ``within`` seconds (``key``
    names the setting): a stalled or trickling client holds no connection for long."""
    if request.content.is_eof():  # all of it came with the headers (a small body): no timer
        return await request.read()
    try:
        async with asyncio.timeout(within):
            return await request.read()
    except TimeoutError:
        raise ApiError(f"body: not received in full within {within:g} s ({key})",
                       408) from None


def json_error(status: int, message: str,
               headers: Mapping[str, str] | None = None) -> web.Response:
    if status == 401:
        headers = {**(headers or {}), "WWW-Authenticate": "Bearer"}
    return web.json_response({"error": message}, status=status, headers=headers)


def json_errors(log: logging.Logger, what: str,
                as_400: tuple[type[Exception], ...] = (),
                respond: Callable[[int, str, Mapping[str, str] | None], web.Response]
                = json_error) -> Middleware:
    """The middleware: ``ApiError`` with its status, ``as_400`` exceptions (with a
    ``message``) as 400, aiohttp's own HTTP errors with their reason (and ``Allow``), anything
    else logged and answered 500; ``respond`` shapes the answer (OpenAI's error object for
    ``channels/openai_api.py``)."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except ApiError as exc:
            return respond(exc.status, exc.message, None)
        except as_400 as exc:
            return respond(400, str(getattr(exc, "message", exc)), None)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            allow = {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else None
            return respond(exc.status, exc.reason.lower(), allow)
        except ConnectionResetError:  # the client went away: nothing to answer, nothing wrong
            log.debug("%s: the client of %s %s disconnected", what, request.method,
                      request.path)
            return json_error(400, "client disconnected")  # written nowhere; aiohttp drops it
        except Exception:
            log.exception("%s: %s %s failed", what, request.method, request.path)
            return respond(500, "internal error", None)

    return middleware


async def listen(app: web.Application, host: str, port: int, *, what: str,
                 error: type[Exception], **runner_options: Any) -> tuple[web.AppRunner, int]:
    """Serve ``app`` on ``host:port``; a port that is taken (or a host that is not ours)
    raises ``error`` naming ``what`` and the address, with nothing left half-open. Returns
    the runner and the port really bound (``port`` 0 picks a free one)."""
    runner = web.AppRunner(app, **runner_options)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
    except OSError as exc:
        await runner.cleanup()
        raise error(f"{what}: cannot listen on {host}:{port}: {exc}") from exc
    return runner, int(runner.addresses[0][1])


def parse_query(query: str) -> dict[str, str]:
    """A query string's fields, the first of a repeated name kept: ``parse_qsl``'s reading
    (blank values kept, ``%``-escapes as UTF-8, strictly), without its per-field Python work
    for the usual query that has nothing to unescape (``?after=12&wait=30``)."""
    if "%" in query or "+" in query:
        return dict(reversed(parse_qsl(query, keep_blank_values=True, errors="strict")))
    fields: dict[str, str] = {}
    for name, _, value in (part.partition("=") for part in query.split("&") if part):
        fields.setdefault(name, value)
    return fields
