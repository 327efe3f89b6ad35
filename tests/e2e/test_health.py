"""Health tells the truth, and the gateway takes no message it cannot keep.

The whole gateway over the local channel's HTTP API and the scripted model: a data folder
deleted while it runs, a model without its key, a model whose calls keep failing.
"""

from __future__ import annotations

import asyncio
import shutil
import socket
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from agent.provider import warm_up
from gateway.app import Gateway
from gateway.kernel.config import load_config
from tests.conftest import MakeConfig
from tests.e2e.test_cli import parley, write_config
from tests.e2e.waiting import until
from tests.fakes.openai_server import ScriptedLLM


async def post(gw: Gateway, text: str, message_id: str) -> tuple[int, dict[str, Any]]:
    body = {"chat_id": "c1", "sender_id": "u1", "text": text, "message_id": message_id}
    async with aiohttp.ClientSession() as session, \
            session.post(f"{gw.local.base_url}/v1/messages", json=body) as resp:
        return resp.status, await resp.json()


async def http_health(gw: Gateway) -> dict[str, Any]:
    async with aiohttp.ClientSession() as session, \
            session.get(f"{gw.local.base_url}/v1/health") as resp:
        assert resp.status == 200
        data: dict[str, Any] = await resp.json()
        return data


async def test_a_data_folder_deleted_while_running_refuses_messages_instead_of_losing_them(
        make_config: MakeConfig, llm: ScriptedLLM) -> None:
    """On main every message after the deletion got a 202 and was gone at the next start."""
    llm.echo()
    config = make_config()
    accepted: list[str] = []
    async with Gateway(config, grace=2.0) as gw:
        assert await gw.local.ask("c1", "before") == "echo: before"
        assert (await http_health(gw))["status"] == "ok"
        shutil.rmtree(config.data_path)

        health = await http_health(gw)
        assert health["status"] == "degraded"
        assert any(r.startswith("storage: database") and "is gone" in r
                   for r in health["reasons"]), health["reasons"]
        for n in range(3):
            status, body = await post(gw, f"after {n}", f"m{n}")
            if status == 202:
                accepted.append(f"m{n}")
            else:
                assert status == 503
                assert body["error"].startswith("store: the message could not be stored")
    assert accepted == []  # nothing acknowledged that a restart would not find

    async with Gateway(config, grace=2.0) as gw:  # a fresh database: healthy again
        assert (await http_health(gw))["status"] == "ok"
        assert await gw.local.ask("c1", "again") == "echo: again"


async def test_a_model_without_its_key_is_named_in_health(
        make_config: MakeConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    await asyncio.to_thread(warm_up)  # seconds on a busy machine: setup, not the outcome
    config = make_config(agent={"model": "openai/gpt-4o-mini", "api_base": "", "api_key": ""})
    async with Gateway(config, grace=2.0) as gw:
        await until(lambda: gw.health()["status"] == "degraded", "health to name the key")
        reasons = (await http_health(gw))["reasons"]
        assert len(reasons) == 1
        assert reasons[0].startswith("model: The model openai/gpt-4o-mini needs an API key")
        assert "OPENAI_API_KEY" in reasons[0]


async def test_a_model_failing_its_last_calls_degrades_health_until_it_answers(
        make_config: MakeConfig, llm: ScriptedLLM) -> None:
    config = make_config(agent={"max_retries": 0, "degraded_after_failures": 2})
    llm.error(500, "down").error(500, "still down")
    async with Gateway(config, grace=2.0) as gw:
        assert "kept failing" in await gw.local.ask("c1", "one")
        assert gw.health()["status"] == "ok"  # one failure is not a pattern
        assert "kept failing" in await gw.local.ask("c1", "two")
        health = await http_health(gw)
        assert health["status"] == "degraded"
        assert health["reasons"][0].startswith("model: the last 2 model calls failed")

        llm.reply("back")
        assert await gw.local.ask("c1", "three") == "back"
        assert (await http_health(gw))["reasons"] == []


async def test_parley_status_shows_why_the_gateway_is_degraded(
        tmp_path: Path, llm: ScriptedLLM) -> None:
    with socket.socket() as sock:  # the port `parley status` reads health from
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    path = write_config(tmp_path, llm)
    data = yaml.safe_load(path.read_text())
    data["channels"]["local"]["port"] = port
    path.write_text(yaml.safe_dump(data))
    config = load_config(path)
    async with Gateway(config, grace=2.0):
        shutil.rmtree(config.data_path)
        _, out, err = await parley("status", "--config", str(path))  # its exit code: the CLI's
    assert "health:   degraded" in out, err
    assert f"  reason: storage: database {config.db_path} is gone" in out
