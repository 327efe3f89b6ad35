"""One POST to an operator-configured OpenAI-compatible audio endpoint (transcription, speech):
its key as a bearer token, a total timeout, and failures in words with no secret in them."""

from __future__ import annotations

from typing import Any

import aiohttp

from gateway.kernel.secrets import SECRETS


class EndpointFailed(Exception):
    """The server could not be reached or did not answer in time (words for the chat)."""


async def post(api_base: str, path: str, *, api_key: str | None, within: float, what: str,
               **body: Any) -> tuple[int, bytes]:
    """(status, body) of ``POST {api_base}{path}``, answered ``within`` seconds; ``body``:
    aiohttp's ``data=`` or ``json=``."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    url = api_base.rstrip("/") + path
    try:
        async with aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=within)) as session, \
                session.post(url, headers=headers, **body) as resp:
            return resp.status, await resp.read()
    except TimeoutError:
        raise EndpointFailed(f"no answer within {within:g} s") from None
    except aiohttp.ClientError as exc:
        raise EndpointFailed(f"the {what} server could not be reached "
                             f"({short(str(exc))})") from None


def short(text: str, limit: int = 200) -> str:
    """One line, at most ``limit`` characters, secrets masked."""
    text = SECRETS.redact(" ".join(text.split()))
    return text if len(text) <= limit else text[:limit - 1] + "…"
