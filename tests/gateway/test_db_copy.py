"""``parley db migrate`` and ``parley db copy``: an SQLite store moved to PostgreSQL whole
(issue 19), run as a user runs them."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import yaml

from gateway.kernel.clock import SystemClock
from gateway.kernel.cron_jobs import CronJobs, NewJob
from gateway.kernel.pairing import PairingStore
from gateway.kernel.store import LLMCallRecord, NewMessage, Store

PARLEY = str(Path(sys.executable).parent / "parley")


async def parley(config: Path, *args: str) -> tuple[int, str]:
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    proc = await asyncio.create_subprocess_exec(
        PARLEY, *args, "--config", str(config), stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT, env=env)
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), 60)
    except BaseException:  # a hung command is not left running after the test
        proc.kill()
        await proc.wait()
        raise
    return proc.returncode or 0, out.decode()


def write_config(tmp_path: Path, database: str | None = None) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"workspace": "ws", "data_dir": "data",
                                    **({"database": database} if database else {})}))
    return path


async def test_copy_moves_every_table_and_new_rows_follow(tmp_path: Path,
                                                          postgres_url: str) -> None:
    config = write_config(tmp_path)
    sqlite = await Store.open(tmp_path / "data" / "parley.db")
    session = await sqlite.active_session("local:c1")
    await sqlite.save_turn(session_id=session.id, turn_id="t1", inbound_id=None,
                           messages=[NewMessage({"role": "user", "content": "hi"}, 2),
                                     NewMessage({"role": "assistant", "content": "hello"}, 3)],
                           calls=[LLMCallRecord("m", 10, 3, 5.0, 1, cost=0.25)],
                           snapshot={"hash": "h", "total_tokens": 5},
                           index=("local:c1", "local:ada"))
    pairing = PairingStore(sqlite)
    code = await pairing.request("telegram", "42", user_name="ada")
    assert await pairing.approve("telegram", code.code)
    jobs = CronJobs(sqlite, clock=SystemClock(), timezone="UTC")
    await jobs.ensure()
    job = await jobs.add(NewJob("tea", "tea time", "every", "1h", "local", "c1"))
    await sqlite.close()

    rc, said = await parley(config, "db", "copy", "--to", postgres_url)
    assert rc == 0, said
    assert "copied" in said and "messages 2" in said

    pg = await Store.open(postgres_url)
    try:
        copied = await pg.active_session("local:c1")
        assert copied.id == session.id and copied.message_count == 2
        assert [m.body["content"] for m in await pg.recent_messages(copied.id, 10)] == \
            ["hi", "hello"]
        assert (await pg.usage_total()).cost == 0.25
        assert await pg.latest_snapshot(copied.id) == {"turn_id": "t1", "hash": "h",
                                                       "total_tokens": 5}
        # found on PostgreSQL as on SQLite, under the person the turn was for
        hits = await pg.search_messages("hello", chat="local:c1", person="local:ada")
        assert [(h.text, h.person) for h in hits] == [("hello", "local:ada")]
        assert await pg.search_messages("hello", chat="local:c1", person="local:bob") == []
        assert await PairingStore(pg).is_approved("telegram", "42")
        assert [j.id for j in await CronJobs(pg, clock=SystemClock(), timezone="UTC").jobs()] \
            == [job.id]
        fresh = await pg.new_session("local:c2")  # the sequences moved past the copied ids
        assert fresh.id > session.id
    finally:
        await pg.close()

    rc, said = await parley(config, "db", "copy", "--to", postgres_url)
    assert rc == 1 and "empty database" in said  # never mixed into a used one


async def test_migrate_prepares_a_postgresql_store_and_names_every_table_set(
        tmp_path: Path, postgres_url: str) -> None:
    config = write_config(tmp_path, postgres_url)
    for _ in range(2):  # safe to run again
        code, said = await parley(config, "db", "migrate")
        assert code == 0, said
        for name in ("core v3", "cron v1", "pairing v1", "webchat v2", "local_log v2"):
            assert name in said
        assert "postgresql://postgres@127.0.0.1" in said
