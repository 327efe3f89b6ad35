"""The rule a live OpenAI stream follows when the stored answer and the text already sent
differ (``channels/openai_live.Relay``): pure, so every case is checked on its own."""

from __future__ import annotations

from channels.openai_live import BREAK, Relay


def test_text_goes_out_as_written_and_the_final_adds_the_rest() -> None:
    r = Relay()
    assert r.live("\n Hello ") == "Hello"  # leading and trailing whitespace wait
    assert r.live("\n Hello wor") == " wor"
    assert r.final("Hello world.") == "ld."
    assert r.sent == "Hello world."


def test_a_retry_that_writes_the_same_text_again_sends_nothing_twice() -> None:
    r = Relay()
    r.live("The weather is")
    assert r.live("") == ""  # taken back: the client keeps what it has
    assert r.live("The wea") == ""
    assert r.live("The weather is sunny") == " sunny"
    assert r.final("The weather is sunny.") == "."
    assert r.sent == "The weather is sunny."


def test_text_replaced_by_other_text_is_followed_by_a_break_and_the_answer_whole() -> None:
    r = Relay()
    r.live("Let me look.")
    r.live("")
    assert r.live("Two") == BREAK + "Two"
    assert r.final("Two files.") == " files."
    assert r.sent == "Let me look.\n\nTwo files."


def test_an_error_line_after_text_ends_the_stream_whole() -> None:
    r = Relay()
    r.live("Half an ans")
    assert r.final("The model kept failing.") == BREAK + "The model kept failing."


def test_a_final_shorter_than_what_was_sent_comes_whole_after_a_break() -> None:
    r = Relay()
    r.live("Hello world")
    assert r.final("Hello") == BREAK + "Hello"
