"""Images for a text-only model (``agent.media.vision``).

Whether the turn's model sees images: the config says so (``main_sees_images``), or litellm's
bundled model info (``supports_vision``; a model it does not know, such as a local server's,
is taken to see them, as before). When it does not, the auxiliary vision model describes each
image first and the description, not the image, goes to the main model; without one, the model
gets the image's path and a note that it cannot see it.
"""

from __future__ import annotations

import asyncio
import base64
import functools
from pathlib import Path

from agent.errors import ProviderError
from agent.llm_types import LLMResponse
from agent.provider import Provider, bundled_model_info
from gateway.kernel.config import AgentConfig
from gateway.kernel.config_media import VisionConfig

MAX_IMAGE_BYTES = 10 * 1024 * 1024


def sees_images(config: VisionConfig, model: str) -> bool:
    if config.main_sees_images != "auto":
        return bool(config.main_sees_images)
    return _model_sees_images(model)


@functools.lru_cache(maxsize=64)
def _model_sees_images(model: str) -> bool:
    """litellm's word on ``model`` (its model map is read once per model, not per image)."""
    info = bundled_model_info(model)
    return True if info is None else bool(info.get("supports_vision"))


class DescribeFailed(Exception):
    """Why an image could not be described, in words for the chat."""


class Describer:
    """The auxiliary vision model, called through the same ``Provider`` as the main one
    (litellm, or the direct route for ``openai/<name>`` at an ``api_base``)."""

    def __init__(self, config: VisionConfig, agent: AgentConfig) -> None:
        assert config.model is not None
        self.config = config
        self.provider = Provider(AgentConfig(
            model=config.model, api_base=config.api_base, api_key=config.api_key,
            max_tokens=config.max_tokens, timeout=config.timeout,
            max_retries=agent.max_retries, retry_backoff=agent.retry_backoff,
            transport=agent.transport))

    async def describe(self, path: Path, mime: str | None) -> LLMResponse:
        try:
            data = await asyncio.to_thread(_read, path)
        except OSError as exc:
            raise DescribeFailed(f"the image could not be read ({exc.strerror})") from None
        if data is None:
            raise DescribeFailed(f"the image is over {MAX_IMAGE_BYTES // 1024 // 1024} MB")
        url = f"data:{mime or 'image/png'};base64,{base64.b64encode(data).decode()}"
        messages = [{"role": "user", "content": [
            {"type": "text", "text": self.config.prompt},
            {"type": "image_url", "image_url": {"url": url}}]}]
        try:
            response = await self.provider.complete(messages)
        except ProviderError as exc:
            raise DescribeFailed(str(exc)) from None
        if not (response.content or "").strip():
            raise DescribeFailed("the vision model gave no description")
        return response

    async def aclose(self) -> None:
        """Its own connection pools (litellm's clients are the main provider's to close)."""
        for target in self.provider.all_targets:
            if target.http is not None:
                await target.http.aclose()


def _read(path: Path) -> bytes | None:
    if path.stat().st_size > MAX_IMAGE_BYTES:
        return None
    return path.read_bytes()
