"""WebChat in a real headless browser: Debian's ``chromium`` (``make test`` installs it with
apt-get) driven by Playwright through ``executable_path``. Never ``playwright install``: it
downloads a browser, which this project does not do. Without chromium these tests are skipped,
and the reason is printed."""

from __future__ import annotations

import base64
import re
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import Browser, FilePayload, Page, async_playwright, expect

from channels.webchat import WebchatChannel
from gateway.app import Gateway
from tests.conftest import MakeConfig
from tests.fakes.openai_server import ScriptedLLM

CHROMIUM = shutil.which("chromium")
SKIP_REASON = ("WebChat browser tests skipped: Debian's chromium is not installed "
               "(apt-get install chromium; `make test` installs it when it runs as root)")
_PRINTED = pytest.StashKey[bool]()
ARGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run",
        "--disable-dev-shm-usage"]
SCRIPT_REPLY = ('Careful: <script>window.__pwned = 1</script>'
                '<img src=x onerror="window.__pwned = 2">')
PNG = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA"
                       "60e6kgAAAABJRU5ErkJggg==")
LINK = 'rel="noopener noreferrer nofollow" target="_blank"'
MARKDOWN = {  # CommonMark + GFM tables (markdown-it), built as elements, never as markup
    "**b** *i* `<c>` __u__": "<p><strong>b</strong> <em>i</em> <code>&lt;c&gt;</code> "
                            "<strong>u</strong></p>",
    "snake_case_name and 2*3*4": "<p>snake_case_name and 2<em>3</em>4</p>",
    "[ok](https://example.com/a) [no](javascript:alert(1))":
        f'<p><a href="https://example.com/a" {LINK}>ok</a> [no](javascript:alert(1))</p>',
    "see https://example.com/x.": f'<p>see <a href="https://example.com/x" {LINK}>'
                                  "https://example.com/x</a>.</p>",
    "- a\n- b\n\n3. c": "<ul><li>a</li><li>b</li></ul><ol start=\"3\"><li>c</li></ol>",
    "```html\n<b onclick=x>\n```": '<pre><code data-lang="html">&lt;b onclick=x&gt;</code></pre>',
    "one\ntwo\n\n# a heading\n## and another": "<p>one<br>two</p><h1>a heading</h1>"
                                               "<h2>and another</h2>",
    "> quoted **text**\n> more": "<blockquote><p>quoted <strong>text</strong><br>more</p>"
                                "</blockquote>",
    "| a | b |\n|:--|--:|\n| 1 | `2` |":
        '<table><thead><tr><th class="align-left">a</th><th class="align-right">b</th></tr>'
        '</thead><tbody><tr><td class="align-left">1</td><td class="align-right"><code>2</code>'
        "</td></tr></tbody></table>",
    "<https://example.com/auto> and <javascript:alert(1)>":
        f'<p><a href="https://example.com/auto" {LINK}>https://example.com/auto</a> and '
        "&lt;javascript:alert(1)&gt;</p>",
    '<a href="javascript:alert(1)">x</a> <b>raw</b>':
        "<p>&lt;a href=\"javascript:alert(1)\"&gt;x&lt;/a&gt; &lt;b&gt;raw&lt;/b&gt;</p>",
    "![img](https://example.com/i.png) ~~gone~~\n\n---":
        f'<p><a href="https://example.com/i.png" {LINK}>img</a> <s>gone</s></p><hr>',
}


@pytest.fixture
async def browser(request: pytest.FixtureRequest) -> AsyncIterator[Browser]:
    if CHROMIUM is None:
        _print_once(request.config, SKIP_REASON)
        pytest.skip(SKIP_REASON)
    async with async_playwright() as pw:
        launched = await pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            yield launched
        finally:
            await launched.close()


def _print_once(config: pytest.Config, line: str) -> None:
    """``pytest -q`` shows no skip reasons; this one says how to run the tests, so print it."""
    if config.stash.get(_PRINTED, False):
        return
    config.stash[_PRINTED] = True
    reporter: Any = config.pluginmanager.get_plugin("terminalreporter")
    capture: Any = config.pluginmanager.get_plugin("capturemanager")
    if reporter is None or capture is None:
        return
    with capture.global_and_fixture_disabled():
        reporter.ensure_newline()
        reporter.write_line(line, yellow=True)


def webchat(make_config: MakeConfig, port: int = 0) -> Any:
    return make_config(channels={"webchat": {"enabled": True, "port": port}})


def url_of(gw: Gateway) -> str:
    channel = gw.manager.channels["webchat"]
    assert isinstance(channel, WebchatChannel)
    return str(channel.base_url)


async def open_page(browser: Browser, url: str, errors: list[str]) -> Page:
    page = await browser.new_page()
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    await page.goto(url)
    await expect(page.locator("#conn")).to_have_text("connected")
    return page


async def say(page: Page, text: str) -> None:
    await page.fill("#text", text)
    await page.press("#text", "Enter")


async def test_chat_renders_replies_keeps_history_and_never_runs_html(
        browser: Browser, make_config: MakeConfig, llm: ScriptedLLM) -> None:
    llm.reply("Hello from **Parley**!").reply(SCRIPT_REPLY)
    errors: list[str] = []
    async with Gateway(webchat(make_config)) as gw:
        page = await open_page(browser, url_of(gw), errors)
        await say(page, "hello")
        replies = page.locator(".msg.assistant.kind-reply")
        await expect(replies.first.locator(".body")).to_have_text("Hello from Parley!")
        await expect(replies.first.locator("strong")).to_have_text("Parley")  # markdown
        await expect(page.locator("#working")).to_be_hidden()

        await page.reload()  # the same browser: its chat id is in local storage
        await expect(page.locator("#conn")).to_have_text("connected")
        await expect(page.locator(".msg .body")).to_have_text(["hello", "Hello from Parley!"])
        await expect(replies.first.locator("strong")).to_have_text("Parley")

        await say(page, "show me a script tag")
        await expect(replies.nth(1).locator(".body")).to_have_text(SCRIPT_REPLY)
        assert await page.locator("#log script, #log img").count() == 0
        assert await page.evaluate("window.__pwned") is None
    assert errors == []
    assert llm.calls == 2


async def test_page_reconnects_after_a_gateway_restart_and_loses_nothing(
        browser: Browser, make_config: MakeConfig, llm: ScriptedLLM) -> None:
    llm.reply("first answer").reply("answer after the restart")
    errors: list[str] = []
    async with Gateway(webchat(make_config)) as first:
        url = url_of(first)
        page = await open_page(browser, url, errors)
        await say(page, "one")
        replies = page.locator(".msg.assistant.kind-reply .body")
        await expect(replies).to_have_text(["first answer"])
    # The gateway is down: the page says so and keeps what is typed meanwhile.
    await expect(page.locator("#conn")).to_contain_text("reconnecting")
    await say(page, "two, sent while the gateway was down")
    await expect(page.locator(".msg.pending .status")).to_have_text("sending…")
    port = int(url.rsplit(":", 1)[1])
    async with Gateway(webchat(make_config, port)):
        await expect(replies).to_have_text(["first answer", "answer after the restart"],
                                           timeout=15_000)
        await expect(page.locator(".msg.user .body")).to_have_text(
            ["one", "two, sent while the gateway was down"])
        await expect(page.locator(".msg.pending")).to_have_count(0)
        await expect(page.locator("#conn")).to_have_text("connected")
    assert errors == []
    assert llm.calls == 2


async def test_images_are_sent_shown_and_capped(browser: Browser, make_config: MakeConfig,
                                                llm: ScriptedLLM, tmp_path: Path) -> None:
    llm.reply("A tiny picture.")
    errors: list[str] = []
    config = make_config(channels={"webchat": {"enabled": True, "port": 0,
                                               "max_image_bytes": 1024}})
    async with Gateway(config) as gw:
        page = await open_page(browser, url_of(gw), errors)
        big = tmp_path / "big.png"
        big.write_bytes(PNG + b"\0" * 2048)
        await page.set_input_files("#file", str(big))
        await expect(page.locator("#composer-error")).to_have_text(
            "That image is 2 KB; the limit is 1 KB.")
        dot: FilePayload = {"name": "dot.png", "mimeType": "image/png", "buffer": PNG}
        await page.set_input_files("#file", files=[dot])
        await expect(page.locator("#attachment")).to_be_visible()
        await expect(page.locator("#composer-error")).to_be_hidden()
        await say(page, "what is this?")
        await expect(page.locator(".msg.assistant .body")).to_have_text("A tiny picture.")
        assert llm.last_request["messages"][-1]["content"][1]["type"] == "image_url"

        await page.reload()  # the image comes back from the gateway, not from the page
        image = page.locator(".msg.user img")
        await expect(image).to_have_attribute("src", re.compile(r"^blob:"))
        assert await image.evaluate("img => img.complete && img.naturalWidth") == 1

        rendered = await page.evaluate(
            """cases => Object.keys(cases).map(src => {
                const box = document.createElement("div");
                box.appendChild(window.parleyMarkdown(src));
                return box.innerHTML;
            })""", MARKDOWN)
        assert dict(zip(MARKDOWN, rendered, strict=True)) == MARKDOWN
    assert errors == []


async def test_the_page_asks_for_the_token_once(browser: Browser, make_config: MakeConfig,
                                                llm: ScriptedLLM) -> None:
    llm.reply("authorized")
    errors: list[str] = []
    config = make_config(channels={"webchat": {"enabled": True, "port": 0,
                                               "token": "browser-test-token"}})
    async with Gateway(config) as gw:
        page = await browser.new_page()
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        await page.goto(url_of(gw))
        await expect(page.locator("#auth")).to_be_visible()
        await page.fill("#token", "wrong")
        await page.press("#token", "Enter")
        await expect(page.locator("#auth-error")).to_have_text("That token was not accepted.")
        await page.fill("#token", "browser-test-token")
        await page.press("#token", "Enter")
        await expect(page.locator("#conn")).to_have_text("connected")
        await say(page, "hello")
        await expect(page.locator(".msg.assistant .body")).to_have_text("authorized")
        await page.reload()
        await expect(page.locator("#conn")).to_have_text("connected")
        await expect(page.locator("#auth")).to_be_hidden()
        await expect(page.locator(".msg .body")).to_have_text(["hello", "authorized"])
    assert errors == []


FAKE_MICROPHONE = """
(() => {
  const bytes = new Uint8Array([0x1a, 0x45, 0xdf, 0xa3, 0x9f, 0x42, 0x86, 0x81, 0x01,
                                ...new TextEncoder().encode(" fake opus recording")]);
  Object.defineProperty(navigator, "mediaDevices", { configurable: true, value: {
    getUserMedia: async () => ({ getTracks: () => [{ stop() { window.__micReleased = true; } }] }),
  } });
  window.MediaRecorder = class extends EventTarget {
    constructor(stream, options) {
      super();
      this.mimeType = (options && options.mimeType) || "audio/webm";
    }
    static isTypeSupported(type) { return type.startsWith("audio/webm"); }
    start() {}
    stop() {
      const data = new Event("dataavailable");
      data.data = new Blob([bytes], { type: this.mimeType });
      this.dispatchEvent(data);
      this.dispatchEvent(new Event("stop"));
    }
  };
})();
"""


async def test_the_microphone_button_records_and_sends_a_voice_message(
        browser: Browser, make_config: MakeConfig, llm: ScriptedLLM) -> None:
    """Chromium cannot record real audio here: a fake MediaRecorder stands in for the
    device, and everything from the button on is the page's own code and the gateway's."""
    from tests.fakes.audio_server import ScriptedAudio

    llm.reply("Noted: call the plumber.")
    errors: list[str] = []
    async with ScriptedAudio() as audio:
        audio.hears("call the plumber tomorrow", seconds=1.0)
        config = make_config(channels={"webchat": {"enabled": True, "port": 0}}, agent={
            "media": {"transcription": {"api_base": audio.base_url, "model": "whisper-1"}}})
        async with Gateway(config) as gw:
            page = await browser.new_page()
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            await page.add_init_script(FAKE_MICROPHONE)
            await page.goto(url_of(gw))
            await expect(page.locator("#conn")).to_have_text("connected")
            mic = page.locator("#mic")
            await expect(mic).to_be_visible()
            await mic.click()
            await expect(mic).to_have_attribute("aria-pressed", "true")
            await mic.click()
            await expect(mic).to_have_attribute("aria-pressed", "false")
            await expect(page.locator(".msg.assistant.kind-reply .body")).to_have_text(
                "Noted: call the plumber.")
            await expect(page.locator(".msg.user .recording-note")).to_have_count(1)
            assert await page.evaluate("window.__micReleased") is True
        [heard] = audio.transcriptions
    assert heard.file.startswith(b"\x1a\x45\xdf\xa3") and heard.content_type == "audio/webm"
    assert "call the plumber tomorrow" in llm.last_request["messages"][-1]["content"]
    assert errors == []
