"""What it costs and who may spend it: the usage ledger, limits, /usage, `parley usage` and the
health totals, driven through the local channel against the scripted model server reporting
known usage. Periods move on a FakeClock; restarts are real (a new Gateway on the same
database)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import yaml

from gateway.app import Gateway
from gateway.kernel.config import Config
from tests.conftest import MakeConfig
from tests.e2e.test_cli import _env, parley
from tests.e2e.waiting import until
from tests.fakes.clock import FakeClock
from tests.fakes.openai_server import ScriptedLLM

PRICED = "openai/gpt-4o-mini"
"""A model litellm's bundled price map knows (at the scripted server all the same)."""


def litellm_cost(model: str, prompt: int, completion: int) -> float:
    import litellm

    cost_in, cost_out = litellm.cost_per_token(model=model, prompt_tokens=prompt,
                                               completion_tokens=completion)
    return float(cost_in + cost_out)


async def limited(gw: Gateway, n: int) -> None:
    agent = gw.agent
    assert agent is not None
    await until(lambda: agent.stats.limited >= n,
                lambda: f"{n} message(s) refused over a limit, {agent.stats.limited} were")


async def test_the_ledger_sums_reported_usage_and_prices_it_like_litellm(
        make_config: MakeConfig, llm: ScriptedLLM) -> None:
    clock = FakeClock()
    async with Gateway(make_config(agent={"model": PRICED}), grace=2.0, clock=clock) as gw:
        llm.tool_call("list_dir", {"path": "."}, usage={"prompt_tokens": 1200,
                                                        "completion_tokens": 40})
        llm.reply("Here it is.", usage={"prompt_tokens": 1300, "completion_tokens": 60})
        assert await gw.local.ask("c1", "what is here?", sender_id="ada") == "Here it is."
        llm.reply("Hello Bob.", usage={"prompt_tokens": 500, "completion_tokens": 7})
        assert await gw.local.ask("c2", "hi", sender_id="bob", trust="member") == "Hello Bob."

        store = gw.store
        assert store is not None
        total = await store.usage_total()
        assert (total.calls, total.prompt_tokens, total.completion_tokens) == (3, 3000, 107)
        expected = litellm_cost(PRICED, 3000, 107)
        assert expected > 0
        assert abs(total.cost - expected) < 1e-12
        people = {r.key: r for r in await store.usage_by("person")}
        assert people["local:ada"].tokens == 2500 + 100
        assert abs(people["local:bob"].cost - litellm_cost(PRICED, 500, 7)) < 1e-12
        assert {r.key for r in await store.usage_by("chat")} == {"local:c1", "local:c2"}
        assert [r.key for r in await store.usage_by("day")] == ["2025-01-06"]
        assert [r.key for r in await store.usage_by("model")] == ["gpt-4o-mini"]
        turns = await store.usage_by("turn")
        assert [r.calls for r in turns] == [2, 1]  # per turn: the tool round and its answer
        session = await store.active_session("local:c2")
        assert [r.key for r in await store.usage_by("session")] == sorted(
            {str(session.id), str((await store.active_session("local:c1")).id)})
        status = await gw.local.ask("c2", "/status", sender_id="bob", trust="member")
        assert f"cost {litellm_cost(PRICED, 500, 7):.4f}" in status

        health = gw.health()["usage"]
        assert health["today"]["calls"] == 3 and health["today"]["tokens"] == 3107
        assert abs(health["today"]["cost"] - round(expected, 6)) < 1e-9
        assert health["all"]["tokens"] == 3107
        async with aiohttp.ClientSession() as http, \
                http.get(f"{gw.local.base_url}/v1/health") as resp:
            assert (await resp.json())["usage"]["today"]["tokens"] == 3107

    clock.advance(24 * 3600)  # the next day, after a restart: today is new, all is kept
    async with Gateway(make_config(agent={"model": PRICED}), grace=2.0, clock=clock) as gw:
        health = gw.health()["usage"]
        assert health["today"]["tokens"] == 0 and health["all"]["tokens"] == 3107


async def test_a_model_unknown_to_the_price_map_costs_what_config_says(
        make_config: MakeConfig, llm: ScriptedLLM) -> None:
    config = make_config(agent={"usage": {"prices": {"openai/test-model": {
        "input": 2.0, "output": 10.0}}}})
    async with Gateway(config, grace=2.0) as gw:
        llm.reply("ok", usage={"prompt_tokens": 1000, "completion_tokens": 100})
        await gw.local.ask("c1", "hi")
        assert gw.store is not None
        assert abs((await gw.store.usage_total()).cost - (2000 + 1000) / 1e6) < 1e-12
    async with Gateway(make_config(), grace=2.0) as gw:  # a local model, no price set
        llm.reply("ok", usage={"prompt_tokens": 1000, "completion_tokens": 100})
        await gw.local.ask("c1", "hi")
        assert gw.store is not None
        rows = await gw.store.usage_by("day")
        assert rows[0].tokens == 2200  # both turns, one database


def guest_limits(make_config: MakeConfig) -> Config:
    return make_config(agent={"limits": {"guest": {"messages_per_minute": 3}}})


async def test_a_guest_over_three_messages_a_minute_gets_one_notice_and_no_model(
        make_config: MakeConfig, llm: ScriptedLLM) -> None:
    clock = FakeClock()
    config = guest_limits(make_config)
    gw = Gateway(config, grace=2.0, clock=clock)
    await gw.start()
    try:
        guest: dict[str, Any] = {"sender_id": "gus", "trust": "guest"}
        for i in range(3):
            llm.reply(f"answer {i}")
            assert await gw.local.ask("g", f"question {i}", **guest) == f"answer {i}"
        notice = await gw.local.ask("g", "question 3", **guest)
        assert "3 messages a minute" in notice
        await gw.local.inject("g", "question 4", **guest)
        await limited(gw, 2)
        assert llm.calls == 3  # neither over-limit message reached the model

        # The owner in the same chat is not held by the guests' limit.
        llm.reply("owner answer")
        assert await gw.local.ask("g", "and me?") == "owner answer"
        records, last = await gw.local.wait_messages("g", timeout=0)
        assert [r["text"] for r in records].count(notice) == 1  # one notice, not one each
    finally:
        await gw.stop()

    # A restart within the same minute: still over, and the notice is not repeated.
    gw = Gateway(config, grace=2.0, clock=clock)
    await gw.start()
    try:
        await gw.local.inject("g", "question 5", **guest)
        await limited(gw, 1)
        llm.reply("owner again")
        assert await gw.local.ask("g", "still there?") == "owner again"
        records, _ = await gw.local.wait_messages("g", after=last, timeout=0)
        assert [r["kind"] for r in records] == ["reply"]  # since the restart: no notice
        assert llm.calls == 5  # 3 for the guest, 2 for the owner

        clock.advance(60)  # a new minute: the guest is answered again
        llm.reply("back")
        assert await gw.local.ask("g", "question 6", **guest) == "back"
    finally:
        await gw.stop()


async def test_a_daily_cost_cap_stops_requests_and_resets_the_next_day(
        make_config: MakeConfig, llm: ScriptedLLM) -> None:
    clock = FakeClock()
    config = make_config(agent={"model": PRICED,
                                "limits": {"member": {"cost_per_day": 0.0001}}})
    one_turn = litellm_cost(PRICED, 1000, 100)
    assert one_turn > 0.0001  # one turn goes over the cap
    member: dict[str, Any] = {"sender_id": "mia", "trust": "member"}
    async with Gateway(config, grace=2.0, clock=clock) as gw:
        llm.reply("first", usage={"prompt_tokens": 1000, "completion_tokens": 100})
        assert await gw.local.ask("m", "one", **member) == "first"
        notice = await gw.local.ask("m", "two", **member)
        assert "spending for today" in notice
        assert llm.calls == 1

    async with Gateway(config, grace=2.0, clock=clock) as gw:  # the cap survives a restart
        await gw.local.inject("m", "three", **member)
        await limited(gw, 1)
        assert llm.calls == 1

        clock.advance(24 * 3600)  # the next day
        llm.reply("a new day", usage={"prompt_tokens": 10, "completion_tokens": 1})
        assert await gw.local.ask("m", "four", **member) == "a new day"
        assert llm.calls == 2


async def test_usage_shows_the_speakers_own_figures(make_config: MakeConfig,
                                                    llm: ScriptedLLM) -> None:
    async with Gateway(make_config(), grace=2.0, clock=FakeClock()) as gw:
        llm.reply("for ada", usage={"prompt_tokens": 111, "completion_tokens": 22})
        await gw.local.ask("c1", "hi", sender_id="ada", trust="member")
        llm.reply("for bob", usage={"prompt_tokens": 333, "completion_tokens": 44})
        await gw.local.ask("c1", "hi", sender_id="bob", trust="member")

        mine = await gw.local.ask("c1", "/usage", sender_id="ada", trust="member")
        assert "Your usage today (2025-01-06): 1 model call(s), 133 tokens (111 in, 22 out)" \
            in mine
        assert "333" not in mine and "Everyone" not in mine
        owner = await gw.local.ask("c1", "/usage", sender_id="boss")
        assert "Your usage in all: 0 model call(s)" in owner
        assert "Everyone today: 2 model call(s), 510 tokens (444 in, 66 out)" in owner
        assert llm.calls == 2  # /usage asks no model


async def test_parley_usage_groups_and_filters(tmp_path: Path, make_config: MakeConfig,
                                               llm: ScriptedLLM) -> None:
    config = make_config()
    async with Gateway(config, grace=2.0) as gw:
        llm.reply("a", usage={"prompt_tokens": 100, "completion_tokens": 10})
        await gw.local.ask("c1", "hi", sender_id="ada")
        llm.reply("b", usage={"prompt_tokens": 200, "completion_tokens": 20})
        await gw.local.ask("c2", "hi", sender_id="bob")
    path = tmp_path / "cli.yaml"
    path.write_text(yaml.safe_dump({"workspace": str(config.workspace_path),
                                    "data_dir": str(config.data_path),
                                    "agent": {"model": "openai/test-model"}}))
    code, out, err = await parley("usage", "--config", str(path), "--by", "person",
                                  env=_env())
    assert code == 0, err
    lines = [line for line in out.splitlines() if "local:" in line]
    assert "local:bob" in lines[0] and "200" in lines[0]  # the larger first
    assert "local:ada" in lines[1] and "100" in lines[1]
    code, out, _ = await parley("usage", "--config", str(path), "--since", "today",
                                "--chat", "local:c1", env=_env())
    assert code == 0 and "100" in out and "200" not in out
    code, _, err = await parley("usage", "--config", str(path), "--since", "last week",
                                env=_env())
    assert code != 0 and "--since" in err


async def test_owner_is_not_capped_by_overall_limits_unless_configured(
        make_config: MakeConfig, llm: ScriptedLLM) -> None:
    clock = FakeClock()
    limits = {"overall": {"messages_per_minute": 1}}
    async with Gateway(make_config(agent={"limits": limits}), grace=2.0, clock=clock) as gw:
        for i in range(3):
            llm.reply(f"owner {i}")
            assert await gw.local.ask("o", f"q{i}") == f"owner {i}"
        notice = await gw.local.ask("o", "q", sender_id="gus", trust="guest")
        assert "everyone's together" in notice
    limits = {**limits, "cap_owner": True}
    clock.advance(60)
    async with Gateway(make_config(agent={"limits": limits}), grace=2.0, clock=clock) as gw:
        llm.reply("once")
        assert await gw.local.ask("o", "q") == "once"
        assert "a minute" in await gw.local.ask("o", "q again")


async def test_a_compactions_model_call_is_in_the_ledger(make_config: MakeConfig,
                                                         llm: ScriptedLLM) -> None:
    config = make_config(agent={"context": {"compaction": {"memory_flush": False}}})
    async with Gateway(config, grace=2.0, clock=FakeClock()) as gw:
        for i in range(3):
            llm.reply(f"reply {i}", usage={"prompt_tokens": 10, "completion_tokens": 1})
            await gw.local.ask("c1", f"number {i}", sender_id="ada")
        llm.reply("SUMMARY: numbers.", usage={"prompt_tokens": 400, "completion_tokens": 50})
        assert (await gw.local.ask("c1", "/compact", sender_id="ada")).startswith("Compacted")
        assert gw.store is not None
        ada = await gw.store.usage_total(person="local:ada")
        assert (ada.calls, ada.prompt_tokens, ada.completion_tokens) == (4, 430, 53)
        assert gw.health()["usage"]["today"]["tokens"] == 483
