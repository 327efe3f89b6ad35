"""ContextBuilder's history: whole turns kept in order, trimming within the budget (oldest
turns first, old tool results shortened, the current message always kept) and a deterministic
snapshot.

Split from ``test_context.py`` (system prompt, runtime block, media), whose builders and
inbound messages these tests share.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from agent.budget import TokenCounter
from agent.context import RUNTIME_TAG, ContextBuilder
from gateway.kernel.store import StoredMessage
from tests.agent.test_context import HINTS, inbound, make_builder, write_workspace


@pytest.fixture(scope="module")
def counter() -> TokenCounter:
    return TokenCounter("openai/test-model")


def stored(counter: TokenCounter, bodies: list[dict[str, Any]]) -> list[StoredMessage]:
    return [StoredMessage(i, f"turn{i}", b["role"], b, counter.count_message(b))
            for i, b in enumerate(bodies, 1)]


def tool_turn(n: int, result: str = "a.txt\nb.txt") -> list[dict[str, Any]]:
    call = f"call_{n}"
    return [
        {"role": "user", "content": f"turn {n}: list the files"},
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": call, "type": "function",
            "function": {"name": "list_dir", "arguments": "{\"path\": \".\"}"}}]},
        {"role": "tool", "tool_call_id": call, "name": "list_dir", "content": result},
        {"role": "assistant", "content": f"turn {n}: here they are"},
    ]


def chat_turn(n: int, words: int = 5) -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"turn {n}: " + "question " * words},
            {"role": "assistant", "content": f"turn {n}: " + "answer " * words}]


def history_part(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages between the system prompt and the runtime block."""
    assert messages[0]["role"] == "system"
    assert messages[-2]["content"].startswith(RUNTIME_TAG)
    return messages[1:-2]


def assert_whole_turns(kept: list[dict[str, Any]]) -> None:
    """Starts at a user message; every tool call has its result and every result its call."""
    if not kept:
        return
    assert kept[0]["role"] == "user"
    calls = {c["id"] for m in kept for c in m.get("tool_calls") or ()}
    results = {m["tool_call_id"] for m in kept if m["role"] == "tool"}
    assert calls == results


# history and budget -------------------------------------------------------------------------

def test_history_keeps_whole_turns_in_order(tmp_path: Path, counter: TokenCounter) -> None:
    builder = make_builder(tmp_path, counter)
    bodies = tool_turn(1) + chat_turn(2)
    built = builder.build(inbound=inbound(), history=stored(counter, bodies), hints=HINTS)
    assert history_part(built.messages) == bodies
    assert built.snapshot["trimmed"] == []
    assert built.snapshot["sources"]["history_kept"] == len(bodies)


def test_history_never_starts_with_an_orphan(tmp_path: Path, counter: TokenCounter) -> None:
    """A window cut by max_recent_messages may start inside a turn: that part is dropped."""
    builder = make_builder(tmp_path, counter)
    bodies = tool_turn(1)[2:] + chat_turn(2)  # starts with a tool result, then an assistant
    built = builder.build(inbound=inbound(), history=stored(counter, bodies), hints=HINTS)
    kept = history_part(built.messages)
    assert kept == chat_turn(2)
    assert built.snapshot["trimmed"] == [
        "dropped 2 message(s) of a turn cut by max_recent_messages"]

    only_assistant = stored(counter, [{"role": "assistant", "content": "dangling"}])
    built = builder.build(inbound=inbound(), history=only_assistant, hints=HINTS)
    assert history_part(built.messages) == []


def _base_tokens(tmp_path: Path, counter: TokenCounter, **context: Any) -> int:
    builder = make_builder(tmp_path, counter, **context)
    return builder.build(inbound=inbound(), history=[], hints=HINTS).snapshot["total_tokens"]


def test_over_budget_drops_oldest_whole_turns(tmp_path: Path, counter: TokenCounter) -> None:
    history = stored(counter, chat_turn(1, 40) + tool_turn(2) + chat_turn(3, 40))
    turn2 = sum(m.tokens for m in history[2:6])
    turn3 = sum(m.tokens for m in history[6:])
    tail_of_turn2 = sum(m.tokens for m in history[4:6])  # the tool result and final answer
    base = _base_tokens(tmp_path, counter)
    # room for turn 3 and the end of turn 2, but not for all of turn 2
    limit = base + turn3 + tail_of_turn2 + 1
    assert limit < base + turn3 + turn2
    builder = make_builder(tmp_path, counter, max_context_tokens=limit)
    built = builder.build(inbound=inbound(), history=history, hints=HINTS)
    kept = history_part(built.messages)
    assert kept == chat_turn(3, 40)
    assert_whole_turns(kept)
    assert built.snapshot["trimmed"] == [
        f"dropped the 2 oldest turn(s) of history to fit {limit} tokens"]
    assert built.snapshot["total_tokens"] <= limit
    assert built.snapshot["layers"]["history"] == turn3

    roomy = make_builder(tmp_path, counter, max_context_tokens=base + turn2 + turn3)
    kept = history_part(roomy.build(inbound=inbound(), history=history, hints=HINTS).messages)
    assert kept == tool_turn(2) + chat_turn(3, 40)
    assert_whole_turns(kept)


def test_budget_counts_reply_reserve_and_tools(tmp_path: Path, counter: TokenCounter) -> None:
    history = stored(counter, chat_turn(1, 40))
    base = _base_tokens(tmp_path, counter)
    need = sum(m.tokens for m in history)
    fits = make_builder(tmp_path, counter, max_context_tokens=base + need + 100)
    assert len(history_part(fits.build(inbound=inbound(), history=history,
                                       hints=HINTS).messages)) == 2
    reserved = make_builder(tmp_path, counter, max_context_tokens=base + need + 100,
                            reply_reserve_tokens=101)
    assert history_part(reserved.build(inbound=inbound(), history=history,
                                       hints=HINTS).messages) == []
    assert history_part(fits.build(inbound=inbound(), history=history, hints=HINTS,
                                   tools_tokens=101).messages) == []


def test_old_tool_results_are_shortened(tmp_path: Path, counter: TokenCounter) -> None:
    builder = make_builder(tmp_path, counter, max_tool_snippet_tokens=50)
    long_result = " ".join(f"line{i}" for i in range(400))
    bodies = tool_turn(1, long_result) + tool_turn(2, "short result")
    history = stored(counter, bodies)
    full = counter.count_text(long_result)
    assert full > 50
    built = builder.build(inbound=inbound(), history=history, hints=HINTS)
    kept = history_part(built.messages)
    assert len(kept) == len(bodies)
    shortened = kept[2]
    assert shortened["tool_call_id"] == "call_1" and shortened["role"] == "tool"
    head = counter.encoding.decode(counter.encoding.encode(long_result)[:50])
    assert shortened["content"] == f"{head}\n[… tool result shortened from {full} tokens …]"
    assert kept[6]["content"] == "short result"
    assert bodies[2]["content"] == long_result  # the stored message itself is untouched
    assert built.snapshot["trimmed"] == ["shortened 1 old tool result(s) to 50 tokens"]
    assert built.snapshot["layers"]["history"] < sum(m.tokens for m in history)


def test_current_message_stays_when_far_over_budget(tmp_path: Path,
                                                    counter: TokenCounter) -> None:
    builder = make_builder(tmp_path, counter, max_context_tokens=50)
    write_workspace(builder.workspace)
    text = "please read this long message " * 40
    history = stored(counter, chat_turn(1) + chat_turn(2))
    built = builder.build(inbound=inbound(text), history=history, hints=HINTS)
    assert built.messages[-1] == {"role": "user", "content": text}
    assert built.messages[-2]["content"].startswith(RUNTIME_TAG)
    assert history_part(built.messages) == []
    assert built.snapshot["total_tokens"] > 50
    assert built.snapshot["trimmed"] == [
        "dropped the 2 oldest turn(s) of history to fit 50 tokens",
        "over budget even without history: the current input is kept whole"]


# snapshot -----------------------------------------------------------------------------------

def test_snapshot_hash_is_deterministic(tmp_path: Path, counter: TokenCounter) -> None:
    builder = make_builder(tmp_path, counter)
    write_workspace(builder.workspace)
    history = stored(counter, tool_turn(1) + chat_turn(2))

    def build(b: ContextBuilder, hist: list[StoredMessage], **kw: Any) -> dict[str, Any]:
        return b.build(inbound=inbound(**kw), history=hist, hints=HINTS,
                       session_key="telegram:c42", turn_id="t1").snapshot

    first = build(builder, history)
    again = build(make_builder(tmp_path, counter), list(history))
    # The inputs differ only in the inbound message's generated id, which the model never sees.
    assert {**again, "inputs": None} == {**first, "inputs": None}
    assert again["inputs"]["history_ids"] == first["inputs"]["history_ids"]
    assert first["hash"].startswith("3:") and len(first["hash"]) == 66
    assert first["session_key"] == "telegram:c42" and first["turn_id"] == "t1"
    assert first["sources"]["history_available"] == 6
    assert first["sources"]["history_kept"] == 6

    assert build(builder, history[:2] + history[4:])["hash"] != first["hash"]
    assert build(builder, history, received_at=datetime(2024, 7, 7, tzinfo=UTC))["hash"] \
        != first["hash"]


async def test_the_history_cache_reads_only_new_rows_and_stays_bounded(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A held session reads only the rows written since; sessions beyond the cache's token
    bound are let go oldest first (and read again whole when they speak)."""
    from agent import history as history_module
    from agent.history import HistoryCache
    from gateway.kernel.store import Store
    from gateway.kernel.store_sessions import NewMessage

    store = await Store.open(tmp_path / "parley.db")
    reads: list[tuple[int, int]] = []
    real = store.recent_messages

    async def counted(session_id: int, limit: int, from_id: int = 0) -> list[StoredMessage]:
        rows = await real(session_id, limit, from_id)
        reads.append((session_id, len(rows)))
        return rows

    monkeypatch.setattr(store, "recent_messages", counted)
    monkeypatch.setattr(history_module, "TOKENS_KEPT", 250)
    try:
        cache = HistoryCache(store, limit=50)
        sessions = [(await store.active_session(f"local:c{i}")).id for i in range(3)]

        async def say(session_id: int, n: int) -> None:
            await store.save_turn(session_id=session_id, turn_id=f"t{session_id}-{n}",
                                  inbound_id=None, messages=[
                                      NewMessage({"role": "user", "content": f"m{n}"}, 50)])

        for n in range(2):
            await say(sessions[0], n)
        rows, more = await cache.history(sessions[0], None)
        assert [m.body["content"] for m in rows] == ["m0", "m1"] and not more
        await say(sessions[0], 2)
        rows, _ = await cache.history(sessions[0], None)
        assert [m.body["content"] for m in rows] == ["m0", "m1", "m2"]
        assert reads[-1] == (sessions[0], 1)  # only the new row was read
        for s in sessions[1:]:  # 150 + 100 + 100 tokens: over 250, the first is let go
            await say(s, 0)
            await say(s, 1)
            await cache.history(s, None)
        await cache.history(sessions[0], None)
        assert reads[-1] == (sessions[0], 3)  # read again whole
        assert cache._tokens <= 250 + 150
    finally:
        await store.close()


async def test_the_history_cache_counts_its_window_as_it_slides(tmp_path: Path) -> None:
    """The tokens a session holds go on turn by turn (what came added, what left the window
    taken off), equal to a count of the rows held."""
    from agent.history import HistoryCache
    from gateway.kernel.store import Store
    from gateway.kernel.store_sessions import NewMessage

    store = await Store.open(tmp_path / "parley.db")
    try:
        cache = HistoryCache(store, limit=3)
        session = (await store.active_session("local:c1")).id
        for n in range(9):
            await store.save_turn(session_id=session, turn_id=f"t{n}", inbound_id=None,
                                  messages=[NewMessage({"role": "user", "content": f"m{n}"},
                                                       10 + n)] * (1 + n % 2))
            rows, more = await cache.history(session, None)
            held = cache._held[session]
            assert held.tokens == sum(m.tokens for m in held.rows) == cache._tokens
            # the window itself is held (no extra row): more once past the limit, and after
            assert len(held.rows) <= 3 and rows is held.rows and more == held.more
            assert more == (sum(1 + k % 2 for k in range(n + 1)) > 3)
            assert_carried(rows)
        assert [m.body["content"] for m in rows] == ["m7", "m7", "m8"]
        again, more = await cache.history(session, None)
        assert again is rows and more  # read again: the same window, not a copy of it
    finally:
        await store.close()


def assert_carried(rows: list[StoredMessage]) -> None:
    """What ``HistoryRows`` carries forward is what its rows say."""
    from agent.fingerprint import message_digest
    from agent.history import HistoryRows

    assert isinstance(rows, HistoryRows)
    assert rows.bodies == [m.body for m in rows]
    assert all(a is b for a, b in zip(rows.bodies, (m.body for m in rows), strict=True))
    assert rows.tokens == sum(m.tokens for m in rows)
    assert rows.tools == [i for i, m in enumerate(rows) if m.role == "tool"]
    assert rows.digests == b"".join(message_digest(m.body) for m in rows)
    assert [rows.digest(i) for i in range(len(rows))] == [message_digest(m.body) for m in rows]
    assert len(rows.starts) == len(rows)
    # the bodies as the request writes them, joined; and where each begins
    from agent.fingerprint import message_json
    encoded = [message_json(m.body) for m in rows]
    assert rows.raw == b",".join(encoded)
    assert [rows.raw_from(i) for i in range(len(rows) + 1)] == [
        b",".join(encoded[i:]) for i in range(len(rows) + 1)]


async def test_the_history_cache_carries_the_windows_figures_forward(tmp_path: Path) -> None:
    """Tool results come and leave the window (also as the oldest row, read only to tell
    that there are more), compactions move its start: the positions, bodies, tokens and
    digests carried forward stay those of the rows returned."""
    from agent.history import HistoryCache
    from gateway.kernel.store import Compaction, Store
    from gateway.kernel.store_sessions import NewMessage

    store = await Store.open(tmp_path / "parley.db")
    try:
        cache = HistoryCache(store, limit=5)
        session = (await store.active_session("local:c1")).id
        for n in range(12):
            bodies = tool_turn(n) if n % 3 == 0 else chat_turn(n)
            await store.save_turn(session_id=session, turn_id=f"t{n}", inbound_id=None,
                                  messages=[NewMessage(b, 7 + n) for b in bodies])
            rows, _ = await cache.history(session, None)
            assert_carried(rows)
            assert len(rows) == min(5, sum(4 if k % 3 == 0 else 2 for k in range(n + 1)))
        # a compaction moves the start on within the rows held: none is read again
        reads: list[int] = []
        real = store.recent_messages

        async def counted(session_id: int, limit: int, from_id: int = 0) -> list[StoredMessage]:
            found = await real(session_id, limit, from_id)
            reads.append(len(found))
            return found

        store.recent_messages = counted  # type: ignore[method-assign]
        for kept_from in (rows[1].id, rows[3].id, rows[-1].id + 1):
            summary = Compaction(kept_from, "earlier", 3, kept_from, 100, 4)
            got, more = await cache.history(session, summary)
            fresh, fresh_more = await HistoryCache(store, limit=5).history(session, summary)
            assert [m.id for m in got] == [m.id for m in fresh] and more == fresh_more
            assert all(m.id >= kept_from for m in got)
            assert_carried(got)
            assert reads[-2] == 0  # the held cache read nothing new (the fresh one read all)
        assert got == []
    finally:
        await store.close()


@pytest.mark.parametrize("case", ["fits", "shortened", "over budget", "orphan"])
def test_the_carried_figures_build_the_same_context(tmp_path: Path, counter: TokenCounter,
                                                    case: str) -> None:
    """A turn's context from ``HistoryRows`` (what the gateway passes) is the one the rows
    alone give (what a replay passes), byte for byte, whatever is trimmed."""
    from agent.history import HistoryRows

    long_result = " ".join(f"line{i}" for i in range(400))
    bodies = chat_turn(1, 40) + tool_turn(2, long_result) + chat_turn(3, 40)
    if case == "orphan":
        bodies = bodies[3:]
    rows = stored(counter, bodies)
    carried = HistoryRows.of(rows)
    base = _base_tokens(tmp_path, counter)
    context: dict[str, Any] = {
        "fits": {}, "orphan": {}, "shortened": {"max_tool_snippet_tokens": 50},
        "over budget": {"max_context_tokens": base + sum(m.tokens for m in rows[-2:]) + 5}}[case]
    builder = make_builder(tmp_path, counter, **context)
    msg = inbound()
    one = builder.build(inbound=msg, history=rows, hints=HINTS)
    two = builder.build(inbound=msg, history=carried, hints=HINTS)
    assert one.messages == two.messages and one.snapshot == two.snapshot
    # the history the body copies in as it was written: the same JSON, where it is carried
    # whole (a shortened result, or a turn cut in half, is written anew)
    import json

    from agent.fingerprint import message_json
    from agent.openai_http import encode_body
    assert one.encoded is None
    assert (two.encoded is not None) == (case in ("fits", "over budget"))
    body = {"model": "m", "messages": two.messages, "max_tokens": 9}
    assert json.loads(encode_body(body, two.encoded)) == body
    if two.encoded is not None:  # all but the system prompt, the runtime block, the input
        assert (two.encoded.start, two.encoded.count) == (1, len(two.messages) - 3)
        assert two.encoded.raw == b",".join(message_json(m) for m in two.messages[1:-2])
    trimmed = {"fits": [], "orphan": ["dropped 3 message(s) of a turn cut by "
                                      "max_recent_messages"]}
    if case in trimmed:
        assert two.snapshot["trimmed"] == trimmed[case]
    else:
        assert two.snapshot["trimmed"]
    assert carried.bodies == [m.body for m in rows]  # the carried figures are not changed


async def test_the_history_cache_takes_a_turns_own_rows_without_reading_them(
        tmp_path: Path) -> None:
    """A turn's messages, once its write committed on the loop's connection, join the rows
    held: the next turn (``turn_start`` saw no other connection's write since) reads nothing
    and gets what a fresh read gives, window limit included. A write by another connection
    (``parley chat`` beside the gateway) moves the version: the next turn reads what came."""
    import json
    import sqlite3

    from agent.history import HistoryCache
    from gateway.kernel.store import Store
    from gateway.kernel.store_sessions import NewMessage

    store = await Store.open(tmp_path / "parley.db")
    assert store._now is not None
    statements: list[str] = []
    store._now.set_trace_callback(statements.append)
    try:
        cache = HistoryCache(store, limit=5)

        async def turn(n: int) -> tuple[int, list[StoredMessage], bool, list[str]]:
            session, compaction = await store.turn_start("local:c1")
            statements.clear()
            rows, more = await cache.history(session, compaction)
            reads = [s for s in statements if "FROM messages" in s]
            fresh, fresh_more = await HistoryCache(store, limit=5).history(session, compaction)
            assert [(m.id, m.body) for m in rows] == [(m.id, m.body) for m in fresh]
            assert more == fresh_more
            await store.save_turn(session_id=session, turn_id=f"t{n}", inbound_id=None,
                                  messages=[NewMessage(b, 5 + n) for b in chat_turn(n)])
            return session, rows, more, reads

        for n in range(8):
            session, rows, more, reads = await turn(n)
            assert bool(reads) == (n < 2)  # the session's making moved the version once
            assert len(rows) == min(5, 2 * n) and more == (2 * n > 5)
            assert_carried(rows)
        other = sqlite3.connect(tmp_path / "parley.db")
        other.execute("INSERT INTO messages (session_id, turn_id, role, body, tokens, "
                      "created_at) VALUES (?, 'elsewhere', 'user', ?, 3, '2026-11-28')",
                      (session, json.dumps({"role": "user", "content": "from elsewhere"})))
        other.commit()
        other.close()
        session, rows, _, reads = await turn(8)
        assert reads and rows[-1].body == {"role": "user", "content": "from elsewhere"}
        session, rows, _, reads = await turn(9)
        assert not reads and [m.turn_id for m in rows][-3:] == ["elsewhere", "t8", "t8"]
    finally:
        await store.close()
