"""``bench/skeleton.py``, the floor item 3's gateway figure is read against, answers what the
gateway would (the scripted model's echo, through the same two requests) and stores every turn
before it answers: a floor that skipped the writes would flatter the gateway's ratio."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

from bench.client import LocalClient, expect
from bench.procs import ModelServer, SkeletonProcess


async def test_the_skeleton_answers_and_stores_every_turn(tmp_path: Path) -> None:
    server = ModelServer.start()
    try:
        skeleton = SkeletonProcess(tmp_path, server.base_url)
        try:
            async with LocalClient(skeleton.base_url, wait=30) as client:
                async def chat(j: int) -> None:
                    for i in range(4):
                        _, record = await client.turn(f"c{j}", f"turn {i} of chat {j}")
                        expect(record, f"turn {i} of chat {j}")
                await asyncio.gather(*(chat(j) for j in range(5)))
                # history goes with the chat: the model saw the chat's earlier turns
                last = server.last_request()["body"]["messages"]
                assert last[0]["role"] == "system"
                assert len(last) == 1 + 2 * 3 + 1
        finally:
            skeleton.stop()
    finally:
        server.stop()
    with sqlite3.connect(tmp_path / "skeleton.db") as db:
        assert db.execute("SELECT count(*), sum(done) FROM inbox").fetchone() == (20, 20)
        assert db.execute("SELECT count(*) FROM messages").fetchone() == (40,)
        assert db.execute("SELECT count(*) FROM outbox").fetchone() == (20,)


def test_the_report_reads_one_chat_against_the_skeleton_at_one_chat() -> None:
    from bench.report import checks

    results = {"throughput": {
        "1": {"cpu_ms_per_turn": {"gateway": 1.4}, "turns_failed": 0},
        "skeleton": {"cpu_ms_per_turn": {"gateway": 0.17}, "turns_failed": 0},
        "skeleton_1": {"cpu_ms_per_turn": {"gateway": 0.55}, "turns_failed": 2}}}
    rows = {row.figure: row for row in checks(results)}
    floor = next(row for figure, row in rows.items() if figure.startswith("one chat on"))
    assert floor.value == 0.55 and "never asleep: 0.17 ms" in floor.figure
    assert "the gateway at one chat: 1.4 ms" in floor.figure
    own = next(row for figure, row in rows.items() if figure.startswith("the gateway's own"))
    assert own.shown == "0.85 ms"
    failed = next(row for figure, row in rows.items() if figure.startswith("turns not"))
    assert failed.value == 2  # the skeleton's one-chat run counts among the load runs
