from __future__ import annotations

import asyncio
from datetime import datetime

import pytest

from gateway.kernel.bus import BusClosed, MessageBus
from gateway.kernel.events import InboundMessage, Media, OutboundMessage, new_id


def msg(text: str = "hi", **kw: object) -> InboundMessage:
    return InboundMessage(channel="local", chat_id="c1", sender_id="u1", text=text,
                          **kw)  # type: ignore[arg-type]


async def test_publish_waits_when_full() -> None:
    bus = MessageBus(maxsize=1)
    await bus.publish_inbound(msg("a"))
    second = asyncio.create_task(bus.publish_inbound(msg("b")))
    await asyncio.sleep(0)
    assert not second.done()  # back-pressure: the producer waits
    assert (await bus.consume_inbound()).text == "a"
    await asyncio.wait_for(second, 10)
    assert (await bus.consume_inbound()).text == "b"


async def test_closed_bus_refuses_input_but_drains() -> None:
    bus = MessageBus()
    await bus.publish_inbound(msg("kept"))
    bus.close()
    with pytest.raises(BusClosed):
        await bus.publish_inbound(msg("late"))
    assert [m.text for m in bus.drain_inbound()] == ["kept"]


async def test_outbound_join() -> None:
    bus = MessageBus()
    await bus.publish_outbound(OutboundMessage(channel="local", chat_id="c1", text="x"))
    joined = asyncio.create_task(bus.join_outbound())
    await bus.consume_outbound()
    bus.outbound_done()
    await asyncio.wait_for(joined, 10)


def test_events_are_frozen_and_keyed() -> None:
    m = msg(thread_id="t9")
    assert m.session_key == "local:c1:t9"
    assert msg(session_override="shared:main").session_key == "shared:main"
    with pytest.raises(AttributeError):
        m.text = "changed"  # type: ignore[misc]
    with pytest.raises(ValueError):
        msg(received_at=datetime(2026, 1, 1))  # noqa: DTZ001 - naive on purpose
    with pytest.raises(ValueError):
        Media(kind="image")
    assert msg("/new").is_command and not msg("hello").is_command


def test_inbox_rows_of_earlier_versions_keep_their_flags() -> None:
    """Before they were fields, the context-only and merged-senders flags were metadata."""
    from gateway.kernel.events import InboundMessage, event_to_dict

    old = event_to_dict(InboundMessage(channel="telegram", chat_id="-1", sender_id="7",
                                       text="chatter"))
    del old["context_only"], old["senders_inline"]
    old["metadata"] = {"context_only": True, "senders_inline": True, "other": 1}
    msg = InboundMessage.from_dict(old)
    assert msg.context_only and msg.senders_inline and msg.metadata == {"other": 1}
    assert InboundMessage.from_dict(event_to_dict(msg)) == msg


def test_events_as_json_data_and_back() -> None:
    """Every field, each as JSON holds it (times as ISO text, tuples and media as lists), and
    back to an equal event."""
    import json
    from datetime import UTC, datetime

    from gateway.kernel.events import event_to_dict

    when = datetime(2026, 11, 27, 9, 30, tzinfo=UTC)
    photo = Media(kind="image", path="/tmp/a.png", mime="image/png")
    msg = InboundMessage(channel="discord", chat_id="5", sender_id="7", text="hi",
                         media=(photo,), received_at=when, deliver_to=("local", "c1"),
                         metadata={"k": [1]}, trust="owner", mentioned=True)
    data = event_to_dict(msg)
    assert data["received_at"] == "2026-11-27T09:30:00+00:00"
    assert data["deliver_to"] == ["local", "c1"] and data["media"] == [photo.to_dict()]
    assert data["trust"] == "owner" and data["mentioned"] is True
    assert InboundMessage.from_dict(json.loads(json.dumps(data))) == msg
    out = OutboundMessage(channel="local", chat_id="c1", text="yo", media=(photo,),
                          created_at=when, stream="s1")
    data = event_to_dict(out)
    assert data["created_at"] == "2026-11-27T09:30:00+00:00" and data["stream"] == "s1"
    assert OutboundMessage.from_dict(json.loads(json.dumps(data))) == out


def test_event_payload_is_event_to_dict_written() -> None:
    """The inbox's and outbox's payload: orjson's own writing of an event without media is
    the very text of ``event_to_dict`` written, naive and other-zone times and metadata
    included; with media, or a value orjson refuses, the long way gives the same."""
    import json
    from datetime import datetime, timedelta, timezone

    from gateway.kernel.events import event_to_dict
    from gateway.kernel.store_db import dump_json
    from gateway.kernel.store_queues import event_payload

    photo = Media(kind="image", path="/tmp/a.png", mime="image/png")
    events = [
        InboundMessage(channel="discord", chat_id="5", sender_id="7", text="héllo ✓",
                       received_at=datetime(2026, 11, 27, 9, 30, 0, 12,
                                            tzinfo=timezone(timedelta(hours=2))),
                       deliver_to=("local", "c1"), metadata={"k": [1, None]}),
        InboundMessage(channel="discord", chat_id="5", sender_id="7", text="hi",
                       metadata={"big": 2 ** 70}),
        InboundMessage(channel="discord", chat_id="5", sender_id="7", text="hi", media=(photo,)),
        OutboundMessage(channel="local", chat_id="c1", text="yo",
                        created_at=datetime(2026, 11, 27, 9, 30)),  # noqa: DTZ001 - naive too
        OutboundMessage(channel="local", chat_id="c1", text="yo", media=(photo,), stream="s"),
    ]
    for event in events:
        assert event_payload(event) == dump_json(event_to_dict(event))
        assert type(event).from_dict(json.loads(event_payload(event))) == event


def test_new_ids_are_base32_of_the_millisecond_then_45_random_bits(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import base64
    import os
    import time

    ids = {new_id() for _ in range(2000)}
    assert len(ids) == 2000 and all(len(value) == 18 for value in ids)
    for ms in (0, 1, 1_795_000_000_123, 2**45 - 1):
        for _ in range(50):  # the table's spelling is base64's base32hex, bit for bit
            bits = os.urandom(6)
            monkeypatch.setattr(os, "urandom", lambda n, bits=bits: bits)
            monkeypatch.setattr(time, "time_ns", lambda ms=ms: ms * 1_000_000 + 999_999)
            whole = ((ms << 45 | int.from_bytes(bits, "big") >> 3) << 30).to_bytes(15, "big")
            spelled = base64.b32hexencode(whole).decode().lower()[:18]
            assert new_id() == spelled
            monkeypatch.undo()
    # later ids sort later: a turn's rows go at the end of the indexes on turn ids
    clock = iter(range(1_795_000_000_000, 1_795_000_000_000 + 500))
    monkeypatch.setattr(time, "time_ns", lambda: next(clock) * 1_000_000)
    made = [new_id() for _ in range(500)]
    assert made == sorted(made)
