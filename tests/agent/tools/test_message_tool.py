"""The message tool through the real registry, with a recording ``send`` service."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from agent.tools import build_registry
from agent.turn import TurnContext, TurnServices
from gateway.kernel.config import ToolsConfig
from gateway.kernel.events import InboundMessage, OutboundMessage
from gateway.kernel.values import Delivery

RECEIVED = datetime(2025, 1, 6, 8, 0, tzinfo=UTC)


class Sender:
    def __init__(self, *results: Delivery) -> None:
        self.results = list(results)
        self.sent: list[OutboundMessage] = []

    async def __call__(self, msg: OutboundMessage) -> Delivery:
        self.sent.append(msg)
        return self.results.pop(0) if self.results else Delivery(ok=True, message_ids=("1",))


def ctx(ws: Path, sender: Sender, *, allowed: list[str] | None = None,
        **kw: Any) -> TurnContext:
    tools = ToolsConfig.model_validate({"message": {"allowed_targets": allowed or []}})
    base: dict[str, Any] = {"session_override": "local:c1", "channel": "local",
                            "chat_id": "c1", "sender_id": "u1", "thread_id": "t9"}
    msg = InboundMessage(**{"trust": "owner", **base, **kw}, text="", received_at=RECEIVED)
    return TurnContext(message=msg, session_id=1, workspace=ws, tools=tools,
                       services=TurnServices(send=sender))


async def call(c: TurnContext, **args: Any) -> tuple[str, bool]:
    result = await build_registry(c.tools).execute("message", json.dumps(args), c)
    return result.text, result.is_error


async def test_sends_to_the_current_chat_and_marks_it_answered(tmp_path: Path) -> None:
    sender = Sender()
    c = ctx(tmp_path, sender)
    text, err = await call(c, text="Here you go")
    assert not err and "Delivered to the current chat" in text
    [msg] = sender.sent
    assert (msg.channel, msg.chat_id, msg.text, msg.kind, msg.thread_id) == (
        "local", "c1", "Here you go", "reply", "t9")
    assert c.notes.answered_current_chat is True


async def test_attaches_workspace_files_and_refuses_others(tmp_path: Path) -> None:
    (tmp_path / "report.pdf").write_bytes(b"%PDF-1.4")
    (tmp_path / "chart.png").write_bytes(b"\x89PNG")
    sender = Sender()
    c = ctx(tmp_path, sender)
    text, err = await call(c, text="files", files=["report.pdf", "chart.png"])
    assert not err and "2 file(s)" in text
    media = sender.sent[0].media
    assert [(m.kind, m.mime, Path(m.path or "").name) for m in media] == [
        ("file", "application/pdf", "report.pdf"), ("image", "image/png", "chart.png")]
    text, err = await call(c, text="x", files=["../../etc/passwd"])
    assert err and "outside the workspace" in text
    text, err = await call(c, text="x", files=["missing.txt"])
    assert err and "file not found" in text
    assert len(sender.sent) == 1


async def test_another_chat_only_when_allowed(tmp_path: Path) -> None:
    sender = Sender()
    c = ctx(tmp_path, sender, allowed=["telegram:42"])
    text, err = await call(c, text="hi", to="telegram:999")
    assert err and "not allowed" in text
    text, err = await call(c, text="hi", to="telegram:42")
    assert not err and text == "Delivered to telegram:42."
    [msg] = sender.sent
    assert (msg.channel, msg.chat_id, msg.thread_id) == ("telegram", "42", None)
    assert not c.notes.answered_current_chat  # the user's chat still gets a reply


async def test_reports_a_failed_delivery(tmp_path: Path) -> None:
    sender = Sender(Delivery(ok=False, error="Forbidden: bot was blocked by the user",
                             permanent=True))
    c = ctx(tmp_path, sender)
    text, err = await call(c, text="hello")
    assert err
    assert "NOT delivered to local:c1" in text and "bot was blocked" in text
    assert not c.notes.answered_current_chat


async def test_a_scheduled_turn_messages_its_target(tmp_path: Path) -> None:
    sender = Sender()
    c = ctx(tmp_path, sender, channel="cron", chat_id="job1", session_override="cron:job1",
            kind="cron", deliver_to=("telegram", "42"), thread_id=None)
    text, err = await call(c, text="Daily digest")
    assert not err
    [msg] = sender.sent
    assert (msg.channel, msg.chat_id, msg.kind) == ("telegram", "42", "cron")
    assert c.notes.answered_current_chat is True
    nowhere = ctx(tmp_path, sender, channel="heartbeat", chat_id="main", kind="heartbeat")
    text, err = await call(nowhere, text="x")
    assert err and "no chat of its own" in text


async def test_without_a_send_service(tmp_path: Path) -> None:
    c = replace(ctx(tmp_path, Sender()), services=TurnServices())
    text, err = await call(c, text="x")
    assert err and "cannot be sent" in text
