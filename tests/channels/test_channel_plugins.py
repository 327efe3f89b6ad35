"""Channel plugins: a channel package built and installed here (``tests/plugin_dummy``, a real
``parley.channels`` entry point) is listed by ``parley status``, configured, started by the
gateway and passes the contract kit (``parley.testing``); so does the built-in local channel."""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from channels.base import Channel
from channels.local import LocalChannel
from gateway.app import Gateway
from gateway.kernel import channel_registry
from gateway.kernel.config import ConfigError, LocalChannelConfig, parse_config
from gateway.kernel.values import Delivery
from parley.testing import CHECKS, ChannelContract, ContractFailure
from tests.conftest import MakeConfig
from tests.fakes.openai_server import ScriptedLLM

DUMMY = Path(__file__).resolve().parent.parent / "plugin_dummy"
TOKEN = "kit-token"


# --- the built-in local channel -----------------------------------------------------------------

class LocalFake:
    """The local channel's "platform" is its own HTTP API: the owner holds the token, a
    stranger does not (and is refused at the door)."""

    pairing = False
    not_applicable = {"failed_send": "the local channel keeps replies in memory for clients "
                                     "to read: there is no platform that could refuse them"}

    def __init__(self, session: aiohttp.ClientSession) -> None:
        self.session = session
        self.base = ""
        self.owner = ""

    def section(self, *, owner: str) -> LocalChannelConfig:
        self.owner = owner
        return LocalChannelConfig(port=0, token=TOKEN)

    def attach(self, channel: Channel) -> None:
        assert isinstance(channel, LocalChannel) and channel.base_url
        self.base = channel.base_url

    def chat_of(self, user: str) -> str:
        return f"dm-{user}"

    async def user_says(self, user: str, text: str) -> None:
        headers = {"Authorization": f"Bearer {TOKEN}"} if user == self.owner else {}
        body = {"chat_id": self.chat_of(user), "sender_id": user, "text": text}
        async with self.session.post(f"{self.base}/v1/messages", json=body,
                                     headers=headers) as resp:
            assert resp.status == (202 if user == self.owner else 401), await resp.text()

    async def bot_messages(self, chat_id: str, count: int) -> list[str]:
        params = {"chat_id": chat_id, "after": "0", "wait": "10"}
        headers = {"Authorization": f"Bearer {TOKEN}"}
        while True:
            async with self.session.get(f"{self.base}/v1/messages", params=params,
                                        headers=headers) as resp:
                found = [m["text"] for m in (await resp.json())["messages"]]
            if len(found) >= count:
                return found

    async def fail_sends(self) -> None:
        raise AssertionError("not applicable: never called")


@pytest.mark.parametrize("check", CHECKS)
async def test_the_local_channel_passes_the_kit(check: str, tmp_path: Path) -> None:
    async with aiohttp.ClientSession() as session:
        fake = LocalFake(session)
        async with ChannelContract(channel_registry.load("local"), fake, tmp_path) as kit:
            found = await kit.run(check)
    assert found == ("ok" if check != "failed_send" else
                     f"not applicable: {LocalFake.not_applicable['failed_send']}")


# --- a plugin package, installed --------------------------------------------------------------

@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The dummy plugin built and installed (pip, no index) into a directory of its own,
    which this module's tests put on ``sys.path`` (and subprocesses on ``PYTHONPATH``)."""
    root = tmp_path_factory.mktemp("plugin")
    source, target = root / "src", root / "site"
    shutil.copytree(DUMMY, source)
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
         "--no-build-isolation", "--target", str(target), str(source)],
        capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert list(target.glob("parley_dummychat-*.dist-info/entry_points.txt"))
    sys.path.insert(0, str(target))
    importlib.invalidate_caches()
    try:
        yield target
    finally:
        sys.path.remove(str(target))
        for name in [m for m in sys.modules if m == "dummychat" or m.startswith("dummychat.")]:
            del sys.modules[name]
        importlib.invalidate_caches()


def parley_cli(site: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(site), "COLUMNS": "300"}
    return subprocess.run([str(Path(sys.executable).parent / "parley"), *args], capture_output=True,
                          text=True, env=env, timeout=120, cwd=DUMMY.parent.parent)


def test_an_installed_plugin_is_listed_by_parley_status(site: Path, tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(f"workspace: {tmp_path / 'ws'}\ndata_dir: {tmp_path / 'data'}\n"
                      "channels:\n  local: {enabled: false}\n"
                      "  dummychat: {enabled: true, allow_from: ['1']}\n")
    done = parley_cli(site, "status", "--config", str(config))
    assert done.returncode == 1, done.stderr  # no gateway is running: status says so
    line = next(x for x in done.stdout.splitlines() if x.startswith("channels:"))
    assert "dummychat" in line.split(";")[0] and "local" in line.split(";")[0]
    assert line.split("enabled:")[1].split() == ["dummychat"]

    config.write_text("channels:\n  dummychat: {enabled: true, max_length: 5, colour: red}\n"
                      "  nosuchchat: {enabled: true}\n")
    done = parley_cli(site, "status", "--config", str(config))
    assert done.returncode != 0
    assert "channels.dummychat.max_length: Input should be greater than 20" in done.stderr
    assert "channels.dummychat.colour: unknown key" in done.stderr
    assert "channels.nosuchchat: unknown channel (installed channels: discord, dummychat, " \
           "local" in done.stderr


def test_a_section_of_no_installed_channel_names_the_installed_ones() -> None:
    with pytest.raises(ConfigError, match=r"channels\.mattermost: unknown channel \(installed "
                                          r"channels: discord, .*local, openai"):
        parse_config({"channels": {"mattermost": {"enabled": True}}}, env={})


@pytest.mark.parametrize("check", CHECKS)
async def test_the_installed_plugin_passes_the_kit(check: str, site: Path,
                                                  tmp_path: Path) -> None:
    from dummychat.fake import DummyFake  # type: ignore[import-not-found]

    plugin = channel_registry.load("dummychat")
    assert plugin.__module__ == "dummychat"
    async with ChannelContract(plugin, DummyFake(), tmp_path) as kit:
        assert await kit.run(check) == "ok"


@pytest.mark.parametrize(("check", "flaw"), [("failed_send", "raises"),
                                             ("stranger", "serves anyone"),
                                             ("inbound", "trusts no one"),
                                             ("chunking", "ignores the limit")])
async def test_the_kit_catches_a_channel_that_breaks_the_contract(
        check: str, flaw: str, site: Path, tmp_path: Path) -> None:
    from dummychat import DummyChannel, DummyChatConfig  # type: ignore[import-not-found]
    from dummychat.fake import DummyFake  # type: ignore[import-not-found]

    class Flawed(DummyChannel):  # type: ignore[misc]
        async def send(self, msg: Any) -> Any:
            if flaw == "raises" and self.platform.refuse:
                raise RuntimeError("refused")
            if flaw == "ignores the limit":
                self.platform.post(msg.chat_id, msg.text)
                return Delivery(ok=True)
            return await super().send(msg)

    fake = DummyFake()
    if flaw in ("serves anyone", "trusts no one"):  # open to all, the owner not listed
        open_to_all = DummyChatConfig(enabled=True, platform="kit", dm_policy="open")
        fake.section = lambda owner: open_to_all  # type: ignore[method-assign]
    async with ChannelContract(Flawed, fake, tmp_path) as kit:
        with pytest.raises(ContractFailure, match=f"dummychat: {check}: "):
            await kit.run(check)


@pytest.fixture
async def plugin_gateway(site: Path, make_config: MakeConfig) -> AsyncIterator[Gateway]:
    config = make_config(channels={"dummychat": {"enabled": True, "platform": "gw",
                                                 "allow_from": ["7"]}})
    async with Gateway(config, grace=2.0) as gw:
        yield gw


async def test_the_gateway_runs_an_installed_plugin(plugin_gateway: Gateway,
                                                    llm: ScriptedLLM) -> None:
    from dummychat.fake import DummyFake  # type: ignore[import-not-found]

    assert "dummychat" in plugin_gateway.manager.channels
    assert plugin_gateway.health()["channels"]["dummychat"]["state"] == "connected"
    llm.reply("Hello from the agent.")
    driver = DummyFake("gw", fresh=False)
    await driver.user_says("7", "hi")
    assert await driver.bot_messages("dm-7", 1) == ["Hello from the agent."]
    assert llm.requests[0]["messages"][-1] == {"role": "user", "content": "hi"}
