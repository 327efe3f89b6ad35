"""WebChat in real Chromium (see ``test_webchat_browser``): markdown rendered as elements and
never as markup, past conversations listed and reopened, and a phone-sized screen."""

from __future__ import annotations

from typing import Any

from playwright.async_api import Browser, FilePayload, Page, expect

from gateway.app import Gateway
from tests.conftest import MakeConfig
from tests.e2e import test_webchat_browser as shared
from tests.e2e.test_webchat_browser import PNG, open_page, say, url_of, webchat
from tests.fakes.openai_server import ScriptedLLM

browser = shared.browser  # the fixture: Debian's chromium, skipped (saying why) without it

RICH_REPLY = """# Plan

> Quoted **advice**

| step | cost |
|------|-----:|
| one  | 1 €  |

See <https://example.com/docs> or [this](javascript:window.__pwned=3) and
<a href="javascript:window.__pwned=4">that</a>.
"""

WIDE_REPLY = ("| " + " | ".join(["averyveryverylongcellvalue"] * 5) + " |\n|"
              + "---|" * 5 + "\n| " + " | ".join(["x"] * 5) + " |\n\n```\n" + "y" * 200
              + "\n```\nhttps://example.com/" + "z" * 150)


async def test_markdown_replies_are_elements_and_nothing_in_them_runs(
        browser: Browser, make_config: MakeConfig, llm: ScriptedLLM) -> None:
    llm.reply(RICH_REPLY)
    errors: list[str] = []
    async with Gateway(webchat(make_config)) as gw:
        page = await open_page(browser, url_of(gw), errors)
        await say(page, "a plan please")
        body = page.locator(".msg.assistant.kind-reply .body")
        await expect(body.locator("h1")).to_have_text("Plan")
        await expect(body.locator("blockquote strong")).to_have_text("advice")
        await expect(body.locator("table th")).to_have_text(["step", "cost"])
        await expect(body.locator("table td")).to_have_text(["one", "1 €"])
        autolink = body.locator("a")
        await expect(autolink).to_have_count(1)  # the javascript: ones stay text
        await expect(autolink).to_have_attribute("href", "https://example.com/docs")
        await expect(body).to_contain_text('<a href="javascript:window.__pwned=4">that</a>')
        await body.get_by_text("[this](javascript:window.__pwned=3)", exact=False).click()
        assert await page.evaluate("window.__pwned") is None
    assert errors == []


async def conversation(page: Page) -> list[str]:
    return await page.locator(".msg .body").all_inner_texts()


async def listed(page: Page) -> list[str]:
    await page.click("#chats-toggle")
    await expect(page.locator("#chats")).to_be_visible()
    titles = page.locator("#chat-list .chat-title")
    await expect(titles.first).to_be_visible()
    return await titles.all_inner_texts()


async def test_new_conversation_clears_the_screen_and_the_old_one_can_be_reopened(
        browser: Browser, make_config: MakeConfig, llm: ScriptedLLM) -> None:
    llm.reply("answer one").reply("answer two").reply("answer three")
    errors: list[str] = []
    async with Gateway(webchat(make_config)) as gw:
        page = await open_page(browser, url_of(gw), errors)
        await say(page, "first question")
        replies = page.locator(".msg.assistant.kind-reply .body")
        await expect(replies).to_have_text(["answer one"])

        await page.click("#new")
        await expect(page.locator(".msg")).to_have_count(0)  # a clean screen
        await expect(page.locator("#conn")).to_have_text("connected")
        await say(page, "second question")
        await expect(replies).to_have_text(["answer two"])
        assert await listed(page) == ["second question", "first question"]

        await page.reload()  # the list is kept by the gateway, found again after a reload
        await expect(page.locator("#conn")).to_have_text("connected")
        await expect(page.locator(".msg .body")).to_have_text(["second question", "answer two"])
        assert await listed(page) == ["second question", "first question"]
        await expect(page.locator("#chat-list .current .chat-title")).to_have_text(
            "second question")

        await page.locator("#chat-list .chat-item", has_text="first question").click()
        await expect(page.locator("#chats")).to_be_hidden()
        await expect(page.locator(".msg .body")).to_have_text(["first question", "answer one"])
        await expect(page.locator("#conn")).to_have_text("connected")
        await say(page, "and a follow-up")
        await expect(replies).to_have_text(["answer one", "answer three"])
        said = [m["content"] for m in llm.last_request["messages"] if m["role"] == "user"]
        assert any("first question" in str(c) for c in said)  # the same conversation goes on
        assert not any("second question" in str(c) for c in said)
    assert errors == []


async def test_a_390_px_screen_shows_the_whole_input_and_send_button(
        browser: Browser, make_config: MakeConfig, llm: ScriptedLLM) -> None:
    """A phone: wide replies scroll inside their bubble, a long file name is cut with an
    ellipsis, and nothing pushes the composer or the bar beyond the screen."""
    llm.reply(WIDE_REPLY)
    errors: list[str] = []
    async with Gateway(webchat(make_config)) as gw:
        context = await browser.new_context(viewport={"width": 390, "height": 664},
                                            is_mobile=True, has_touch=True,
                                            device_scale_factor=3)
        page = await context.new_page()
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        await page.goto(url_of(gw))
        await expect(page.locator("#conn")).to_have_text("connected")
        await say(page, "a wide answer please")
        await expect(page.locator(".msg.assistant.kind-reply")).to_be_visible()
        shot: FilePayload = {"name": "Screenshot_2026-11-25-10-48-13-123_com.android.chrome"
                                     "_with_a_very_long_name.png",
                             "mimeType": "image/png", "buffer": PNG}
        await page.set_input_files("#file", files=[shot])
        await expect(page.locator("#attachment")).to_be_visible()

        width = await page.evaluate("document.documentElement.scrollWidth")
        assert width <= 390, f"the page is {width} px wide: it scrolls sideways"
        for selector in ("#text", "#send", "#file + span, .pick", "#attachment-remove", "#new",
                         "#chats-toggle"):
            box: Any = await page.locator(selector).first.bounding_box()
            assert box is not None, selector
            assert box["x"] >= 0 and box["x"] + box["width"] <= 390, (selector, box)
            assert box["y"] >= 0 and box["y"] + box["height"] <= 664, (selector, box)
        await context.close()
    assert errors == []
