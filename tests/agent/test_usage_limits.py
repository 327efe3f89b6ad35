"""Prices (config, litellm's bundled map, nothing) and which limits hold for whom."""

from __future__ import annotations

from pathlib import Path

from agent.limits import Limits
from agent.llm_types import LLMResponse
from agent.usage import ALL, Ledger, Prices
from gateway.kernel.config import parse_config
from gateway.kernel.config_usage import LimitsConfig, UsageConfig
from gateway.kernel.events import InboundMessage, Trust
from gateway.kernel.store import Store
from tests.fakes.clock import FakeClock


def response(target: str, model: str, prompt: int = 1_000_000,
             completion: int = 1_000_000) -> LLMResponse:
    return LLMResponse(content="x", tool_calls=(), model=model, finish_reason="stop",
                       prompt_tokens=prompt, completion_tokens=completion, latency_ms=1.0,
                       target=target)


def test_prices_come_from_config_then_the_bundled_map_then_nothing() -> None:
    import litellm

    prices = Prices(UsageConfig.model_validate(
        {"prices": {"openai/llama3": {"input": 0.5, "output": 1.5},
                    "gpt-4o": {"input": 1, "output": 2}}}))
    assert prices.cost(response("openai/llama3", "llama3")) == 2.0
    assert prices.cost(response("openai/gpt-4o", "gpt-4o-2024-08-06")) == 3.0  # bare name
    known = litellm.model_cost["gpt-4o-mini"]
    assert prices.cost(response("openai/gpt-4o-mini", "gpt-4o-mini", 1000, 10)) == \
        1000 * known["input_cost_per_token"] + 10 * known["output_cost_per_token"]
    assert prices.cost(response("openai/my-local-model", "my-local-model")) == 0.0
    # A target the map lacks, answered by a model it knows (a proxy's alias): the server's.
    assert prices.cost(response("openai/company-alias", "gpt-4o-mini", 1000, 0)) == \
        1000 * known["input_cost_per_token"]


def msg(trust: Trust, sender: str = "u1", chat: str = "c1") -> InboundMessage:
    return InboundMessage(channel="telegram", chat_id=chat, sender_id=sender, text="hi",
                          trust=trust)


async def test_which_limits_hold_for_whom(tmp_path: Path) -> None:
    config = LimitsConfig.model_validate({
        "guest": {"messages_per_minute": 3},
        "people": {"telegram:vip": {"messages_per_minute": 30, "cost_per_day": 1}},
        "chats": {"telegram:c1": {"tokens_per_day": 1000}},
        "overall": {"cost_per_day": 5}})
    store = await Store.open(tmp_path / "db.sqlite")
    try:
        cfg = parse_config({"workspace": str(tmp_path / "ws")}, env={})
        ledger = Ledger(store=store, clock=FakeClock(), timezone="UTC",
                        config=cfg.agent.usage)
        limits = Limits(config, ledger, store)
        scopes = dict(limits.applicable(msg("guest")))
        assert set(scopes) == {"person:telegram:u1", "chat:telegram:c1", ALL}
        vip = dict(limits.applicable(msg("guest", "vip")))["person:telegram:vip"]
        assert (vip.messages_per_minute, vip.cost_per_day) == (30, 1)
        assert limits.applicable(msg("member", chat="c2")) == [(ALL, config.overall)]
        assert limits.applicable(msg("owner")) == []  # never capped unless configured
        capped = Limits(config.model_copy(update={"cap_owner": True}), ledger, store)
        assert {s for s, _ in capped.applicable(msg("owner"))} == {"chat:telegram:c1", ALL}

        for _ in range(3):
            assert await limits.check(msg("guest")) is None
        verdict = await limits.check(msg("guest"))
        assert verdict is not None and verdict.limit == "messages_per_minute"
        assert await limits.check(msg("guest", "u2")) is None  # each guest on their own
        assert await limits.first_notice(verdict)
        assert not await limits.first_notice(verdict)
        again = Limits(config, ledger, store)  # a fresh process: the database remembers
        assert not await again.first_notice(verdict)
    finally:
        await store.close()
