"""Which model answers: ``/model`` per conversation (aliases from config, kept across a
restart, fallbacks per alias, which levels may switch) and a chat's own default model and
prompt, seen in the requests the scripted model server receives."""

from __future__ import annotations

from typing import Any

from gateway.app import Gateway
from gateway.kernel.config import Config
from tests.conftest import MakeConfig
from tests.e2e.test_discord import ADA_ID, GENERAL_ID, GUILD_ID, OTHER_ID, discord_config
from tests.fakes.discord_server import BOT_ID, FakeDiscord
from tests.fakes.openai_server import ScriptedLLM


def config(make_config: MakeConfig, llm: ScriptedLLM, switch: list[str] | None = None,
           **agent: Any) -> Config:
    server = {"api_base": llm.base_url, "api_key": "sk-test"}
    levels = {"switch": switch} if switch is not None else {}
    return make_config(agent={"max_retries": 0, "models": {**levels, "aliases": {
        "smart": {"model": "openai/smart-model", **server,
                  "fallbacks": ["openai/smart-backup"]},
        "fast": {"model": "openai/fast-model", **server},
    }}, **agent})


def runtime_of(request: dict[str, Any]) -> str:
    return str(request["messages"][-2]["content"])


async def test_model_smart_changes_the_next_request_and_survives_a_restart(
        make_config: MakeConfig, llm: ScriptedLLM) -> None:
    cfg = config(make_config, llm)
    async with Gateway(cfg, grace=2.0) as gw:
        listing = await gw.local.ask("c1", "/model")
        assert "Model: openai/test-model" in listing
        assert "- smart: openai/smart-model" in listing and "- fast:" in listing
        assert "smart-model" in await gw.local.ask("c1", "/model smart")
        llm.reply("smart answer")
        assert await gw.local.ask("c1", "hello") == "smart answer"
        assert llm.last_request["model"] == "smart-model"
        assert "Model: openai/smart-model" in runtime_of(llm.last_request)
        llm.reply("other chat")
        await gw.local.ask("c2", "hello")  # another conversation keeps the default
        assert llm.last_request["model"] == "test-model"
        assert gw.store is not None
        session = await gw.store.active_session("local:c1")
        snapshot = await gw.store.latest_snapshot(session.id)
        assert snapshot is not None and snapshot["model"] == "openai/smart-model"

    async with Gateway(cfg, grace=2.0) as gw:
        llm.reply("still smart")
        assert await gw.local.ask("c1", "again") == "still smart"
        assert llm.last_request["model"] == "smart-model"
        # The alias's own fallbacks: smart fails, its backup answers.
        llm.error(500).reply("from the backup")
        assert await gw.local.ask("c1", "once more") == "from the backup"
        assert [r["model"] for r in llm.requests[-2:]] == ["smart-model", "smart-backup"]
        assert "default" in await gw.local.ask("c1", "/model default")
        llm.reply("default again")
        await gw.local.ask("c1", "and now?")
        assert llm.last_request["model"] == "test-model"
        assert "no model 'huge'" in await gw.local.ask("c1", "/model huge")


async def test_guests_may_not_switch_unless_configured(make_config: MakeConfig,
                                                       llm: ScriptedLLM) -> None:
    guest: dict[str, Any] = {"sender_id": "gus", "trust": "guest"}
    async with Gateway(config(make_config, llm), grace=2.0) as gw:
        assert "not open to you" in await gw.local.ask("g", "/model", **guest)
        assert "not open to you" in await gw.local.ask("g", "/model smart", **guest)
        llm.reply("default")
        await gw.local.ask("g", "hi", **guest)
        assert llm.last_request["model"] == "test-model"
    allowed = config(make_config, llm, switch=["owner", "member", "guest"])
    async with Gateway(allowed, grace=2.0) as gw:
        assert "fast-model" in await gw.local.ask("g", "/model fast", **guest)
        llm.reply("fast")
        await gw.local.ask("g", "hi", **guest)
        assert llm.last_request["model"] == "fast-model"


async def test_a_chat_has_its_own_default_model_and_prompt(make_config: MakeConfig,
                                                           llm: ScriptedLLM) -> None:
    cfg = config(make_config, llm, chats={
        "local:family": {"model": "fast", "prompt": "This is the family group."},
        "local": {"prompt": "Every local chat hears this."}})
    async with Gateway(cfg, grace=2.0) as gw:
        llm.reply("hi family")
        await gw.local.ask("family", "hello")
        request = llm.last_request
        assert request["model"] == "fast-model"
        system = request["messages"][0]["content"]
        assert system.endswith("# This chat\nThis is the family group.")
        assert "Every local chat" not in system  # the chat's own entry wins
        llm.reply("hi other")
        await gw.local.ask("other", "hello")
        assert llm.last_request["model"] == "test-model"
        assert llm.last_request["messages"][0]["content"].endswith(
            "# This chat\nEvery local chat hears this.")
        # /model still switches a chat with a default, and default goes back to the chat's.
        await gw.local.ask("family", "/model smart")
        llm.reply("smart")
        await gw.local.ask("family", "hello")
        assert llm.last_request["model"] == "smart-model"
        assert "fast-model" in await gw.local.ask("family", "/model default")


def test_a_chat_default_must_name_an_alias(make_config: MakeConfig) -> None:
    import pytest

    from gateway.kernel.config import ConfigError

    with pytest.raises((ConfigError, ValueError)) as caught:
        make_config(agent={"chats": {"local:x": {"model": "nope"}}})
    assert "chats.local:x.model" in str(caught.value) and "nope" in str(caught.value)


async def test_a_discord_server_has_its_own_default(make_config: MakeConfig, llm: ScriptedLLM,
                                                    dc: FakeDiscord) -> None:
    """A server's entry holds for each of its channels; a channel's own entry wins; a direct
    message takes the channel-wide one."""
    guild = dc.guild(GUILD_ID, "Open house")
    general = dc.text_channel(guild, GENERAL_ID, "general")
    other = dc.text_channel(guild, OTHER_ID, "other")
    ada = dc.user(ADA_ID, "ada")
    server = {"api_base": llm.base_url, "api_key": "sk-test"}
    cfg = discord_config(make_config, dc, agent={
        "models": {"aliases": {"smart": {"model": "openai/smart-model", **server},
                               "fast": {"model": "openai/fast-model", **server}}},
        "chats": {f"discord:server:{GUILD_ID}": {"model": "smart", "prompt": "Server rules."},
                  f"discord:{OTHER_ID}": {"model": "fast"},
                  "discord": {"prompt": "Discord-wide."}}})
    async with Gateway(cfg, grace=2.0):
        llm.reply("in general")
        dc.post(general, ada, f"<@{BOT_ID}> hi", mentions=(dc.bot,))
        await dc.wait_sent(GENERAL_ID)
        assert llm.last_request["model"] == "smart-model"
        assert llm.last_request["messages"][0]["content"].endswith("Server rules.")
        llm.reply("in other")
        dc.post(other, ada, f"<@{BOT_ID}> hi", mentions=(dc.bot,))
        await dc.wait_sent(OTHER_ID)
        assert llm.last_request["model"] == "fast-model"
        llm.reply("direct")
        dm = dc.dm_channel(ada)
        dc.post(dm, ada, "hi")
        await dc.wait_sent(dm["id"])
        assert llm.last_request["model"] == "test-model"
        assert llm.last_request["messages"][0]["content"].endswith("Discord-wide.")
