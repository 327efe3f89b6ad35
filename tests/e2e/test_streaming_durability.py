"""One owner of the final message across a ``kill -9``: a gateway killed while it streams a
reply into a Telegram group leaves a half-written message; after the restart the turn is
answered again into that same message, and the chat holds one complete answer, never a
second copy beside the first. The gateway is a real subprocess; Telegram is the fake Bot API
in this process."""

from __future__ import annotations

import asyncio
import signal
import sqlite3
from asyncio import Task
from asyncio.subprocess import Process
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.test_durability import _drain_stderr, _start_gateway
from tests.e2e.waiting import until
from tests.fakes.openai_server import Gate, ScriptedLLM
from tests.fakes.telegram_server import FakeTelegram, Sent

ADA_ID, GROUP_ID = 1001, -100200300
ANSWER = "The plan: pack tonight, take the 08:15 train, lunch in Lyon, back by nine."


def write_config(tmp_path: Path, llm: ScriptedLLM, name: str, section: dict[str, Any]) -> Path:
    """A config file for a gateway subprocess: channel ``name`` streaming with ``section``."""
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({
        "workspace": "ws", "data_dir": "data",
        "agent": {"model": "openai/test-model", "api_base": llm.base_url, "api_key": "k",
                  "retry_backoff": "0.01s"},
        "channels": {"local": {"port": 0}, name: {
            "enabled": True, **section,
            "streaming": {"enabled": True, "interval": 0, "min_chars": 0}}}}))
    return path


def _config(tmp_path: Path, llm: ScriptedLLM, tg: FakeTelegram) -> Path:
    return write_config(tmp_path, llm, "telegram", {
        "token": tg.token, "base_url": tg.base_url, "base_file_url": tg.base_file_url,
        "poll_timeout": "1s", "watchdog": "10s", "allow_from": [str(ADA_ID)],
        "allow_groups": [str(GROUP_ID)]})


def _recorded(db: Path) -> int:
    """Rows in reply_streams, read as another process would (the gateway's own file)."""
    if not db.exists():
        return 0
    try:
        with sqlite3.connect(db, timeout=1) as conn:
            return int(conn.execute("SELECT count(*) FROM reply_streams").fetchone()[0])
    except sqlite3.OperationalError:  # the table is not there yet
        return 0


async def _first_run(config: Path, tg: FakeTelegram) -> tuple[Process, Task[None], Sent]:
    """The gateway started, asked in the group; the half-written message it shows."""
    group = tg.group(GROUP_ID, "Trip")
    proc, _ = await _start_gateway(config)
    drain = asyncio.create_task(_drain_stderr(proc))
    tg.message(group, tg.user(ADA_ID, "Ada"), "@parley_bot plan the trip")
    [half] = await tg.wait_sent(GROUP_ID, timeout=30)
    return proc, drain, half


async def _kill_9(proc: Process, drain: Task[None]) -> None:
    proc.send_signal(signal.SIGKILL)
    await proc.wait()
    await drain


async def _second_run(config: Path, done: Callable[[], Awaitable[None]]) -> None:
    """The gateway started again until ``done``, then stopped cleanly."""
    proc, _ = await _start_gateway(config)
    drain = asyncio.create_task(_drain_stderr(proc))
    try:
        await done()
    finally:
        proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.wait(), 20)
        await drain
    assert proc.returncode == 0


@pytest.mark.timeout(90)
async def test_kill_9_mid_stream_leaves_one_complete_answer(tmp_path: Path,
                                                            llm: ScriptedLLM) -> None:
    async with FakeTelegram() as tg:
        config = _config(tmp_path, llm, tg)
        never = Gate()  # the model is still writing when the gateway dies
        llm.reply(ANSWER, pieces=[ANSWER[:20], ANSWER[20:]], pauses={2: never})
        proc, drain, half = await _first_run(config, tg)
        assert half.text == ANSWER[:20].rstrip()
        db = tmp_path / "data" / "parley.db"
        await until(lambda: _recorded(db) == 1, "the shown message recorded", timeout=30)
        await _kill_9(proc, drain)

        llm.reply(ANSWER, pieces=[ANSWER[:40], ANSWER[40:]])

        async def finished() -> None:
            await tg.wait_for(lambda: half.text == ANSWER, timeout=30)
            await until(lambda: _recorded(db) == 0, "the stream's record forgotten",
                        timeout=30)

        await _second_run(config, finished)
        assert tg.sent_to(GROUP_ID) == [half]  # the same message, finished; no second copy
        assert tg.deleted == []
        assert llm.calls == 2


@pytest.mark.timeout(90)
async def test_kill_9_before_the_final_edit_delivers_the_stored_reply_into_it(
        tmp_path: Path, llm: ScriptedLLM) -> None:
    async with FakeTelegram() as tg:
        config = _config(tmp_path, llm, tg)
        data = yaml.safe_load(config.read_text())
        data["channels"]["telegram"]["streaming"]["min_chars"] = 10_000  # no interim edit
        config.write_text(yaml.safe_dump(data))
        rest = Gate()
        llm.reply(ANSWER, pieces=[ANSWER[:20], ANSWER[20:]], pauses={2: rest})
        proc, drain, half = await _first_run(config, tg)
        tg.fail_next("editMessageText", 500, times=1000)  # the final edit keeps failing
        rest.release()
        await tg.wait_for(lambda: any(m == "editMessageText" for m, _ in tg.calls),
                          timeout=30)  # the reply is stored: its delivery has begun
        await _kill_9(proc, drain)
        tg._failures.clear()

        async def finished() -> None:
            await tg.wait_for(lambda: half.text == ANSWER, timeout=30)

        await _second_run(config, finished)
        assert tg.sent_to(GROUP_ID) == [half]
        assert llm.calls == 1  # the stored reply, not a second turn
