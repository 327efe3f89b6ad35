"""An inbound message claimed as it is stored (issue 19, the cost of a turn on PostgreSQL):
by the process storing it when it holds the chat (or can take it), with no wake-up of every
process; left to the claim rounds when another live process holds the chat or an earlier
message of the chat waits (order per chat kept), and a new chat of a platform one process
polls is left to them too (they spread its chats over the processes)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, cast

import psycopg
import pytest

from gateway.kernel.events import InboundMessage
from gateway.kernel.store import Store
from gateway.kernel.store_pg_cluster import ClusterStore


def message(chat: str, text: str, channel: str = "local") -> InboundMessage:
    return InboundMessage(channel=channel, chat_id=chat, sender_id="u1", text=text)


@pytest.fixture
async def two(postgres_url: str) -> AsyncIterator[tuple[ClusterStore, ClusterStore]]:
    """Two live processes, each on its own store, each taking work (``claimer`` set)."""
    stores = [await Store.open(postgres_url) for _ in range(2)]
    procs = [ClusterStore(cast(Any, s), lease=30.0, channels=["local"], me=f"proc-{i}")
             for i, s in enumerate(stores)]
    for proc in procs:
        await proc.join()
        proc.store.claimer = proc.me
        proc.store.takes_free = frozenset({"local"})  # every process receives it
    yield procs[0], procs[1]
    for store in stores:
        await store.close()


async def claimed_by(proc: ClusterStore, chat: str) -> list[tuple[str, str | None]]:
    rows = await proc.store._fetchall(
        "SELECT payload::json->>'text', claimed_by FROM inbox WHERE chat_id = ? ORDER BY id",
        (chat,))
    return [(r[0], r[1]) for r in rows]


async def holder(proc: ClusterStore, chat: str) -> str | None:
    row = await proc.store._fetchone("SELECT holder FROM chat_leases WHERE chat_id = ?", (chat,))
    return None if row is None else str(row[0])


async def test_the_storing_process_claims_a_free_chat_and_wakes_nobody(
        two: tuple[ClusterStore, ClusterStore], postgres_url: str) -> None:
    a, b = two
    async with await psycopg.AsyncConnection.connect(postgres_url, autocommit=True) as ear:
        await ear.execute("LISTEN parley_inbox")
        one = message("c1", "one")
        assert await a.store.inbox_take(one) == (True, True)
        assert await a.store.inbox_take(one) == (False, False)  # a repeat
        assert await b.store.inbox_take(message("c2", "two")) == (True, True)
        await ear.execute("NOTIFY parley_inbox, 'marker'")
        heard: list[str] = []
        async with asyncio.timeout(30):  # a bound only: the marker always comes
            async for note in ear.notifies():
                heard.append(note.payload)
                if note.payload == "marker":
                    break
    assert heard == ["marker"]  # nothing stored unclaimed: no claim round anywhere
    assert await claimed_by(a, "c1") == [("one", "proc-0")]
    assert await holder(a, "c1") == "proc-0" and await holder(a, "c2") == "proc-1"
    assert (await a.claim()).inbound == [] and (await b.claim()).inbound == []


async def test_a_chat_another_live_process_holds_is_left_to_it(
        two: tuple[ClusterStore, ClusterStore]) -> None:
    a, b = two
    assert await b.store.inbox_take(message("c1", "first")) == (True, True)
    assert await a.store.inbox_take(message("c1", "second")) == (True, False)
    assert await holder(a, "c1") == "proc-1"
    assert await claimed_by(a, "c1") == [("first", "proc-1"), ("second", None)]
    assert [m.text for m in (await a.claim()).inbound] == []
    assert [m.text for m in (await b.claim()).inbound] == ["second"]


async def test_a_message_behind_an_unclaimed_one_of_its_chat_is_not_claimed_ahead_of_it(
        two: tuple[ClusterStore, ClusterStore]) -> None:
    a, _ = two
    a.store.claimer = None  # stored as by a process not taking work: left to the claims
    assert await a.store.inbox_take(message("c1", "first")) == (True, False)
    a.store.claimer = a.me
    assert await a.store.inbox_take(message("c1", "second")) == (True, False)
    assert [m.text for m in (await a.claim()).inbound] == ["first", "second"]
    assert await a.store.inbox_take(message("c1", "third")) == (True, True)  # none waits now


async def test_a_process_given_up_for_dead_claims_nothing_as_it_stores(
        two: tuple[ClusterStore, ClusterStore]) -> None:
    a, b = two
    await a.store._write(lambda db: db.execute(
        "UPDATE cluster_processes SET expires_at = 0 WHERE id = ?", (a.me,)))
    assert await a.store.inbox_take(message("c1", "late")) == (True, False)
    assert await holder(a, "c1") is None
    assert [m.text for m in (await b.claim()).inbound] == ["late"]


async def test_a_new_chat_of_a_channel_one_process_receives_is_left_to_the_claims(
        two: tuple[ClusterStore, ClusterStore]) -> None:
    a, b = two
    a.channels = b.channels = ["telegram"]
    assert await a.store.inbox_take(message("t1", "first", "telegram")) == (True, False)
    assert await holder(a, "t1") is None
    assert [m.text for m in (await b.claim()).inbound] == ["first"]  # the round spreads it
    assert await a.store.inbox_take(message("t1", "second", "telegram")) == (True, False)
    assert [m.text for m in (await b.claim()).inbound] == ["second"]
    assert [m.text for m in (await a.claim()).inbound] == []
    assert await a.store.inbox_take(message("t2", "one", "telegram")) == (True, False)
    assert [m.text for m in (await a.claim()).inbound] == ["one"]
    assert await a.store.inbox_take(message("t2", "two", "telegram")) == (True, True)  # held
