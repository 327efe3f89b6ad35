"""The whole gateway, driven over the local channel's HTTP API, talking to the scripted model
server both ways a model is called: the direct OpenAI-compatible client (the default for
``openai/<name>`` at an ``api_base``) and litellm (``agent.transport: litellm``, the route of
every other provider). Nothing of ours is mocked."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import aiohttp
import pytest

from agent.context import LAYER_SEPARATOR, RUNTIME_TAG
from agent.provider import warm_up
from gateway.app import Gateway
from tests.conftest import MakeConfig, offered_tools
from tests.e2e.waiting import queued
from tests.fakes.openai_server import ScriptedLLM


class Client:
    """A tiny HTTP client for the local channel, as a script or curl would use it."""

    def __init__(self, session: aiohttp.ClientSession, base: str) -> None:
        self.session = session
        self.base = base
        self.after: dict[str, int] = {}

    async def post(self, chat_id: str, text: str, **extra: Any) -> str:
        body = {"chat_id": chat_id, "sender_id": "u1", "text": text, **extra}
        async with self.session.post(f"{self.base}/v1/messages", json=body) as resp:
            assert resp.status == 202, await resp.text()
            return str((await resp.json())["message_id"])

    async def replies(self, chat_id: str, n: int = 1, wait: float = 10) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        while len(out) < n:
            params = {"chat_id": chat_id, "after": str(self.after.get(chat_id, 0)),
                      "wait": str(wait)}
            async with self.session.get(f"{self.base}/v1/messages", params=params) as resp:
                data = await resp.json()
            if not data["messages"]:
                raise AssertionError(f"no reply in {wait}s; got {out}")
            out += data["messages"]
            self.after[chat_id] = data["next"]
        return out

    async def ask(self, chat_id: str, text: str, **extra: Any) -> dict[str, Any]:
        await self.post(chat_id, text, **extra)
        return (await self.replies(chat_id))[0]


@pytest.fixture(params=["auto", "litellm"], ids=["direct", "litellm"])
async def gateway(make_config: MakeConfig, request: pytest.FixtureRequest) -> Any:
    if request.param == "litellm":
        # Importing litellm takes seconds (far more on a busy machine), once per process: part
        # of setting up, not of the 10 s a test waits for the model's first request.
        await asyncio.to_thread(warm_up)
    async with Gateway(make_config(agent={"transport": request.param}), grace=2.0) as gw:
        assert gw.provider.direct("openai/test-model") is (request.param == "auto")
        yield gw


@pytest.fixture
async def client(gateway: Gateway) -> Any:
    async with aiohttp.ClientSession() as session:
        yield Client(session, gateway.local.base_url)


def system_of(request: dict[str, Any]) -> str:
    first = request["messages"][0]
    assert first["role"] == "system"
    return str(first["content"])


async def test_hello_round_trip_and_what_the_model_saw(client: Client, llm: ScriptedLLM,
                                                       gateway: Gateway) -> None:
    llm.reply("Hi! How can I help?")
    reply = await client.ask("c1", "hello")
    assert reply["text"] == "Hi! How can I help?"
    assert reply["kind"] == "reply"
    llm.assert_all_used()

    messages = llm.last_request["messages"]
    assert [m["role"] for m in messages] == ["system", "user", "user"]
    layers = system_of(llm.last_request).split(LAYER_SEPARATOR)
    heads = [layer.splitlines()[0] for layer in layers]
    assert heads == ["# Runtime", "# Soul", "# Identity", "# How to work", "# About the user",
                     "# Tool notes", "# Memory", "# Skills"]
    assert "HEARTBEAT" not in system_of(llm.last_request)
    runtime = messages[1]["content"]
    assert runtime.startswith(RUNTIME_TAG)
    for line in ("Channel: local", "Chat ID: c1", "Chat type: direct", "Sender: u1"):
        assert line in runtime
    assert messages[2] == {"role": "user", "content": "hello"}
    # the core tools in full, the rest named in one line (load_tools)
    assert offered_tools(llm.last_request, loadable=False) == {
        "read_file", "write_file", "edit_file", "list_dir", "exec", "web_fetch", "memory",
        "load_tools"}
    assert offered_tools(llm.last_request) - offered_tools(
        llm.last_request, loadable=False) == {"message", "cron", "spawn", "session_search"}


async def test_second_turn_carries_history_and_system_stays_identical(
        client: Client, llm: ScriptedLLM) -> None:
    llm.reply("first answer").reply("second answer")
    await client.ask("c1", "one")
    assert (await client.ask("c1", "two"))["text"] == "second answer"
    first, second = llm.requests
    assert system_of(first) == system_of(second)
    roles = [(m["role"], m.get("content")) for m in second["messages"][1:]]
    assert roles[:2] == [("user", "one"), ("assistant", "first answer")]
    assert roles[-1] == ("user", "two")
    assert roles[-2][1].startswith(RUNTIME_TAG)


async def test_tool_call_round_trip(client: Client, llm: ScriptedLLM, gateway: Gateway) -> None:
    llm.tool_call("write_file", {"path": "notes/todo.md", "content": "- buy milk\n"})
    llm.reply("Saved your list.")
    reply = await client.ask("c1", "save my todo list")
    assert reply["text"] == "Saved your list."
    ws = gateway.config.workspace_path
    assert (ws / "notes" / "todo.md").read_text() == "- buy milk\n"
    follow = llm.requests[1]["messages"]
    assert follow[-2]["role"] == "assistant" and follow[-2]["tool_calls"]
    assert follow[-1]["role"] == "tool"
    assert follow[-1]["tool_call_id"] == follow[-2]["tool_calls"][0]["id"]
    assert "notes/todo.md" in follow[-1]["content"]

    # The next turn's history keeps the call and its result together.
    llm.reply("ok")
    await client.ask("c1", "thanks")
    roles = [m["role"] for m in llm.last_request["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "assistant", "user", "user"]


async def test_workspace_escape_goes_back_to_the_model(client: Client, llm: ScriptedLLM) -> None:
    llm.tool_call("read_file", {"path": "../../../etc/passwd"}).reply("I can't read that.")
    await client.ask("c1", "show me /etc/passwd")
    tool_msg = llm.last_request["messages"][-1]
    assert tool_msg["role"] == "tool"
    assert "outside the workspace" in tool_msg["content"]
    assert "root:" not in tool_msg["content"]


async def test_unknown_tool_and_bad_arguments_are_errors_for_the_model(
        client: Client, llm: ScriptedLLM) -> None:
    llm.tool_calls([("no_such_tool", {}), ("read_file", {"wrong": 1}),
                    ("list_dir", {"path": ".", "bogus": True})]).reply("sorry")
    assert (await client.ask("c1", "do it"))["text"] == "sorry"
    results = [m["content"] for m in llm.last_request["messages"] if m["role"] == "tool"]
    assert "unknown tool 'no_such_tool'" in results[0]
    assert "invalid arguments for read_file" in results[1] and "path" in results[1]
    # The schemas leave additionalProperties out (tokens, and servers that refuse it); an
    # argument the tool does not take is still refused, by name.
    assert not any("additionalProperties" in t["function"]["parameters"]
                   for t in llm.last_request["tools"])
    assert "invalid arguments for list_dir" in results[2] and "bogus" in results[2]


async def test_identical_repeated_calls_are_stopped(client: Client, llm: ScriptedLLM) -> None:
    for _ in range(5):
        llm.tool_call("list_dir", {"path": "."})
    reply = await client.ask("c1", "loop forever")
    assert "repeating the same tool call" in reply["text"]
    tool_results = [m["content"] for m in llm.last_request["messages"] if m["role"] == "tool"]
    assert "already called list_dir" in tool_results[-1]
    llm.assert_all_used()


async def test_new_starts_fresh_and_keeps_the_old_session(client: Client, llm: ScriptedLLM,
                                                          gateway: Gateway) -> None:
    llm.reply("remembered")
    await client.ask("c1", "my name is Ada")
    notice = await client.ask("c1", "/new")
    assert notice["kind"] == "notice" and "new conversation" in notice["text"]
    llm.reply("who?")
    await client.ask("c1", "what is my name?")
    assert [m["role"] for m in llm.last_request["messages"]] == ["system", "user", "user"]
    assert gateway.store is not None
    sessions = await gateway.store.list_sessions(include_inactive=True)
    assert [(s.key, s.active, s.message_count) for s in sessions] == [
        ("local:c1", True, 2), ("local:c1", False, 2)]


async def test_status_and_help(client: Client, llm: ScriptedLLM) -> None:
    llm.reply("hi")
    await client.ask("c1", "hello")
    status = (await client.ask("c1", "/status"))["text"]
    assert "Model: openai/test-model" in status
    assert "Session: local:c1" in status
    assert "Messages: 2" in status
    assert "Last context:" in status and "none yet" not in status
    assert "/new" in (await client.ask("c1", "/help"))["text"]
    assert llm.calls == 1  # commands never reach the model


async def test_busy_session_collects_waiting_messages_into_one_turn(
        client: Client, llm: ScriptedLLM, gateway: Gateway) -> None:
    first = llm.hold()
    llm.reply("first").reply("about b and c")
    await client.post("c1", "a")
    await llm.wait_for_requests(1)  # "a" is running; "b" and "c" arrive meanwhile
    for text in ("b", "c"):
        await client.post("c1", text)
    await queued(gateway, "local:c1", 2)
    first.release()
    replies = await client.replies("c1", 2)
    assert [r["text"] for r in replies] == ["first", "about b and c"]
    users = [m["content"] for m in llm.last_request["messages"] if m["role"] == "user"]
    assert users[0] == "a" and users[-1] == "b\n\nc"
    llm.assert_all_used()


async def test_followup_mode_answers_each_in_order(make_config: MakeConfig,
                                                   llm: ScriptedLLM) -> None:
    first = llm.hold()
    llm.reply("first").reply("second").reply("third")
    async with Gateway(make_config(agent={"queue_mode": "followup"})) as gw:
        for text in ("a", "b", "c"):
            await gw.local.inject("c1", text)
        await llm.wait_for_requests(1)
        await queued(gw, "local:c1", 2)
        first.release()
        records: list[dict[str, Any]] = []
        while len(records) < 3:
            found, _ = await gw.local.wait_messages("c1", after=len(records), timeout=10)
            assert found, records
            records += found
    assert [r["text"] for r in records] == ["first", "second", "third"]
    users = [m["content"] for m in llm.last_request["messages"] if m["role"] == "user"]
    assert users[:2] == ["a", "b"] and users[-1] == "c"


async def test_steer_mode_hands_new_messages_to_the_running_turn(
        make_config: MakeConfig, llm: ScriptedLLM) -> None:
    call = llm.hold()
    llm.tool_call("list_dir", {"path": "."}).reply("done, with the change")
    async with Gateway(make_config(agent={"queue_mode": "steer"})) as gw:
        await gw.local.inject("c1", "list my files")
        await llm.wait_for_requests(1)
        await gw.local.inject("c1", "actually, only markdown files")
        await queued(gw, "local:c1", 1)
        call.release()
        found, _ = await gw.local.wait_messages("c1", timeout=10)
    assert [r["text"] for r in found] == ["done, with the change"]
    last = llm.last_request["messages"]
    assert last[-1]["role"] == "user"
    assert last[-1]["content"].endswith("actually, only markdown files")
    assert last[-2]["role"] == "tool"
    llm.assert_all_used()


async def test_queue_cap_folds_the_oldest_instead_of_dropping(
        make_config: MakeConfig, llm: ScriptedLLM) -> None:
    first = llm.hold()
    llm.reply("first")
    config = make_config(agent={"queue_mode": "followup", "queue_cap": 3})
    async with Gateway(config) as gw:
        await gw.local.inject("c1", "m0")
        await llm.wait_for_requests(1)
        for i in range(1, 6):
            await gw.local.inject("c1", f"m{i}")
        await queued(gw, "local:c1", 5)
        assert gw.agent is not None and gw.agent.lanes.waiting("local:c1") == 3  # folded
        llm.echo()
        first.release()
        records: list[dict[str, Any]] = []
        while len(records) < 4:
            found, _ = await gw.local.wait_messages("c1", after=len(records), timeout=10)
            assert found, records
            records += found
    texts = [r["text"] for r in records]
    assert texts[0] == "first"
    assert texts[1].startswith("echo: [3 earlier messages sent while I was busy, folded]")
    assert all(f"m{i}" in texts[1] for i in (1, 2, 3)), texts
    assert texts[2:] == ["echo: m4", "echo: m5"]


async def test_stop_cancels_the_running_turn_and_keeps_the_message(
        make_config: MakeConfig, llm: ScriptedLLM) -> None:
    llm.hold()  # never released: the model is still thinking when /stop comes
    llm.reply("too late")
    async with Gateway(make_config()) as gw:
        await gw.local.inject("c1", "write a novel")
        await llm.wait_for_requests(1)
        notice = await gw.local.ask("c1", "/stop", timeout=5)
        assert notice.startswith("Stopped.")
        assert gw.store is not None
        session = await gw.store.active_session("local:c1")
        assert session.message_count == 1  # the user's message is kept
        assert await gw.store.inbox_pending() == []  # and not answered again after a restart
        assert await gw.local.ask("c1", "/stop", timeout=5) == "Nothing is running."


async def test_sessions_run_concurrently(client: Client, llm: ScriptedLLM) -> None:
    answers = llm.hold()
    llm.echo()
    for chat in ("x", "y", "z"):
        await client.post(chat, f"hi {chat}")
    # All three asks reach the model before any is answered: in sequence, the second would
    # wait for the first answer, which is held.
    await llm.wait_in_flight(3)
    answers.release()
    for chat in ("x", "y", "z"):
        assert (await client.replies(chat))[0]["text"] == f"echo: hi {chat}"


async def test_rate_limit_is_retried(client: Client, llm: ScriptedLLM) -> None:
    llm.error(429, "slow down").error(500, "oops").reply("made it")
    assert (await client.ask("c1", "hello"))["text"] == "made it"
    assert llm.calls == 3


async def test_model_down_is_told_in_the_chat(client: Client, llm: ScriptedLLM,
                                              gateway: Gateway) -> None:
    for _ in range(4):
        llm.error(500, "internal")
    reply = await client.ask("c1", "hello")
    assert reply["kind"] == "error"
    assert "did not answer after 4 tries" in reply["text"]
    assert "Traceback" not in reply["text"]
    assert gateway.store is not None
    session = await gateway.store.active_session("local:c1")
    assert session.message_count == 1  # the user's message is kept


async def test_fallback_model_answers(make_config: MakeConfig, llm: ScriptedLLM) -> None:
    config = make_config(agent={"fallbacks": ["openai/backup-model"], "max_retries": 1})
    llm.error(503, "down").error(503, "down").reply("from backup")
    async with Gateway(config) as gw:
        assert gw.local is not None
        assert await gw.local.ask("c1", "hello") == "from backup"
    assert [r["model"] for r in llm.requests] == ["test-model", "test-model", "backup-model"]


async def test_no_api_key_says_what_to_configure(make_config: MakeConfig, llm: ScriptedLLM,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    config = make_config(agent={"api_key": "", "api_base": ""})
    async with Gateway(config) as gw:
        records = []
        await gw.local.inject("c1", "hello")
        records, _ = await gw.local.wait_messages("c1", timeout=10)
    assert records[0]["kind"] == "error"
    text = records[0]["text"]
    assert "agent.api_key" in text and "OPENAI_API_KEY" in text and "agent.api_base" in text
    assert llm.calls == 0


async def test_context_snapshot_is_recorded(client: Client, llm: ScriptedLLM,
                                            gateway: Gateway) -> None:
    llm.reply("hi")
    await client.ask("c1", "hello")
    assert gateway.store is not None
    session = await gateway.store.active_session("local:c1")
    snap = await gateway.store.latest_snapshot(session.id)
    assert snap is not None
    assert snap["session_key"] == "local:c1"
    assert list(snap["layers"])[:2] == ["identity", "SOUL.md"]
    assert snap["total_tokens"] > 0 and len(snap["hash"]) == 66


async def test_no_task_of_ours_survives_stop(make_config: MakeConfig, llm: ScriptedLLM) -> None:
    before = set(asyncio.all_tasks())
    llm.reply("hi")
    gw = Gateway(make_config())
    await gw.start()
    assert await gw.local.ask("c1", "hello") == "hi"
    await gw.stop()
    await gw.stop()  # twice is fine
    left = [t for t in asyncio.all_tasks() - before if not t.done()]
    assert left == [], [(t.get_name(), t.get_coro()) for t in left]


async def test_a_server_that_cuts_the_prompt_is_named_once(client: Client, llm: ScriptedLLM,
                                                           gateway: Gateway) -> None:
    """Ollama keeps 4,096 tokens unless told otherwise and drops the start of a longer prompt
    without a word; the usage it reports is the only sign."""
    cut = {"prompt_tokens": 700, "completion_tokens": 2, "total_tokens": 702}
    llm.reply("hi", usage=cut).reply("hi again", usage=cut)
    assert (await client.ask("c1", "hello"))["text"] == "hi"
    assert (await client.ask("c1", "hello again"))["text"] == "hi again"
    said = [e for e in gateway.health()["recent_errors"] if "cutting the prompt" in e]
    assert len(said) == 1 and "OLLAMA_CONTEXT_LENGTH" in said[0]
    sent = re.search(r"counted 700 prompt tokens where Parley sent about ([\d,]+)", said[0])
    assert sent and int(sent.group(1).replace(",", "")) > 1000  # the first hello


async def test_a_server_that_keeps_the_prompt_is_not_suspected(client: Client,
                                                               llm: ScriptedLLM,
                                                               gateway: Gateway) -> None:
    llm.reply("hi", usage={"prompt_tokens": 1700, "completion_tokens": 2, "total_tokens": 1702})
    await client.ask("c1", "hello")  # another tokenizer: within its usual difference
    assert gateway.health()["recent_errors"] == []


async def test_a_turn_leaves_no_cycle_for_the_collector(make_config: MakeConfig,
                                                       llm: ScriptedLLM) -> None:
    """A turn's objects (its context, messages, hooks, task) are freed when it ends, by
    reference counting: none of them is left in a reference cycle for Python's collector (a
    cycle kept each turn's whole graph alive until the next collection)."""
    import gc

    config = make_config()
    async with Gateway(config) as gw:
        llm.reply("warm")
        await gw.local.ask("c1", "warm up", timeout=10)
        llm.reply("one")
        llm.tool_call("list_dir", {"path": "."})
        llm.reply("listed")
        gc.collect()
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            assert await gw.local.ask("c1", "plain", timeout=10) == "one"
            assert await gw.local.ask("c1", "with a tool", timeout=10) == "listed"
            gc.collect()
            ours = sorted({f"{type(o).__module__}.{type(o).__qualname__}" for o in gc.garbage
                           if type(o).__module__.split(".")[0] in
                           ("agent", "gateway", "channels", "workspace")})
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
        assert ours == []
