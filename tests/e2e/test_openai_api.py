"""The OpenAI-compatible API, driven by the official ``openai`` client and by ``curl``: the
whole gateway behind it (inbox, agent, tools, outbox) talks to the scripted model server.
Nothing of ours is mocked."""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import openai
import pytest

from channels.openai_api import OpenAIChannel
from gateway.app import Gateway
from gateway.kernel.config import ConfigError, parse_config
from tests.conftest import MakeConfig
from tests.e2e.waiting import until
from tests.fakes.openai_server import Gate, ScriptedLLM

TOKEN = "sk-parley-test"


@pytest.fixture
async def gateway(make_config: MakeConfig) -> AsyncIterator[Gateway]:
    config = make_config(channels={"openai": {"enabled": True, "port": 0, "token": TOKEN}},
                         agent={"models": {"aliases": {"fast": {"model": "openai/test-fast"}}}})
    async with Gateway(config, grace=2.0) as gw:
        yield gw


def api_of(gw: Gateway) -> OpenAIChannel:
    channel = gw.manager.channels["openai"]
    assert isinstance(channel, OpenAIChannel)
    return channel


@pytest.fixture
async def client(gateway: Gateway) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=api_of(gateway).base_url, api_key=TOKEN,
                                  max_retries=0, timeout=30) as c:
        yield c


async def stored(gw: Gateway, key: str) -> list[tuple[str, Any]]:
    assert gw.store is not None
    session = await gw.store.active_session(key)
    return [(m.role, m.body.get("content")) async for m in gw.store.all_messages(session.id)]


def user_texts(rows: list[tuple[str, Any]]) -> list[Any]:
    return [content for role, content in rows if role == "user"
            and not str(content).startswith("[Runtime")]


async def test_two_turns_keep_their_session_and_resent_history_is_not_duplicated(
        client: openai.AsyncOpenAI, llm: ScriptedLLM, gateway: Gateway) -> None:
    llm.reply("Nice to meet you, Ada.").reply("Your name is Ada.")
    history: list[Any] = [{"role": "system", "content": "You are helpful."},
                          {"role": "user", "content": "I am Ada."}]
    first = await client.chat.completions.create(model="parley", messages=history, user="ada")
    assert first.object == "chat.completion"
    assert first.choices[0].message.content == "Nice to meet you, Ada."
    assert first.choices[0].finish_reason == "stop"
    # The client resends the whole conversation, as the protocol asks of it.
    history += [{"role": "assistant", "content": first.choices[0].message.content},
                {"role": "user", "content": "What is my name?"}]
    second = await client.chat.completions.create(model="parley", messages=history, user="ada")
    assert second.choices[0].message.content == "Your name is Ada."

    # The model saw the first turn once, from Parley's own history.
    seen = [(m["role"], m.get("content")) for m in llm.requests[1]["messages"][1:]]
    assert seen.count(("user", "I am Ada.")) == 1
    assert ("assistant", "Nice to meet you, Ada.") in seen
    assert all(m.get("content") != "You are helpful." for m in llm.requests[1]["messages"])
    rows = await stored(gateway, "openai:ada")
    assert user_texts(rows) == ["I am Ada.", "What is my name?"]
    assert [c for r, c in rows if r == "assistant"] == ["Nice to meet you, Ada.",
                                                         "Your name is Ada."]


async def test_the_session_header_wins_and_sessions_stay_apart(
        client: openai.AsyncOpenAI, llm: ScriptedLLM, gateway: Gateway) -> None:
    llm.reply("one").reply("two")
    await client.chat.completions.create(
        model="parley", messages=[{"role": "user", "content": "in a"}], user="ignored",
        extra_headers={"X-Parley-Session": "sess-a"})
    await client.chat.completions.create(
        model="fast", messages=[{"role": "user", "content": [{"type": "text", "text": "in b"}]}])
    assert user_texts(await stored(gateway, "openai:sess-a")) == ["in a"]
    assert user_texts(await stored(gateway, "openai:default")) == ["in b"]


async def test_a_tool_call_runs(client: openai.AsyncOpenAI, llm: ScriptedLLM,
                                gateway: Gateway) -> None:
    llm.tool_call("write_file", {"path": "notes/todo.md", "content": "- buy milk\n"})
    llm.reply("Saved your list.")
    answer = await client.chat.completions.create(
        model="parley", messages=[{"role": "user", "content": "save my todo list"}])
    assert answer.choices[0].message.content == "Saved your list."
    assert (gateway.config.workspace_path / "notes/todo.md").read_text() == "- buy milk\n"
    tools = {t["function"]["name"] for t in llm.requests[0]["tools"]}
    assert "exec" in tools  # the token's holder counts as the owner


@pytest.mark.parametrize("stream", [False, True])
async def test_an_answer_sent_by_the_message_tool_answers_the_request(
        client: openai.AsyncOpenAI, llm: ScriptedLLM, gateway: Gateway, stream: bool) -> None:
    """The agent answers through ``message`` (the current chat) instead of its final reply:
    the request gets that message, not a timeout."""
    llm.tool_call("load_tools", {"names": ["message"]})
    llm.tool_call("message", {"text": "Here it is, sent myself."})
    llm.reply("(sent above)")
    asked = [{"role": "user", "content": "send it"}]
    if stream:
        chunks = [c async for c in await client.chat.completions.create(
            model="parley", messages=asked, user="m", stream=True)]
        text = "".join(c.choices[0].delta.content or "" for c in chunks)
    else:
        answer = await client.chat.completions.create(model="parley", messages=asked, user="m")
        text = answer.choices[0].message.content or ""
    assert text == "Here it is, sent myself."


async def test_streamed_chunks_concatenate_to_the_stored_answer(
        client: openai.AsyncOpenAI, llm: ScriptedLLM, gateway: Gateway) -> None:
    text = "A long answer, " * 20 + "with **markdown** and ünïcödé."
    llm.reply(text)
    stream = await client.chat.completions.create(
        model="parley", messages=[{"role": "user", "content": "tell me"}], user="s", stream=True)
    chunks = [c async for c in stream]
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert len({c.id for c in chunks}) == 1
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices[0].finish_reason == "stop"
    pieces = [c.choices[0].delta.content or "" for c in chunks]
    assert "".join(pieces) == text  # text that came at once may go out as one piece
    rows = await stored(gateway, "openai:s")
    assert [c for r, c in rows if r == "assistant"] == [text]


async def test_curl_streams_server_sent_events(llm: ScriptedLLM, gateway: Gateway) -> None:
    curl = shutil.which("curl")
    if curl is None:
        pytest.fail("curl is not installed (apt-get install curl)")
    llm.reply("Streamed over curl, piece by piece.")
    body = json.dumps({"model": "parley", "stream": True, "user": "curl",
                       "messages": [{"role": "user", "content": "hi"}]})
    proc = await asyncio.create_subprocess_exec(
        curl, "-sS", "-N", "--max-time", "30", f"{api_of(gateway).base_url}/chat/completions",
        "-H", f"Authorization: Bearer {TOKEN}", "-H", "Content-Type: application/json",
        "-d", body, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await proc.communicate()
    assert proc.returncode == 0, err
    events = [line.removeprefix("data: ") for line in out.decode().split("\n\n") if line]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert text == "Streamed over curl, piece by piece."
    assert [c for r, c in await stored(gateway, "openai:curl") if r == "assistant"] == [text]


async def test_models_lists_the_aliases(client: openai.AsyncOpenAI) -> None:
    models = await client.models.list()
    assert [m.id for m in models.data] == ["parley", "fast"]


async def test_wrong_token_is_401_and_bad_requests_name_the_field(
        gateway: Gateway, llm: ScriptedLLM) -> None:
    base = api_of(gateway).base_url
    async with openai.AsyncOpenAI(base_url=base, api_key="sk-wrong", max_retries=0) as wrong:
        with pytest.raises(openai.AuthenticationError) as caught:
            await wrong.chat.completions.create(
                model="parley", messages=[{"role": "user", "content": "hi"}])
    assert caught.value.status_code == 401
    assert caught.value.code == "invalid_api_key"
    async with openai.AsyncOpenAI(base_url=base, api_key=TOKEN, max_retries=0) as c:
        with pytest.raises(openai.NotFoundError) as missing:
            await c.chat.completions.create(
                model="gpt-9", messages=[{"role": "user", "content": "hi"}])
        assert missing.value.code == "model_not_found"
        with pytest.raises(openai.BadRequestError) as bad:
            await c.chat.completions.create(
                model="parley", messages=[{"role": "user", "content": "hi"},
                                          {"role": "assistant", "content": "hello"}])
        assert "messages[1].role" in bad.value.message
    assert llm.requests == []  # nothing refused reached the model


async def test_a_failed_turn_is_an_error_answer_not_retried(
        client: openai.AsyncOpenAI, llm: ScriptedLLM, gateway: Gateway) -> None:
    for _ in range(6):
        llm.error(400, "the model refuses")
    with pytest.raises(openai.APIStatusError) as caught:
        await client.chat.completions.create(
            model="parley", messages=[{"role": "user", "content": "hi"}], user="f")
    assert caught.value.status_code == 502
    assert caught.value.response.headers["x-should-retry"] == "false"


def test_a_bind_beyond_loopback_needs_a_token() -> None:
    with pytest.raises(ConfigError, match=r"channels\.openai.*token is required"):
        parse_config({"channels": {"openai": {"enabled": True, "host": "0.0.0.0"}}}, env={})
    parse_config({"channels": {"openai": {"host": "0.0.0.0", "token": "t"}}}, env={})


async def test_bad_requests_get_openai_errors_naming_the_field(gateway: Gateway,
                                                              llm: ScriptedLLM) -> None:
    base = api_of(gateway).base_url
    auth = {"Authorization": f"Bearer {TOKEN}"}
    cases = [
        (b"{not json", {}, 400, "body: not valid JSON"),
        (json.dumps({"model": "parley"}).encode(), {}, 400, "messages: required"),
        (json.dumps({"model": "parley", "user": "a b", "messages": [
            {"role": "user", "content": "hi"}]}).encode(), {}, 400, "user: a session id"),
        (json.dumps({"model": "parley", "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "http://x"}}]}]}).encode(), {}, 400,
         "messages[0].content[0]: only text parts"),
        (json.dumps({"model": "parley", "stream": "yes", "messages": [
            {"role": "user", "content": "hi"}]}).encode(), {}, 400, "stream: expected bool"),
        (json.dumps({"model": "parley", "tools": [{"type": "function"}], "messages": [
            {"role": "user", "content": "hi"}]}).encode(), {}, 400, "tools: not taken"),
    ]
    async with aiohttp.ClientSession() as session:
        for body, headers, status, message in cases:
            async with session.post(f"{base}/chat/completions", data=body,
                                    headers={**auth, **headers}) as resp:
                data = await resp.json()
                assert resp.status == status, data
                assert data["error"]["message"].startswith(message), data
                assert data["error"]["type"] == "invalid_request_error"
        async with session.get(f"{base}/chat/completions", headers=auth) as resp:
            assert resp.status == 405
            assert (await resp.json())["error"]["message"] == "method not allowed"
        async with session.get(f"{base}/models") as resp:  # no token
            assert resp.status == 401
            assert resp.headers["WWW-Authenticate"] == "Bearer"
    assert llm.requests == []


async def test_a_configured_trust_level_limits_the_tools(make_config: MakeConfig,
                                                         llm: ScriptedLLM) -> None:
    config = make_config(channels={"openai": {"enabled": True, "port": 0, "trust": "guest",
                                              "sender_id": "scripts"}})
    llm.reply("hello, guest")
    async with Gateway(config, grace=2.0) as gw:
        async with openai.AsyncOpenAI(base_url=api_of(gw).base_url, api_key="unused",
                                      max_retries=0) as c:
            answer = await c.chat.completions.create(
                model="parley", messages=[{"role": "user", "content": "hi"}])
    assert answer.choices[0].message.content == "hello, guest"
    tools = {t["function"]["name"] for t in llm.requests[0].get("tools") or []}
    assert "exec" not in tools and "write_file" not in tools
    assert "Sender: scripts" in llm.requests[0]["messages"][-2]["content"]


async def test_requests_of_one_session_take_turns(client: openai.AsyncOpenAI, llm: ScriptedLLM,
                                                  gateway: Gateway) -> None:
    """Two requests at once in one session are two turns, in order, each with its answer
    (never merged into one turn by the lanes)."""
    gate = llm.hold()
    llm.reply("first answer").reply("second answer")

    def ask(text: str) -> Any:
        return asyncio.ensure_future(client.chat.completions.create(
            model="parley", messages=[{"role": "user", "content": text}], user="busy"))

    first = ask("one")
    await llm.wait_in_flight(1)
    second = ask("two")
    await until(lambda: api_of(gateway).status().detail["queued"] == 1,
                "the second request waiting for the first one's turn")
    gate.release()
    assert (await first).choices[0].message.content == "first answer"
    assert (await second).choices[0].message.content == "second answer"
    assert user_texts(await stored(gateway, "openai:busy")) == ["one", "two"]


async def test_a_failed_streamed_turn_is_an_error_answer(client: openai.AsyncOpenAI,
                                                          llm: ScriptedLLM) -> None:
    for _ in range(6):
        llm.error(400, "the model refuses")
    with pytest.raises(openai.APIStatusError) as caught:
        await client.chat.completions.create(
            model="parley", messages=[{"role": "user", "content": "hi"}], stream=True)
    assert caught.value.status_code == 502


# --- live streaming (the turn's text while the model writes it) ----------------------------

def texts(chunks: list[Any]) -> str:
    return "".join(c.choices[0].delta.content or "" for c in chunks)


async def first_text(client: openai.AsyncOpenAI, user: str,
                     text: str) -> tuple[Any, list[Any]]:
    """A streamed request, read up to its first chunk with text: the stream and the chunks."""
    stream = await client.chat.completions.create(
        model="parley", messages=[{"role": "user", "content": text}], user=user, stream=True)
    chunks = []
    async for c in stream:
        chunks.append(c)
        if texts(chunks):
            break
    return stream, chunks


async def test_the_first_chunk_arrives_while_the_model_still_writes(
        client: openai.AsyncOpenAI, llm: ScriptedLLM, gateway: Gateway) -> None:
    rest = Gate()
    text = "Hello there, general Kenobi."
    llm.reply(text, pieces=["Hello ", "there, ", "general Kenobi."], pauses={2: rest})
    stream, chunks = await first_text(client, "live", "hi")
    assert texts(chunks) == "Hello"  # trailing space waits for the text after it
    assert llm.in_flight == 1 and not rest.released  # the model is still writing
    rest.release()
    chunks += [c async for c in stream]
    assert texts(chunks) == text
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert [c for r, c in await stored(gateway, "openai:live") if r == "assistant"] == [text]


async def test_a_tool_call_between_streamed_text_still_runs(
        client: openai.AsyncOpenAI, llm: ScriptedLLM, gateway: Gateway) -> None:
    rest = Gate()
    llm.tool_call("write_file", {"path": "notes/a.md", "content": "x\n"})
    llm.reply("Saved it for you.", pieces=["Saved ", "it for you."], pauses={2: rest})
    stream, chunks = await first_text(client, "tool", "save")
    assert texts(chunks) == "Saved"
    assert llm.in_flight == 1  # the second model call, still writing
    rest.release()
    chunks += [c async for c in stream]
    assert texts(chunks) == "Saved it for you."
    assert (gateway.config.workspace_path / "notes/a.md").read_text() == "x\n"
    assert [c for r, c in await stored(gateway, "openai:tool")
            if r == "assistant" and c] == ["Saved it for you."]


async def test_text_taken_back_after_it_was_sent_stays_and_the_answer_follows_whole(
        client: openai.AsyncOpenAI, llm: ScriptedLLM, gateway: Gateway) -> None:
    """Words the model wrote before a tool call went out already: they stay, a blank line,
    then the stored answer whole (the documented rule; a client cannot un-see text)."""
    held = Gate()
    llm.tool_call("list_dir", {"path": "."}, text="Let me look.", pauses={1: held})
    llm.reply("Two files.")
    stream, chunks = await first_text(client, "back", "what is here")
    assert texts(chunks) == "Let me look."
    held.release()
    chunks += [c async for c in stream]
    assert texts(chunks) == "Let me look.\n\nTwo files."
    assert chunks[-1].choices[0].finish_reason == "stop"
    assistant = [c for r, c in await stored(gateway, "openai:back") if r == "assistant"]
    assert assistant == ["Let me look.", "Two files."]  # the answer is the last one


async def test_a_command_streams_its_stored_reply(client: openai.AsyncOpenAI,
                                                  llm: ScriptedLLM) -> None:
    stream = await client.chat.completions.create(
        model="parley", messages=[{"role": "user", "content": "/help"}], stream=True)
    assert "/status" in texts([c async for c in stream])
    assert llm.requests == []
