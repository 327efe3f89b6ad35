"""ScriptedLLM driven through the real litellm, so other tests can trust what the fake says."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

# Before the import: otherwise litellm fetches its cost map from GitHub at import time.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import litellm  # noqa: E402

from tests.fakes.openai_server import ScriptedLLM  # noqa: E402

litellm.suppress_debug_info = True  # no "Provider List" banner on every expected error

# The two warnings litellm raises itself are filtered project-wide in pyproject.toml.

MODEL = "openai/test-model"
USER = [{"role": "user", "content": "hi"}]
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


@pytest.fixture
async def llm() -> AsyncIterator[ScriptedLLM]:
    async with ScriptedLLM() as server:
        yield server


async def complete(
    llm: ScriptedLLM, messages: list[dict[str, Any]] | None = None, **kw: Any
) -> Any:
    return await litellm.acompletion(
        model=MODEL,
        api_base=llm.base_url,
        api_key="sk-test",
        messages=messages if messages is not None else USER,
        num_retries=0,
        **kw,
    )


def build(chunks: list[Any]) -> Any:
    """stream_chunk_builder, loosely typed: its union return type is not worth narrowing here."""
    built = litellm.stream_chunk_builder(chunks)
    assert built is not None
    return built


async def test_text_reply(llm: ScriptedLLM) -> None:
    llm.reply("hello there", usage={"prompt_tokens": 7, "completion_tokens": 2})

    response = await complete(llm)

    assert response.choices[0].message.content == "hello there"
    assert response.choices[0].finish_reason == "stop"
    assert response.model == "test-model"
    assert (response.usage.prompt_tokens, response.usage.completion_tokens) == (7, 2)
    assert response.usage.total_tokens == 9
    assert llm.last_request == {"model": "test-model", "messages": USER}
    assert llm.request_headers[0]["authorization"] == "Bearer sk-test"
    llm.assert_all_used()


async def test_default_usage_is_a_rough_nonzero_count(llm: ScriptedLLM) -> None:
    llm.reply("a reply long enough to count a few tokens")

    response = await complete(llm)

    assert response.usage.prompt_tokens > 0
    assert response.usage.completion_tokens > 0


async def test_tool_call_round_trip(llm: ScriptedLLM) -> None:
    llm.tool_call("get_weather", {"city": "Paris"}, call_id="call_paris").reply("Sunny.")

    first = await complete(llm, tools=[WEATHER_TOOL])
    message = first.choices[0].message
    assert first.choices[0].finish_reason == "tool_calls"
    assert message.content is None
    (call,) = message.tool_calls
    assert call.id == "call_paris"
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}

    history = [
        *USER,
        message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21C"},
    ]
    second = await complete(llm, history, tools=[WEATHER_TOOL])

    assert second.choices[0].message.content == "Sunny."
    assert llm.calls == 2
    assert llm.requests[0]["tools"] == [WEATHER_TOOL]
    sent = llm.requests[1]["messages"]
    assert sent[1]["tool_calls"][0]["id"] == "call_paris"
    assert sent[2] == {"role": "tool", "tool_call_id": "call_paris", "content": "sunny, 21C"}
    llm.assert_all_used()


async def test_several_tool_calls_get_distinct_ids(llm: ScriptedLLM) -> None:
    llm.tool_calls([("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Oslo"})])

    response = await complete(llm, tools=[WEATHER_TOOL])

    calls = response.choices[0].message.tool_calls
    assert [json.loads(c.function.arguments)["city"] for c in calls] == ["Paris", "Oslo"]
    assert len({c.id for c in calls}) == 2


async def test_streaming_text(llm: ScriptedLLM) -> None:
    llm.reply("streamed text reply")

    stream = await complete(llm, stream=True)
    chunks = [chunk async for chunk in stream]

    pieces = [
        c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content
    ]
    assert len(pieces) > 1, "the text should arrive in several deltas"
    assert "".join(pieces) == "streamed text reply"
    built = build(chunks)
    assert built.choices[0].message.content == "streamed text reply"
    assert built.choices[0].finish_reason == "stop"
    assert llm.last_request["stream"] is True


async def test_streaming_tool_call_with_usage(llm: ScriptedLLM) -> None:
    llm.tool_calls([("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Oslo"})])

    stream = await complete(
        llm, tools=[WEATHER_TOOL], stream=True, stream_options={"include_usage": True}
    )
    chunks = [chunk async for chunk in stream]

    built = build(chunks)
    assert built.choices[0].finish_reason == "tool_calls"
    calls = built.choices[0].message.tool_calls
    assert [c.function.name for c in calls] == ["get_weather", "get_weather"]
    assert [json.loads(c.function.arguments) for c in calls] == [
        {"city": "Paris"},
        {"city": "Oslo"},
    ]
    assert all(c.id for c in calls)
    assert built.usage.total_tokens > 0
    assert llm.last_request["stream_options"] == {"include_usage": True}


async def test_raw_sse_wire_format(llm: ScriptedLLM) -> None:
    """Check the bytes themselves, since litellm tolerates more than OpenAI's strict clients."""
    llm.reply("abc")
    body = {
        "model": "m",
        "messages": USER,
        "stream": True,
        "stream_options": {"include_usage": True},
    }

    async with aiohttp.ClientSession() as session:
        async with session.post(f"{llm.base_url}/chat/completions", json=body) as resp:
            assert resp.headers["Content-Type"].startswith("text/event-stream")
            text = await resp.text()

    events = text.split("\n\n")
    assert events[-2:] == ["data: [DONE]", ""]
    chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-2]]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] > 0


async def test_rate_limit_raises_with_retry_after(llm: ScriptedLLM) -> None:
    llm.error(429, "slow down", retry_after=3)

    with pytest.raises(litellm.RateLimitError) as caught:
        await complete(llm)

    error: Any = caught.value  # litellm sets litellm_response_headers without declaring it
    assert error.status_code == 429
    assert "slow down" in str(error)
    assert error.litellm_response_headers["retry-after"] == "3"
    assert llm.calls == 1, "num_retries=0 must not retry"


async def test_server_error_raises_internal_server_error(llm: ScriptedLLM) -> None:
    llm.error(500, "kaput")

    with pytest.raises(litellm.InternalServerError) as caught:
        await complete(llm)

    assert caught.value.status_code == 500
    assert llm.calls == 1


async def test_a_held_answer_that_never_comes_times_out(llm: ScriptedLLM) -> None:
    llm.hold()
    llm.reply("never sent")

    with pytest.raises(litellm.Timeout):
        await complete(llm, timeout=0.2)  # the answer never comes: only the timeout can end it

    assert llm.calls == 1
    llm.assert_all_used()


async def test_a_held_answer_waits_for_its_release(llm: ScriptedLLM) -> None:
    gate = llm.hold()
    llm.reply("held").reply("not held")

    first = asyncio.create_task(complete(llm), name="held")
    await llm.wait_in_flight(1)
    second = await complete(llm)  # the next answer is not behind the gate

    assert second.choices[0].message.content == "not held"
    assert not first.done() and llm.in_flight == 1
    gate.release()
    assert (await first).choices[0].message.content == "held"
    assert llm.in_flight == 0
    llm.assert_all_used()


async def test_one_gate_holds_concurrent_requests_until_released(llm: ScriptedLLM) -> None:
    gate = llm.hold()
    llm.echo(gate=gate)

    tasks = [asyncio.create_task(complete(llm, [{"role": "user", "content": f"n{i}"}]))
             for i in range(3)]
    await llm.wait_in_flight(3)  # all three at once: the client sent them concurrently

    assert not any(t.done() for t in tasks)
    gate.release()
    answers = await asyncio.gather(*tasks)
    assert [a.choices[0].message.content for a in answers] == ["echo: n0", "echo: n1", "echo: n2"]
    assert (await complete(llm)).choices[0].message.content == "echo: hi"  # released stays open


async def test_gate_passed_to_several_answers(llm: ScriptedLLM) -> None:
    gate = llm.hold()
    llm.tool_call("get_weather", {"city": "Oslo"}, gate=gate).error(500, gate=gate).reply("free")

    held = [asyncio.create_task(complete(llm)) for _ in range(2)]
    await llm.wait_in_flight(2)
    assert (await complete(llm)).choices[0].message.content == "free"
    gate.release()
    tool, error = await asyncio.gather(*held, return_exceptions=True)
    assert not isinstance(tool, BaseException) and tool.choices[0].message.tool_calls
    assert isinstance(error, litellm.InternalServerError)


async def test_stop_ends_held_requests_at_once() -> None:
    server = ScriptedLLM()
    await server.start()
    server.hold()
    server.reply("never sent")
    async with aiohttp.ClientSession() as session:
        request = asyncio.create_task(
            session.post(f"{server.base_url}/chat/completions", json={"model": "m"}))
        await server.wait_in_flight(1)
        async with asyncio.timeout(10):  # a safety cap: stop wakes the held handler
            await server.stop()
            response = await request
        assert response.status == 503
        response.release()


async def test_unexpected_call_is_an_error_and_recorded(llm: ScriptedLLM) -> None:
    with pytest.raises(litellm.InternalServerError, match="unexpected request"):
        await complete(llm, [{"role": "user", "content": "nobody scripted this"}])

    assert len(llm.unexpected) == 1
    with pytest.raises(AssertionError, match="nobody scripted this"):
        llm.assert_all_used()


async def test_unused_script_fails_assert_all_used(llm: ScriptedLLM) -> None:
    llm.reply("one").reply("two")
    await complete(llm)

    with pytest.raises(AssertionError, match="1 scripted answer"):
        llm.assert_all_used()


async def test_echo_reads_text_parts(llm: ScriptedLLM) -> None:
    llm.echo()
    parts = [
        {"type": "text", "text": "look at "},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
        {"type": "text", "text": "this"},
    ]

    plain = await complete(llm, [{"role": "user", "content": "ping"}])
    multi = await complete(llm, [{"role": "user", "content": parts}])

    assert plain.choices[0].message.content == "echo: ping"
    assert multi.choices[0].message.content == "echo: look at this"
    llm.assert_all_used()


async def test_script_takes_precedence_over_responder(llm: ScriptedLLM) -> None:
    async def responder(body: dict[str, Any]) -> dict[str, Any]:
        return {"tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "X"}}}]}

    llm.respond_with(responder).reply("scripted first")

    first = await complete(llm)
    second = await complete(llm)

    assert first.choices[0].message.content == "scripted first"
    (call,) = second.choices[0].message.tool_calls
    assert json.loads(call.function.arguments) == {"city": "X"}


async def test_failing_responder_fails_assert_all_used(llm: ScriptedLLM) -> None:
    def broken(body: dict[str, Any]) -> str:
        raise KeyError("missing")

    llm.respond_with(broken)
    with pytest.raises(litellm.InternalServerError, match="responder failed"):
        await complete(llm)

    with pytest.raises(AssertionError, match="KeyError"):
        llm.assert_all_used()


async def test_wait_for_requests_wakes_on_arrival(llm: ScriptedLLM) -> None:
    release = asyncio.Event()

    async def held(body: dict[str, Any]) -> str:
        await release.wait()
        return "released"

    llm.respond_with(held)
    task = asyncio.create_task(complete(llm), name="held-completion")

    await llm.wait_for_requests(1)

    assert not task.done(), "woke on the request, not on the answer"
    release.set()
    assert (await task).choices[0].message.content == "released"
    with pytest.raises(TimeoutError, match="expected 2 request"):
        await llm.wait_for_requests(2, timeout=0.05)  # the message on a hung test


async def test_many_concurrent_requests(llm: ScriptedLLM) -> None:
    llm.echo()

    answers = await asyncio.gather(
        *(complete(llm, [{"role": "user", "content": f"n{i}"}]) for i in range(100))
    )

    assert [a.choices[0].message.content for a in answers] == [f"echo: n{i}" for i in range(100)]
    assert llm.calls == 100


async def test_models_and_unversioned_path(llm: ScriptedLLM) -> None:
    llm.reply("ok")
    root = llm.base_url.removesuffix("/v1")
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{llm.base_url}/models") as resp:
            models = await resp.json()
        async with session.post(f"{root}/chat/completions", json={"model": "m"}) as resp:
            completion = await resp.json()

    assert [m["id"] for m in models["data"]] == ["test-model"]
    assert completion["choices"][0]["message"]["content"] == "ok"


async def test_explicit_start_stop_is_idempotent() -> None:
    server = ScriptedLLM()
    await server.start()
    port = server.port
    assert server.base_url == f"http://127.0.0.1:{port}/v1"
    await server.stop()
    await server.stop()

    with pytest.raises(aiohttp.ClientConnectionError):
        async with aiohttp.ClientSession() as session:
            await session.get(f"http://127.0.0.1:{port}/v1/models")
