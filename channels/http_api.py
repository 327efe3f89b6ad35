"""What the two HTTP channels (local, WebChat) share: a refused request as an exception, and
the middleware that turns every failure into a JSON ``{"error": ...}`` answer — never an HTML
page, never a traceback."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware


class ApiError(Exception):
    """A refused HTTP request; a validation ``message`` starts with the field at fault."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


def json_error(status: int, message: str,
               headers: Mapping[str, str] | None = None) -> web.Response:
    if status == 401:
        headers = {**(headers or {}), "WWW-Authenticate": "Bearer"}
    return web.json_response({"error": message}, status=status, headers=headers)


def json_errors(log: logging.Logger, what: str,
                as_400: tuple[type[Exception], ...] = ()) -> Middleware:
    """The middleware: ``ApiError`` with its status, ``as_400`` exceptions (with a
    ``message``) as 400, aiohttp's own HTTP errors with their reason (and ``Allow``), anything
    else logged and answered 500."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except ApiError as exc:
            return json_error(exc.status, exc.message)
        except as_400 as exc:
            return json_error(400, str(getattr(exc, "message", exc)))
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            allow = {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else None
            return json_error(exc.status, exc.reason.lower(), allow)
        except Exception:
            log.exception("%s: %s %s failed", what, request.method, request.path)
            return json_error(500, "internal error")

    return middleware
