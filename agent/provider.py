"""The one module that talks to litellm (imported lazily: it costs ~2 s and ~160 MB).

``Provider.complete`` retries 429s, 5xx answers, timeouts and connection errors with jittered
exponential backoff, then tries ``agent.fallbacks`` in order. Every call's tokens in and out
are returned so the turn can record them.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import json
import logging
import os
import re
import time
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from agent.deltas import TextDeltas
from agent.errors import (
    ProviderAuthError,
    ProviderBadRequest,
    ProviderContextTooLarge,
    ProviderError,
    ProviderNotConfigured,
    ProviderUnavailable,
)
from agent.llm_types import EncodedSpan, LLMResponse, ToolCall, collect_stream, from_response
from agent.model_health import ModelHealth, counted
from agent.openai_http import OpenAIHTTP
from gateway.kernel.backoff import BackoffPolicy
from gateway.kernel.config import AgentConfig
from gateway.kernel.frozen import frozen

__all__ = ["LLMResponse", "Provider", "ToolCall", "bundled_model_info", "context_window",
           "warm_up"]

_log = logging.getLogger(__name__)

_litellm: ModuleType | None = None
_MODEL_MAP = "model_prices_and_context_window_backup.json"
MAX_RETRY_AFTER = 60.0
_WARM_MODULES = (
    # What litellm imports lazily on its first chat call with tools (~0.9 s): loaded ahead in
    # a thread so the first message does not wait for it. A name missing in another litellm
    # version only loses the head start.
    "openai.types.chat", "openai.resources.chat", "litellm.llms.openai.openai",
    "litellm.responses.mcp.chat_completions_handler", "litellm.proxy._types",
    "litellm.llms.litellm_proxy.chat.transformation", "litellm._service_logger",
    "litellm.llms.openai.chat.gpt_audio_transformation", "litellm.llms.openai_like.dynamic_config",
)


def _lib() -> ModuleType:
    """Import litellm on first use, offline-safe."""
    global _litellm
    if _litellm is None:
        os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        import litellm

        litellm.suppress_debug_info = True
        litellm.drop_params = True
        logging.getLogger("LiteLLM").setLevel(logging.WARNING)
        _litellm = litellm
    return _litellm


litellm_module = _lib
"""litellm, imported on first use (``agent/media`` transcribes through it)."""


def warm_up() -> None:
    """Import litellm and what its first call needs; blocking, so run it in a thread."""
    _lib()
    for name in _WARM_MODULES:
        try:
            importlib.import_module(name)
        except ImportError:
            _log.debug("warm-up: %s not found in this litellm", name)


def bundled_model_info(model: str) -> dict[str, Any] | None:
    """``model``'s entry in the model map litellm ships (window, prices), read as the JSON
    file (~20 ms, dropped after the lookup) so that asking never imports litellm."""
    bare = model.split("/", 1)[1] if "/" in model else model
    try:
        spec = importlib.util.find_spec("litellm")
        path = Path(spec.origin).parent / _MODEL_MAP if spec and spec.origin else None
        table = json.loads(path.read_text()) if path and path.is_file() else {}
    except (OSError, ValueError):
        table = {}
    info = table.get(model) or table.get(bare)
    return info if isinstance(info, dict) else None


def context_window(model: str, *, ask_litellm: bool = True) -> int | None:
    """The model's input window from litellm's bundled model map, if it knows the model.

    The map is read as the JSON file (``bundled_model_info``), so a gateway whose models
    need no litellm never imports it (~2 s, ~160 MB); with ``ask_litellm`` a name the file
    lacks is asked of litellm itself (it knows aliases)."""
    info = bundled_model_info(model)
    if info is None:
        if not ask_litellm:
            return None
        try:
            info = _lib().get_model_info(model)
        except Exception:
            return None
    value = info.get("max_input_tokens") or info.get("max_tokens")
    return int(value) if value else None


@frozen
class Target:
    """One model to try and where it lives: the main model, then each fallback."""

    model: str
    api_base: str | None
    api_key: str | None
    http: OpenAIHTTP | None
    """Set when the model is posted by ``agent/openai_http.py`` rather than litellm."""


class Provider:
    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        self.health = ModelHealth(config.degraded_after_failures)  # what /v1/health says
        pools: dict[tuple[str, str | None], OpenAIHTTP] = {}  # one per server and key
        self.targets = self._chain(config.model, config.api_base, config.api_key,
                                   config.fallbacks, pools)
        self.chains: dict[str | None, list[Target]] = {None: self.targets}
        """Alias (``agent.models.aliases``) → its model and its fallbacks; None: the
        default."""
        for name, alias in config.models.aliases.items():
            self.chains[name] = self._chain(alias.model, alias.api_base, alias.api_key,
                                            alias.fallbacks, pools)

    def _chain(self, model: str, api_base: str | None, api_key: str | None,
               fallbacks: Sequence[str | Any],
               pools: dict[tuple[str, str | None], OpenAIHTTP]) -> list[Target]:
        """A model, then its fallbacks: a plain name shares the model's server and key."""
        chain = [self._target(model, api_base, api_key, pools)]
        for fallback in fallbacks:
            if isinstance(fallback, str):
                chain.append(self._target(fallback, api_base, api_key, pools))
            else:
                chain.append(self._target(fallback.model, fallback.api_base,
                                          fallback.api_key, pools))
        return chain

    @property
    def all_targets(self) -> list[Target]:
        return [t for chain in self.chains.values() for t in chain]

    def _target(self, model: str, api_base: str | None, api_key: str | None,
                pools: dict[tuple[str, str | None], OpenAIHTTP]) -> Target:
        http = None
        if api_base and model.startswith("openai/") and self.config.transport == "auto":
            http = pools.get((api_base, api_key))
            if http is None:
                http = pools[(api_base, api_key)] = OpenAIHTTP(api_base, api_key,
                                                               self.config.timeout)
        return Target(model, api_base, api_key, http)

    def direct(self, model: str) -> bool:
        """Whether ``model`` is posted by ``agent/openai_http.py`` rather than litellm."""
        return any(t.http is not None for t in self.all_targets if t.model == model)

    @property
    def needs_litellm(self) -> bool:
        return any(t.http is None for t in self.all_targets)

    async def aclose(self) -> None:
        """Close the direct client's pool, stop litellm's background logging task and close
        its cached HTTP clients."""
        for http in {id(t.http): t.http for t in self.all_targets if t.http}.values():
            await http.aclose()
        if _litellm is None:
            return
        from litellm.litellm_core_utils.logging_worker import GLOBAL_LOGGING_WORKER
        from litellm.llms.custom_httpx.async_client_cleanup import close_litellm_async_clients

        worker = GLOBAL_LOGGING_WORKER
        task = getattr(worker, "_worker_task", None)
        if task is not None and task.get_loop() is not asyncio.get_running_loop():
            # Started in an event loop that is gone (an earlier gateway in this process):
            # there is nothing left to stop, and stopping would touch the dead loop.
            worker._worker_task = None
            worker._running_tasks.clear()
        else:
            await worker.stop()
        await close_litellm_async_clients()
        cache = getattr(_litellm, "in_memory_llm_clients_cache", None)
        if cache is not None and hasattr(cache, "flush_cache"):
            cache.flush_cache()

    def _key_problem(self, target: Target) -> str | None:
        """Why ``target`` cannot be called as configured, or None if it can."""
        if target.api_key or target.api_base:
            return None
        model = target.model
        try:
            missing = _lib().validate_environment(model).get("missing_keys") or []
        except Exception:  # an unknown provider prefix: let the call itself say so
            return None
        if not missing:
            return None
        names = " or ".join(missing)
        return (f"The model {model} needs an API key: set agent.api_key in your config "
                f"(for example api_key: ${{{missing[0]}}}) or export {names} before starting, "
                "or set agent.api_base to an OpenAI-compatible server such as Ollama, vLLM or "
                "LM Studio (model: openai/<name>)." + self._unset_hint())

    def _unset_hint(self) -> str:
        """When the config reads the model's settings from variables this environment lacks
        (``make run`` given them in another shell), which ones."""
        unset = [f"agent.{key} from ${name}"
                 for key, name in self.config._defaulted.items()
                 if key in ("model", "api_key", "api_base")]
        if not unset:
            return ""
        return (f" This config reads {', '.join(unset)}, not set here: export them in this "
                "shell, or write them into secrets.env beside the config.")

    def configuration_problem(self, alias: str | None = None) -> str | None:
        """A message saying exactly what to configure, when no model of ``alias``'s chain
        (None: the default's) can be called."""
        chain = self.chains.get(alias, self.targets)
        problems = [p for t in chain if (p := self._key_problem(t))]
        return problems[0] if len(problems) == len(chain) else None

    @counted
    async def complete(self, messages: list[dict[str, Any]],
                       tools: list[dict[str, Any]] | None = None, *,
                       max_tokens: int | None = None, alias: str | None = None,
                       deltas: TextDeltas | None = None,
                       encoded: EncodedSpan | None = None) -> LLMResponse:
        """``max_tokens`` overrides ``agent.max_tokens`` for this call (summaries);
        ``alias`` picks a model of ``agent.models.aliases`` and its fallbacks; ``deltas``
        gets the answer's text as it is written (the call is streamed then, whatever
        ``agent.stream`` says); ``encoded``: messages already written as JSON, for the
        direct route's body."""
        chain = self.chains.get(alias, self.targets)
        problem = self.configuration_problem(alias)
        if problem:
            raise ProviderNotConfigured(problem, model=chain[0].model)
        last: ProviderError | None = None
        for target in chain:
            if self._key_problem(target):
                continue
            try:
                return await self._complete_with_retries(target, messages, tools, max_tokens,
                                                         deltas, encoded)
            except (ProviderUnavailable, ProviderAuthError) as exc:
                _log.warning("model %s failed after %d attempt(s): %s", target.model,
                             exc.attempts, exc)
                last = exc
        assert last is not None
        raise last

    async def _complete_with_retries(self, target: Target, messages: list[dict[str, Any]],
                                     tools: list[dict[str, Any]] | None,
                                     max_tokens: int | None = None,
                                     deltas: TextDeltas | None = None,
                                     encoded: EncodedSpan | None = None) -> LLMResponse:
        attempts = self.config.max_retries + 1
        model = target.model
        for attempt in range(1, attempts + 1):
            if deltas is not None:
                deltas.restart()  # a retry (or the next model) writes the text again
            try:
                response = await self._call(target, messages, tools, max_tokens, deltas,
                                            encoded)
            except ProviderUnavailable as exc:
                exc.attempts = attempt
                if attempt == attempts:
                    raise
                delay = self._backoff(attempt, exc.retry_after)
                _log.info("model %s: %s; retry %d/%d in %.2fs", model, exc, attempt,
                          attempts - 1, delay)
                await asyncio.sleep(delay)
            else:
                return LLMResponse(**{**_fields(response), "attempts": attempt,
                                      "target": model})
        raise AssertionError("unreachable")

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        return BackoffPolicy(self.config.retry_backoff, 30.0, jitter=0.5,
                             max_told=MAX_RETRY_AFTER).delay(attempt, retry_after)

    def _body(self, model: str, messages: list[dict[str, Any]],
              tools: list[dict[str, Any]] | None, max_tokens: int | None,
              stream: bool = False) -> dict[str, Any]:
        """The chat-completions request both routes send."""
        body: dict[str, Any] = {"model": model, "messages": messages,
                                "max_tokens": max_tokens or self.config.max_tokens}
        if tools:
            body["tools"] = tools
        if self.config.temperature is not None:
            body["temperature"] = self.config.temperature
        if self.config.stream or stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        return body

    def _kwargs(self, target: Target, messages: list[dict[str, Any]],
                tools: list[dict[str, Any]] | None,
                max_tokens: int | None = None, stream: bool = False) -> dict[str, Any]:
        """litellm's keyword arguments."""
        kwargs = self._body(target.model, messages, tools, max_tokens, stream)
        kwargs.update(timeout=self.config.timeout, num_retries=0)
        if target.api_base:
            kwargs["model"] = route(target.model)
            kwargs["api_base"] = target.api_base
            # Local OpenAI-compatible servers rarely check keys, but the client wants one.
            kwargs["api_key"] = target.api_key or "not-needed"
        elif target.api_key:
            kwargs["api_key"] = target.api_key
        return kwargs

    async def _call(self, target: Target, messages: list[dict[str, Any]],
                    tools: list[dict[str, Any]] | None,
                    max_tokens: int | None = None,
                    deltas: TextDeltas | None = None,
                    encoded: EncodedSpan | None = None) -> LLMResponse:
        try:
            return await self._call_unscrubbed(target, messages, tools, max_tokens, deltas,
                                               encoded)
        except ProviderError as exc:
            # What a server says goes to the log and into the chat: some proxies quote the
            # key they refused, whole.
            text = str(exc)
            clean = _without_keys(text, [t.api_key for t in self.all_targets])
            if clean != text:
                exc.args = (clean,)
            raise

    async def _call_unscrubbed(self, target: Target, messages: list[dict[str, Any]],
                               tools: list[dict[str, Any]] | None,
                               max_tokens: int | None = None,
                               deltas: TextDeltas | None = None,
                               encoded: EncodedSpan | None = None) -> LLMResponse:
        model = target.model
        on_text = deltas.text if deltas is not None else None
        stream = deltas is not None
        if target.http is not None:
            body = self._body(model[len("openai/"):], messages, tools, max_tokens, stream)
            return await target.http.complete(body, model, on_text, encoded)
        lib = _lib()
        started = time.perf_counter()
        try:
            kwargs = self._kwargs(target, messages, tools, max_tokens, stream)
            if kwargs.get("stream"):
                answer = await collect_stream(await lib.acompletion(**kwargs), model, started,
                                              on_text)
                if answer is not None:
                    return answer
                kwargs.pop("stream_options", None)  # answered whole: ask for it whole
                kwargs["stream"] = False
            answer = from_response(await lib.acompletion(**kwargs), model, started)
            if on_text is not None and answer.content and not answer.tool_calls:
                on_text(answer.content)
            return answer
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            raise _map_error(lib, exc, model) from exc


_KEY_NAMES = re.compile(r"(API_KEY|APIKEY|_TOKEN|_SECRET)$")


def _without_keys(text: str, configured: list[str | None]) -> str:
    """``text`` with the configured keys and the provider keys in the environment
    (``OPENAI_API_KEY``, ...) replaced by ``[key]``."""
    keys = [k for k in configured if k] + [
        v for n, v in os.environ.items() if _KEY_NAMES.search(n.upper()) and len(v) >= 8]
    for key in sorted(set(keys), key=len, reverse=True):
        text = text.replace(key, "[key]")
    return text


def route(model: str) -> str:
    """``openai/<name>`` at an ``api_base`` is an OpenAI-compatible server (vLLM, Ollama, LM
    Studio, ...): litellm's ``hosted_vllm`` route speaks the same protocol without the OpenAI
    SDK, whose per-message request transform costs ~0.2 ms a message (measured in bench/)."""
    return f"hosted_vllm/{model[len('openai/'):]}" if model.startswith("openai/") else model


def _fields(r: LLMResponse) -> dict[str, Any]:
    return {name: getattr(r, name) for name in r.__slots__}  # type: ignore[attr-defined]


def _retry_after(exc: Exception) -> float | None:
    """A 429's Retry-After: litellm keeps the headers on the exception itself."""
    headers = getattr(exc, "litellm_response_headers", None) or getattr(
        getattr(exc, "response", None), "headers", None)
    if not headers:
        return None
    try:
        value = headers.get("retry-after")
        return max(0.0, float(value)) if value is not None else None
    except (TypeError, ValueError):
        return None


def _short(exc: Exception) -> str:
    text = str(getattr(exc, "message", None) or exc)
    try:  # provider error bodies are often JSON; keep the message only
        text = json.loads(text)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        pass
    text = text.replace("litellm.", "").strip()
    return text if len(text) <= 300 else text[:297] + "..."


_CONNECTION_SIGNS = ("connection error", "cannot connect", "connect call failed",
                     "connection refused", "connection reset")


def _map_error(lib: ModuleType, exc: Exception, model: str) -> ProviderError:
    if isinstance(exc, lib.AuthenticationError | lib.PermissionDeniedError):
        return ProviderAuthError(_short(exc), model=model)
    if isinstance(exc, lib.Timeout):
        return ProviderUnavailable("timed out", model=model, cause="timeout")
    if isinstance(exc, lib.RateLimitError):
        return ProviderUnavailable("rate limited (429)", model=model,
                                   retry_after=_retry_after(exc), cause="rate_limited")
    if isinstance(exc, lib.ContextWindowExceededError):
        return ProviderContextTooLarge(_short(exc), model=model)
    if isinstance(exc, lib.BadRequestError | lib.NotFoundError):
        return ProviderBadRequest(_short(exc), model=model)
    status = getattr(exc, "status_code", None)
    # litellm reports a refused or dropped connection as a 500 with the cause in its text.
    if (isinstance(exc, lib.APIConnectionError) and not isinstance(status, int)) or \
            any(sign in str(exc).lower() for sign in _CONNECTION_SIGNS):
        return ProviderUnavailable("connection failed", model=model)
    if isinstance(exc, lib.InternalServerError | lib.ServiceUnavailableError |
                  lib.APIConnectionError | lib.BadGatewayError) or (
            isinstance(status, int) and status >= 500):
        return ProviderUnavailable(f"server error {status}" if status else _short(exc),
                                   model=model, cause="server_error")
    return ProviderError(f"{type(exc).__name__}: {_short(exc)}", model=model)
