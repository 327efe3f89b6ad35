"""The throwaway PostgreSQL cluster the several-process tests run on (issue 19)."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import psycopg

from tests.fakes.postgres import PostgresCluster, renewals_held


def test_each_test_gets_its_own_empty_database(postgres_url: str,
                                                 postgres_cluster: PostgresCluster) -> None:
    with psycopg.connect(postgres_url) as conn:
        conn.execute("CREATE TABLE t (x int)")
        assert conn.execute("SELECT count(*) FROM t").fetchone() == (0,)
    other = postgres_cluster.fresh_database()
    with psycopg.connect(other) as conn:
        found = conn.execute("SELECT to_regclass('t')").fetchone()
    assert found == (None,)


# The cluster worker's stop (gateway/cluster.py) -----------------------------------------------

async def _worker(url: str) -> Any:
    from gateway.cluster import ClusterWorker
    from gateway.delivery import ChannelManager
    from gateway.kernel.bus import MessageBus
    from gateway.kernel.store import Store

    store = await Store.open(url)
    bus = MessageBus()
    return ClusterWorker(cast(Any, store), bus, ChannelManager(bus), lease=5.0,
                         channels=["local"])


async def test_a_wake_up_as_the_worker_stops_does_not_keep_it_running(postgres_url: str) -> None:
    """A wake-up (a peer's NOTIFY) arriving as the stop cancels the claiming loop, while a
    peer is alive (the loop waits at most until the peer's lease ends): the stop still ends.
    Python 3.11's ``asyncio.wait_for`` swallowed that cancel (the wake-up won), so a gateway
    stopping as a peer left waited for ever; every interleaving is tried."""
    peer = await _worker(postgres_url)
    await peer.start()
    try:
        for turns in range(4):  # the wake-up 0..3 loop iterations ahead of the cancel
            worker = await _worker(postgres_url)
            await worker.start()
            try:
                claims = worker._claiming[1]
                for _ in range(3000):  # until the claiming loop waits for a wake-up
                    if worker._wake._waiters:  # (asyncio.Event's waiters: no public view)
                        break
                    await asyncio.sleep(0.01)
                worker._wake.set()
                for _ in range(turns):
                    await asyncio.sleep(0)
                async with asyncio.timeout(30):  # a bound only: the stop must end, not hang
                    await worker.stop()
                assert claims.done()
            finally:
                await worker.cluster.store.close()
    finally:
        await peer.stop()
        await peer.cluster.store.close()


async def test_a_stopping_process_takes_no_leader_lease(postgres_url: str) -> None:
    """A process that stops takes nothing new: when the schedules' leader leaves at the same
    time, the stopping process does not start them (they would outlive its stop)."""
    leader, other = await _worker(postgres_url), await _worker(postgres_url)
    started: list[str] = []

    async def start_a() -> None:
        started.append("a")

    async def start_b() -> None:
        started.append("b")

    leader.leaders["schedules"], other.leaders["schedules"] = start_a, start_b
    try:
        await leader.start()
        await leader.try_lead()
        await other.start()
        await other.try_lead()
        assert started == ["a"]
        await other.stop_claiming()
        await leader.stop()  # hands the schedules back and wakes the others
        await other.try_lead()
        assert started == ["a"] and not other.leading
        await other.stop()
    finally:
        for worker in (leader, other):
            await worker.cluster.store.close()


async def test_a_process_cut_off_from_the_database_stops_taking_work_and_says_so(
        postgres_url: str) -> None:
    """Its connections are killed on the server (as when the network drops): the next lease
    renewal fails, the process stops taking work and health names why; when the database
    answers again it takes work again."""
    from tests.e2e.waiting import until

    worker = await _worker(postgres_url)
    worker.cluster.lease = 1.0  # renewals every third of a second
    await worker.start()
    try:
        await until(lambda: worker.taking_work and worker.cluster._beat is not None,
                    "the worker to take work and renew its lease once")
        async with await psycopg.AsyncConnection.connect(postgres_url, autocommit=True) as db:
            cut = await (await db.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()")).fetchone()
        assert cut is not None and cut[0] >= 1
        await until(lambda: not worker.taking_work, "the worker to stop taking work")
        health = worker.health()
        assert health["taking_work"] is False
        assert "lost the database" in health["problem"]
        await until(lambda: worker.taking_work, "the worker to take work again", timeout=30)
        assert "problem" not in worker.health()
        session = await worker.cluster.store.active_session("local:after")  # writes again
        assert session.key == "local:after"
    finally:
        await worker.stop()
        await worker.cluster.store.close()


async def test_a_leader_whose_renewals_hang_gives_up_before_another_takes_over(
        postgres_url: str) -> None:
    """The leader's lease renewals hang (its row is locked: a stalled database, a network
    that drops packets): two thirds of a lease after its last renewal it gives up what it
    holds (a Discord websocket, a Telegram poller), before the other may take it over a
    lease after that renewal. When its renewals work again it finds the lease taken and
    stays on standby."""
    from tests.e2e.waiting import until

    a, b = await _worker(postgres_url), await _worker(postgres_url)
    events: list[str] = []

    def record(what: str) -> Any:
        async def note() -> None:
            events.append(what)
        return note

    a.leaders["x"], a.yielders["x"] = record("a leads"), record("a gives up")
    b.leaders["x"], b.yielders["x"] = record("b leads"), record("b gives up")
    for worker in (a, b):
        worker.cluster.lease = 3.0
    try:
        await a.start()
        await b.start()
        assert events == ["a leads"]
        async with renewals_held(postgres_url, a.me):
            await until(lambda: "b leads" in events, "b to take the lease over", timeout=30)
            assert events == ["a leads", "a gives up", "b leads"]
            assert "x" not in a.leading
        await until(lambda: a.taking_work and a._sure_alive(), "a to renew again", timeout=30)
        await a.try_lead()
        assert events == ["a leads", "a gives up", "b leads"] and "x" not in a.leading
    finally:
        for worker in (a, b):
            await worker.stop()
            await worker.cluster.store.close()


async def test_a_notification_says_whether_this_process_sent_it(postgres_url: str) -> None:
    """A reply this process stored was read as it was stored: its own ``NOTIFY`` is told
    apart from another process's (no second read of the reply log per turn)."""
    from gateway.kernel.store import Store
    from gateway.kernel.store_pg_cluster import ClusterStore

    store = await Store.open(postgres_url)
    cluster = ClusterStore(cast(Any, store), lease=30.0, channels=["local"])
    await cluster.listen()
    try:
        heard = cluster.notifications()
        await store.write(lambda db: db.execute("SELECT pg_notify('parley_local', 'c1')"))
        async with await psycopg.AsyncConnection.connect(postgres_url,
                                                         autocommit=True) as other:
            await other.execute("SELECT pg_notify('parley_local', 'c2')")
        async with asyncio.timeout(30):  # a bound only: both always come
            assert await anext(heard) == ("parley_local", "c1", True)
            assert await anext(heard) == ("parley_local", "c2", False)
    finally:
        await cluster.close()
        await store.close()
