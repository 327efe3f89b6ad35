"""Live checks ``parley onboard`` and ``parley doctor`` share: one model call, a Telegram bot
token (``getMe``), a Discord bot token (``users/@me``), each against the configured server.

Each answers a ``Probe``: whether it worked, and a line saying what was found or what to do.
A token never appears in what they say (Telegram puts it in the URL, so a connection error's
text is not passed on as it is).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp

from gateway.kernel.config import AgentConfig
from gateway.kernel.frozen import frozen

TIMEOUT = 15.0


@frozen
class Probe:
    ok: bool
    detail: str
    latency_ms: float | None = None


async def probe_model(agent: AgentConfig) -> Probe:
    """One short completion through the same provider code the gateway uses."""
    from agent.errors import ProviderError
    from agent.provider import Provider

    quick = agent.model_copy(update={"max_retries": 0, "fallbacks": []})
    provider = Provider(quick)
    started = time.perf_counter()
    try:
        answer = await asyncio.wait_for(provider.complete(
            [{"role": "user", "content": "Reply with the single word OK."}], max_tokens=16),
            agent.timeout)
    except ProviderError as exc:
        return Probe(False, f"{agent.model}: {exc}")
    except TimeoutError:
        return Probe(False, f"{agent.model}: no answer within {agent.timeout:g}s; is the "
                            "server running and reachable (agent.api_base)?")
    finally:
        await provider.aclose()
    latency = (time.perf_counter() - started) * 1000
    said = (answer.content or "").strip().replace("\n", " ")[:40]
    return Probe(True, f"{agent.model} answered {said!r} in {latency:.0f} ms", latency)


async def _get_json(url: str, headers: dict[str, str], what: str) -> tuple[int, Any] | Probe:
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TIMEOUT)) as http, \
                http.get(url, headers=headers) as resp:
            try:
                body = await resp.json(content_type=None)
            except ValueError:
                body = None
            return resp.status, body
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        return Probe(False, f"cannot reach {what} ({type(exc).__name__}); check the network "
                            "and the configured URL")


async def probe_telegram(base_url: str, token: str) -> Probe:
    """``getMe`` at ``base_url`` (``https://api.telegram.org/bot`` or a self-hosted server)."""
    answer = await _get_json(f"{base_url}{token}/getMe", {}, base_url)
    if isinstance(answer, Probe):
        return answer
    status, body = answer
    if isinstance(body, dict) and body.get("ok") and isinstance(body.get("result"), dict):
        bot = body["result"]
        return Probe(True, f"token accepted: @{bot.get('username')} (id {bot.get('id')})")
    if status in (401, 404):
        return Probe(False, "Telegram refused the token (Unauthorized); copy it again from "
                            "@BotFather (/token)")
    return Probe(False, f"getMe answered HTTP {status}; try again later")


async def probe_discord(api_base: str, token: str) -> Probe:
    """``GET users/@me`` at ``api_base`` with the bot token."""
    answer = await _get_json(f"{api_base.rstrip('/')}/users/@me",
                             {"Authorization": f"Bot {token}",
                              "User-Agent": "DiscordBot (parley, 1)"}, api_base)
    if isinstance(answer, Probe):
        return answer
    status, body = answer
    if status == 200 and isinstance(body, dict) and body.get("id"):
        return Probe(True, f"token accepted: {body.get('username')} (id {body.get('id')})")
    if status == 401:
        return Probe(False, "Discord refused the token (401); reset it in the developer "
                            "portal (Bot → Reset Token) and copy it again")
    return Probe(False, f"users/@me answered HTTP {status}; try again later")
