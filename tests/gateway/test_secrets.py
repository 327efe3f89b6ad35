"""Secrets stay out of what the gateway writes: the names that mark one, every config secret,
their encodings, log records, and a tool result on its way back to the model."""

from __future__ import annotations

import base64
import io
import logging
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest

from gateway.app import Gateway
from gateway.kernel.config import parse_config
from gateway.kernel.secrets import (
    MARK,
    SECRETS,
    RedactingFilter,
    Secrets,
    is_secret_name,
)
from tests.conftest import MakeConfig
from tests.fakes.openai_server import ScriptedLLM

KEY = "sk-proj-7f3a9c2e5b1d4f6a8c0e"


@pytest.fixture
def secrets() -> Iterator[Secrets]:
    found = Secrets()
    found.add(KEY)
    yield found


def test_secret_names() -> None:
    for name in ("OPENAI_API_KEY", "DB_PW", "MAIL_PASS", "SMTP_PASSWORD", "GH_TOKEN",
                 "SESSION_SECRET", "DATABASE_URL", "AWS_REGION", "X_AUTH", "PGPASSWORD"):
        assert is_secret_name(name), name
    for name in ("PATH", "HOME", "GIT_AUTHOR_NAME", "LANG", "PASSAGE", "PYTHONPATH"):
        assert not is_secret_name(name), name


@pytest.mark.parametrize("prefix", ["", "a", "ab", "abc", "OPENAI_API_KEY="])
def test_every_encoding_at_every_alignment(secrets: Secrets, prefix: str) -> None:
    blob = f"{prefix}{KEY}\nNEXT=1\n".encode()
    for encoded in (base64.b64encode(blob).decode(), base64.urlsafe_b64encode(blob).decode(),
                    blob.hex(), blob.hex().upper(), quote(blob.decode(), safe="")):
        cleaned = secrets.redact(f"output: {encoded} done")
        assert MARK in cleaned, encoded
    assert secrets.redact("nothing to see") == "nothing to see"


def test_config_secrets_are_found() -> None:
    config = parse_config({
        "agent": {"api_key": "plain-api-key-123",
                  "fallbacks": [{"model": "openai/x", "api_key": "fallback-key-456"}],
                  "mcp": {"servers": [
                      {"name": "web", "url": "http://127.0.0.1:9/mcp",
                       "headers": {"Authorization": "Bearer header-secret-789"}},
                      {"name": "cmd", "command": "true", "env": {"GH_TOKEN": "env-token-abc",
                                                                 "LANG": "C.UTF-8-long"}}]}},
        "channels": {"telegram": {"enabled": True, "token": "123456:telegram-token-def"}},
    }, env={})
    found = Secrets()
    found.add_config(config)
    text = found.redact("plain-api-key-123 fallback-key-456 Bearer header-secret-789 "
                        "env-token-abc 123456:telegram-token-def C.UTF-8-long")
    assert text == f"{MARK} {MARK} {MARK} {MARK} {MARK} C.UTF-8-long"


def test_log_records_are_rewritten(secrets: Secrets) -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(RedactingFilter(secrets))
    logger = logging.getLogger("tests.secrets")
    logger.addHandler(handler)
    try:
        logger.warning("calling with %s", KEY)
        try:
            raise RuntimeError(f"bad key {base64.b64encode(KEY.encode()).decode()}")
        except RuntimeError:
            logger.exception("failed")
    finally:
        logger.removeHandler(handler)
    written = stream.getvalue()
    assert KEY not in written and base64.b64encode(KEY.encode()).decode() not in written
    assert written.count(MARK) == 2


async def test_a_tool_result_never_carries_the_key(make_config: MakeConfig, llm: ScriptedLLM,
                                                   tmp_path: Path) -> None:
    config = make_config(agent={"api_key": KEY})
    workspace = config.workspace_path
    workspace.mkdir(parents=True)
    (workspace / "leak.txt").write_text(base64.b64encode(f"key={KEY}".encode()).decode())
    llm.tool_call("read_file", {"path": "leak.txt"}).reply(f"here it is: {KEY}")
    try:
        async with Gateway(config) as gw:
            reply = await gw.local.ask("c1", "show me leak.txt", timeout=10)
            assert gw.store is not None
            session = await gw.store.active_session("local:c1")
            snapshot = await gw.store.latest_snapshot(session.id)
    finally:
        SECRETS.clear()
    tool_text = [m["content"] for m in llm.last_request["messages"] if m["role"] == "tool"][0]
    assert MARK in tool_text and KEY[6:20] not in tool_text
    assert reply == f"here it is: {MARK}"  # nor the chat, whatever the model says
    assert snapshot is not None and KEY not in str(snapshot)
