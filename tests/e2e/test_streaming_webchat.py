"""Live replies in WebChat (``channels.webchat.streaming``), in real Chromium: the answer
grows on the page while the model writes it (held between pieces), rendered as markdown,
and the final message replaces it: one answer on the page, also after a reload."""

from __future__ import annotations

from playwright.async_api import Browser, expect

from gateway.app import Gateway
from tests.conftest import MakeConfig
from tests.e2e.test_webchat_browser import browser, open_page, say, url_of  # noqa: F401
from tests.fakes.openai_server import Gate, ScriptedLLM

ANSWER = "The plan: **pack** tonight, then take the early train to Lyon."


async def test_the_answer_grows_then_one_final(
        browser: Browser, make_config: MakeConfig, llm: ScriptedLLM) -> None:  # noqa: F811
    second, third = Gate(), Gate()
    llm.reply(ANSWER, pieces=["The plan: **pack**", " tonight, then", " take the early "
                              "train to Lyon."], pauses={2: second, 3: third})
    config = make_config(channels={"webchat": {"enabled": True, "port": 0, "streaming": {
        "enabled": True, "interval": 0, "min_chars": 0}}})
    errors: list[str] = []
    async with Gateway(config) as gw:
        page = await open_page(browser, url_of(gw), errors)
        await say(page, "plan the trip")
        growing = page.locator(".msg.assistant.kind-partial .body")
        await expect(growing).to_have_text("The plan: pack")
        await expect(growing.locator("strong")).to_have_text("pack")  # markdown as it grows
        second.release()
        await expect(growing).to_have_text("The plan: pack tonight, then")
        third.release()
        final = page.locator(".msg.assistant.kind-reply .body")
        await expect(final).to_have_text("The plan: pack tonight, then take the early train "
                                         "to Lyon.")
        await expect(page.locator(".msg.assistant")).to_have_count(1)  # the partial is gone
        await page.reload()
        await expect(page.locator(".msg.assistant .body")).to_have_text([
            "The plan: pack tonight, then take the early train to Lyon."])
    assert errors == []
