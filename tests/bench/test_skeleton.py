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
