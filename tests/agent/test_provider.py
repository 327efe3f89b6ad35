"""Provider against the scripted server, through the real litellm and through the direct
OpenAI-compatible client (``agent/openai_http.py``): every behaviour test runs on both."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from agent.errors import (
    ProviderAuthError,
    ProviderBadRequest,
    ProviderContextTooLarge,
    ProviderNotConfigured,
    ProviderUnavailable,
)
from agent.provider import Provider
from gateway.kernel.config import AgentConfig, parse_config
from tests.fakes.openai_server import ScriptedLLM

HELLO = [{"role": "user", "content": "hello"}]
ROOT = Path(__file__).resolve().parents[2]


MakeProvider = Callable[..., Provider]


@pytest.fixture(params=["auto", "litellm"], ids=["direct", "litellm"])
async def provider(llm: ScriptedLLM, request: pytest.FixtureRequest
                   ) -> AsyncIterator[MakeProvider]:
    made: list[Provider] = []

    def make(**kw: object) -> Provider:
        p = Provider(AgentConfig.model_validate({
            "model": "openai/test-model", "api_base": llm.base_url, "api_key": "sk-test",
            "retry_backoff": 0.001, "timeout": 5, "transport": request.param, **kw}))
        assert p.direct("openai/test-model") is (request.param == "auto")
        made.append(p)
        return p

    yield make
    for p in made:
        await p.aclose()


async def test_text_answer_with_usage(llm: ScriptedLLM, provider: MakeProvider) -> None:
    llm.reply("hi", usage={"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14})
    r = await provider().complete(HELLO)
    assert (r.content, r.prompt_tokens, r.completion_tokens, r.attempts) == ("hi", 11, 3, 1)
    assert llm.last_request["messages"] == HELLO
    assert llm.request_headers[0]["authorization"] == "Bearer sk-test"


@pytest.mark.parametrize("stream", [False, True])
async def test_tool_calls_plain_and_streamed(llm: ScriptedLLM, provider: MakeProvider, stream: bool
        ) -> None:
    llm.tool_calls([("read_file", {"path": "a.md"}), ("list_dir", {})])
    r = await provider(stream=stream).complete(HELLO, tools=[{
        "type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}])
    assert [(c.name, c.arguments) for c in r.tool_calls] == [
        ("read_file", '{"path": "a.md"}'), ("list_dir", "{}")]
    assert all(c.id for c in r.tool_calls)
    assert llm.last_request.get("stream", False) is stream
    if stream:
        assert llm.last_request["stream_options"] == {"include_usage": True}
        assert r.prompt_tokens > 0


async def test_streamed_text(llm: ScriptedLLM, provider: MakeProvider) -> None:
    llm.reply("a longer streamed answer")
    r = await provider(stream=True).complete(HELLO)
    assert r.content == "a longer streamed answer" and not r.tool_calls


@pytest.mark.parametrize("stream", [False, True])
async def test_reasoning_is_not_part_of_the_answer(llm: ScriptedLLM, provider: MakeProvider,
                                                  stream: bool) -> None:
    """Local reasoning models write <think>…</think> into the answer (Ollama, llama.cpp)."""
    llm.reply("<think>The user greets me. I should greet back.</think>\n\nHello!")
    llm.reply("they greeted; the template opened the tag</think>Hi again.")
    llm.reply("<think>so much to consider, and then the length limit")
    p = provider(stream=stream)
    assert (await p.complete(HELLO)).content == "Hello!"
    assert (await p.complete(HELLO)).content == "Hi again."
    assert (await p.complete(HELLO)).content is None  # all reasoning: an empty answer
    llm.reply("Wrap it in <think> and </think> tags, like HTML.")
    assert (await p.complete(HELLO)).content == \
        "Wrap it in <think> and </think> tags, like HTML."


async def test_retries_then_succeeds(llm: ScriptedLLM, provider: MakeProvider) -> None:
    llm.error(429).error(500).error(503).reply("ok")
    r = await provider(max_retries=3).complete(HELLO)
    assert (r.content, r.attempts, llm.calls) == ("ok", 4, 4)


async def test_retry_after_is_read_from_a_429(llm: ScriptedLLM, provider: MakeProvider) -> None:
    llm.error(429, retry_after=7)
    with pytest.raises(ProviderUnavailable) as info:
        await provider(max_retries=0).complete(HELLO)
    assert info.value.retry_after == 7.0
    assert provider()._backoff(1, 7.0) == 7.0
    assert provider()._backoff(1, 3600.0) == 60.0


async def test_timeout_is_retried_then_reported(llm: ScriptedLLM, provider: MakeProvider) -> None:
    held = llm.hold()  # never released: neither try gets an answer before its timeout
    llm.reply("late", gate=held).reply("late", gate=held)
    with pytest.raises(ProviderUnavailable) as info:
        await provider(max_retries=1, timeout=0.2).complete(HELLO)
    assert info.value.attempts == 2 and "timed out" in str(info.value)
    assert "2 tries" in info.value.user_message


async def test_auth_and_bad_request_are_not_retried(llm: ScriptedLLM, provider: MakeProvider
        ) -> None:
    llm.error(401, "bad key")
    with pytest.raises(ProviderAuthError):
        await provider().complete(HELLO)
    llm.error(400, "messages: invalid")
    with pytest.raises(ProviderBadRequest):
        await provider().complete(HELLO)
    assert llm.calls == 2


async def test_fallbacks_in_order(llm: ScriptedLLM, provider: MakeProvider) -> None:
    llm.error(500).error(500).reply("third")
    p = provider(max_retries=0, fallbacks=["openai/second", "openai/third"])
    assert (await p.complete(HELLO)).content == "third"
    assert [r["model"] for r in llm.requests] == ["test-model", "second", "third"]


async def test_a_fallback_on_another_server_uses_its_own_key(llm: ScriptedLLM,
                                                              provider: MakeProvider) -> None:
    async with ScriptedLLM() as other:
        llm.error(500)
        other.reply("from the other server")
        p = provider(max_retries=0, fallbacks=[
            {"model": "openai/other", "api_base": other.base_url, "api_key": "sk-other"}])
        assert (await p.complete(HELLO)).content == "from the other server"
        assert other.last_request["model"] == "other"
        assert other.request_headers[0]["authorization"] == "Bearer sk-other"
        assert llm.request_headers[0]["authorization"] == "Bearer sk-test"


def test_a_fallback_without_api_base_is_the_providers_own(monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    p = Provider(AgentConfig.model_validate({
        "model": "openai/local", "api_base": "http://127.0.0.1:9/v1",
        "fallbacks": ["openai/same-server", {"model": "openai/gpt-4o-mini"}]}))
    assert [(t.model, t.api_base, t.http is not None) for t in p.targets] == [
        ("openai/local", "http://127.0.0.1:9/v1", True),
        ("openai/same-server", "http://127.0.0.1:9/v1", True),
        ("openai/gpt-4o-mini", None, False)]
    assert p.targets[0].http is p.targets[1].http  # one connection pool per server
    assert p.needs_litellm and p.configuration_problem() is None  # the local one works


def test_missing_key_names_what_to_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    p = Provider(AgentConfig(model="anthropic/claude-sonnet-4-5"))
    problem = p.configuration_problem()
    assert problem and "ANTHROPIC_API_KEY" in problem and "agent.api_key" in problem
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-x")
    assert p.configuration_problem() is None


def test_missing_key_names_the_config_variables_unset_here(monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    """The config ``make run`` writes reads the model from ``${PARLEY_MODEL:-…}`` and its key
    from ``${PARLEY_API_KEY:-}``: a shell without them gets the default model and no key, and
    the message says which variables this config wanted."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    config = parse_config({"agent": {"model": "${PARLEY_MODEL:-openai/gpt-4o-mini}",
                                     "api_key": "${PARLEY_API_KEY:-}",
                                     "api_base": "${PARLEY_API_BASE:-}"}}, env={})
    problem = Provider(config.agent).configuration_problem()
    assert problem and "OPENAI_API_KEY" in problem
    assert ("This config reads agent.model from $PARLEY_MODEL, agent.api_key from "
            "$PARLEY_API_KEY, agent.api_base from $PARLEY_API_BASE, not set here") in problem
    given = parse_config({"agent": {"model": "${PARLEY_MODEL:-openai/gpt-4o-mini}",
                                    "api_key": "${PARLEY_API_KEY:-}"}},
                         env={"PARLEY_MODEL": "anthropic/claude-sonnet-4-5"})
    assert given.agent.model == "anthropic/claude-sonnet-4-5"
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    problem = Provider(given.agent).configuration_problem()
    assert problem and "agent.api_key from $PARLEY_API_KEY" in problem
    assert "PARLEY_MODEL" not in problem  # set: nothing to say about it


async def test_not_configured_raises_without_calling(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(ProviderNotConfigured) as info:
        await Provider(AgentConfig(model="openai/gpt-4o-mini")).complete(HELLO)
    assert "OPENAI_API_KEY" in info.value.user_message


def test_only_provider_imports_litellm() -> None:
    offenders = []
    for pkg in ("gateway", "channels", "agent", "workspace"):
        for path in (ROOT / pkg).rglob("*.py"):
            text = path.read_text()
            if re.search(r"^\s*(import|from) litellm\b", text, re.M) and \
                    path.relative_to(ROOT).as_posix() != "agent/provider.py":
                offenders.append(str(path))
    assert offenders == []


def test_starting_the_gateway_modules_does_not_import_litellm() -> None:
    code = ("import sys, gateway.app, gateway.cli, agent.loop, channels.local; "
            "print('litellm' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, check=True)
    assert out.stdout.strip() == "False"


async def test_failures_name_their_cause(llm: ScriptedLLM, provider: MakeProvider) -> None:
    llm.error(429).error(429)
    with pytest.raises(ProviderUnavailable) as limited:
        await provider(max_retries=1).complete(HELLO)
    assert "rate limiting" in limited.value.user_message
    assert "2 tries" in limited.value.user_message
    llm.error(400, "This model's maximum context length is 8192 tokens. However, your "
                   "messages resulted in 9000 tokens.")
    with pytest.raises(ProviderContextTooLarge) as too_large:
        await provider().complete(HELLO)
    assert "context window" in too_large.value.user_message
    assert "/new" in too_large.value.user_message


@pytest.mark.parametrize("transport", ["auto", "litellm"])
async def test_unreachable_server_is_named(transport: str) -> None:
    p = Provider(AgentConfig.model_validate({
        "model": "openai/test-model", "api_base": "http://127.0.0.1:9/v1", "api_key": "k",
        "max_retries": 0, "transport": transport}))
    with pytest.raises(ProviderUnavailable) as info:
        await p.complete(HELLO)
    await p.aclose()
    assert "could not be reached" in info.value.user_message


async def test_a_key_quoted_in_an_error_is_not_repeated(llm: ScriptedLLM,
                                                        provider: MakeProvider) -> None:
    llm.error(401, "invalid api key 'sk-test' for this proxy")
    with pytest.raises(ProviderAuthError) as info:
        await provider().complete(HELLO)
    assert "sk-test" not in str(info.value) and "sk-test" not in info.value.user_message
    assert "[key]" in str(info.value)
