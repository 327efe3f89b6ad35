"""Busy-session policies: nothing dropped, commands never merged, folding flattens."""

from __future__ import annotations

from agent.queueing import Work, fold, merge, next_batch
from gateway.kernel.events import InboundMessage


def work(text: str, sender: str = "ann", chat_type: str = "direct") -> Work:
    return Work(InboundMessage(channel="local", chat_id="c1", sender_id=sender,
                               sender_name=sender.title(), text=text,
                               chat_type=chat_type))  # type: ignore[arg-type]


def test_merge_keeps_every_source_and_the_newest_routing() -> None:
    a, b = work("a"), work("b")
    merged = merge([a, b])
    assert merged.msg.text == "a\n\nb"
    assert merged.msg.message_id == b.msg.message_id
    assert merged.sources == [a.msg, b.msg]


def test_merge_in_groups_names_each_sender_once() -> None:
    merged = merge([work("hi", "ann", "group"), work("yo", "bob", "group")])
    assert merged.msg.text == "[Ann] hi\n\n[Bob] yo"
    assert merged.msg.senders_inline is True


def test_next_batch_per_mode() -> None:
    waiting = [work("a"), work("b"), work("/new"), work("c")]
    first, taken = next_batch(waiting, "followup")
    assert (first.msg.text, taken) == ("a", 1)
    merged, taken = next_batch(waiting, "collect")
    assert (merged.msg.text, taken) == ("a\n\nb", 2)  # stops at the command
    command, taken = next_batch(waiting[2:], "collect")
    assert (command.msg.text, taken) == ("/new", 1)


def test_fold_never_drops_and_flattens_repeated_folds() -> None:
    waiting: list[Work] = []
    for i in range(10):
        waiting = fold([*waiting, work(f"m{i}")], 3)
    assert len(waiting) == 3
    folded = waiting[0]
    assert folded.msg.text.startswith("[8 earlier messages sent while I was busy, folded]")
    assert all(f"Ann: m{i}" in folded.msg.text for i in range(8))
    assert [w.msg.text for w in waiting[1:]] == ["m8", "m9"]
    assert sum(len(w.sources) for w in waiting) == 10


def test_fold_line_stays_bounded() -> None:
    waiting = [work("x" * 500) for _ in range(100)]
    folded = fold(waiting, 2)[0]
    assert len(folded.msg.text) < 1400 and "more" in folded.msg.text
    assert len(folded.sources) == 99
