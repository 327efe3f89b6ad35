"""ContextBuilder: the contract's order, a stable system prompt, the runtime block and media.

History, trimming within budget and the snapshot are in ``test_context_history.py``, which
shares this file's builders (``make_builder``, ``inbound``, ``HINTS``).
"""

from __future__ import annotations

import base64
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from agent.budget import TokenCounter
from agent.context import LAYER_SEPARATOR, RUNTIME_TAG, ContextBuilder
from gateway.kernel.config import Config, parse_config
from gateway.kernel.events import InboundMessage, Media
from gateway.kernel.values import ChannelHints

# 2024-07-06 22:30 UTC is already Sunday 00:30 in Berlin (summer time, UTC+2)
RECEIVED = datetime(2024, 7, 6, 22, 30, tzinfo=UTC)
HINTS = ChannelHints(markup="Telegram HTML", max_length=4096,
                     etiquette="answer only when mentioned")
TINY_PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5E"
    "rkJggg==")
FILES = {
    "SOUL.md": "soul: be kind", "IDENTITY.md": "identity: Parley", "AGENTS.md": "agents: rules",
    "USER.md": "user: likes tea", "TOOLS.md": "tools: notes", "MEMORY.md": "memory: facts",
    "HEARTBEAT.md": "heartbeat: check mail",
}


@pytest.fixture(scope="module")
def counter() -> TokenCounter:
    return TokenCounter("openai/test-model")


def make_config(tmp_path: Path, **context: Any) -> Config:
    return parse_config({
        "workspace": str(tmp_path / "ws"), "data_dir": str(tmp_path / "data"),
        "agent": {"model": "openai/test-model", "timezone": "Europe/Berlin",
                  "context": {"max_context_tokens": 50_000, "reply_reserve_tokens": 0,
                              **context}},
    }, env={})


def make_builder(tmp_path: Path, counter: TokenCounter, **context: Any) -> ContextBuilder:
    config = make_config(tmp_path, **context)
    config.workspace_path.mkdir(parents=True, exist_ok=True)
    return ContextBuilder(config, counter, builtin_skills=None)


def test_builtin_skills_are_listed_and_a_workspace_skill_overrides_one(
        tmp_path: Path, counter: TokenCounter) -> None:
    config = make_config(tmp_path)
    builder = ContextBuilder(config, counter)
    system = builder.system_prompt().text
    assert "- write-skill: Create or improve a skill" in system
    own = config.workspace_path / "skills" / "write-skill" / "SKILL.md"
    own.parent.mkdir(parents=True)
    own.write_text("---\nname: write-skill\ndescription: My own way.\n---\nsteps")
    system = builder.system_prompt().text
    assert "- write-skill: My own way. (path: skills/write-skill/SKILL.md" in system
    assert "Create or improve" not in system


def inbound(text: str = "hello there", **kw: Any) -> InboundMessage:
    fields: dict[str, Any] = {"channel": "telegram", "chat_id": "c42", "sender_id": "u7",
                              "sender_name": "Alice", "received_at": RECEIVED}
    fields.update(kw)
    return InboundMessage(text=text, **{"trust": "owner", **fields})


def write_workspace(ws: Path, files: dict[str, str] = FILES) -> None:
    for name, text in files.items():
        (ws / name).write_text(text)


def write_skill(ws: Path, folder: str, text: str) -> Path:
    path = ws / "skills" / folder / "SKILL.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def bump(path: Path) -> None:
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10_000_000_000))


# system prompt ------------------------------------------------------------------------------

def test_system_layers_in_contract_order(tmp_path: Path, counter: TokenCounter) -> None:
    builder = make_builder(tmp_path, counter)
    ws = builder.workspace
    write_workspace(ws)
    write_skill(ws, "style", "---\nname: style\ndescription: House style.\nalways: true\n---\n"
                             "Write short sentences.")
    write_skill(ws, "weather", "---\nname: weather\ndescription: Look up the weather.\n---\n"
                               "Use curl.")

    built = builder.build(inbound=inbound(), history=[], hints=HINTS)
    system = built.messages[0]
    assert system["role"] == "system"
    layers = system["content"].split(LAYER_SEPARATOR)
    assert layers[0].startswith("# Runtime")
    assert str(ws) in layers[0]
    assert "Model: openai/test-model" in built.messages[-2]["content"]  # the runtime block's
    assert layers[1:7] == ["soul: be kind", "identity: Parley", "agents: rules",
                           "user: likes tea", "tools: notes", "memory: facts"]
    assert layers[7] == "# Skill: style\n\nWrite short sentences."
    assert layers[8].startswith("# Skills\n")
    assert "- weather: Look up the weather. (path: skills/weather/SKILL.md; available)" \
        in layers[8]
    assert "style" not in layers[8]
    assert len(layers) == 9  # no HEARTBEAT.md outside heartbeat turns
    assert "heartbeat: check mail" not in system["content"]
    assert list(built.snapshot["layers"])[:9] == [
        "identity", "SOUL.md", "IDENTITY.md", "AGENTS.md", "USER.md", "TOOLS.md", "memory",
        "skills_always", "skills_summary"]
    assert built.snapshot["sources"]["skills"] == 2

    beat = builder.build(inbound=inbound("check", kind="heartbeat"), history=[], hints=HINTS)
    beat_layers = beat.messages[0]["content"].split(LAYER_SEPARATOR)
    assert beat_layers[:9] == layers
    assert beat_layers[9:] == ["heartbeat: check mail"]


def test_unavailable_always_skill_is_only_summarised(tmp_path: Path,
                                                     counter: TokenCounter) -> None:
    builder = make_builder(tmp_path, counter)
    write_skill(builder.workspace, "gh", "---\nname: gh\ndescription: GitHub.\nalways: true\n"
                "requires:\n  bins: [parley-no-such-cmd]\n---\nSECRET BODY")
    text = builder.system_prompt().text
    assert "SECRET BODY" not in text
    assert "- gh: GitHub. (path: skills/gh/SKILL.md; unavailable: missing command " \
           "parley-no-such-cmd)" in text


def test_missing_files_are_skipped(tmp_path: Path, counter: TokenCounter) -> None:
    builder = make_builder(tmp_path, counter)
    write_workspace(builder.workspace, {"AGENTS.md": "agents: rules", "MEMORY.md": "",
                                        "USER.md": "user: likes tea"})
    prompt = builder.system_prompt(heartbeat=True)
    assert [layer.name for layer in prompt.layers] == ["identity", "AGENTS.md", "USER.md"]
    assert prompt.text.split(LAYER_SEPARATOR)[1:] == ["agents: rules", "user: likes tea"]
    assert "\n\n---\n\n\n\n---\n\n" not in prompt.text


def test_system_prompt_is_stable_until_a_file_changes(tmp_path: Path,
                                                      counter: TokenCounter) -> None:
    builder = make_builder(tmp_path, counter)
    write_workspace(builder.workspace)
    skill = write_skill(builder.workspace, "weather", "---\ndescription: v1\n---\nbody")
    first = builder.build(inbound=inbound("one"), history=[], hints=HINTS).messages[0]
    second = builder.build(inbound=inbound("two"), history=[], hints=HINTS).messages[0]
    assert second["content"] == first["content"]
    # a fresh builder on the same workspace gives the very same bytes
    other = make_builder(tmp_path, counter).build(inbound=inbound(), history=[], hints=HINTS)
    assert other.messages[0]["content"].encode() == first["content"].encode()

    user = builder.workspace / "USER.md"
    user.write_text("user: likes coffee now")
    bump(user)
    third = builder.build(inbound=inbound(), history=[], hints=HINTS).messages[0]["content"]
    assert "user: likes coffee now" in third and "likes tea" not in third

    skill.write_text("---\ndescription: v2\n---\nbody")
    bump(skill)
    fourth = builder.build(inbound=inbound(), history=[], hints=HINTS).messages[0]["content"]
    assert "weather: v2" in fourth and "weather: v1" not in fourth


def test_heartbeat_prompt_follows_skill_edits_made_between_heartbeats(
        tmp_path: Path, counter: TokenCounter) -> None:
    """Heartbeat and ordinary turns keep separate cached prompts; a skill edited several
    times between two heartbeats must still show its latest text in the next one (a cache
    keyed on id() of the skills hits here: freed objects' ids come back)."""
    builder = make_builder(tmp_path, counter)
    skill = write_skill(builder.workspace, "weather", "---\ndescription: v0\n---\nbody")
    assert "weather: v0" in builder.system_prompt(heartbeat=True).text
    version = 0
    for edits in (1, 2, 3, 4, 5, 4, 4):
        for _ in range(edits):
            version += 1
            skill.write_text(f"---\ndescription: v{version}\n---\nbody")
            bump(skill)
            assert f"weather: v{version}" in builder.system_prompt().text
        assert f"weather: v{version}" in builder.system_prompt(heartbeat=True).text


def test_bootstrap_cut_is_reported(tmp_path: Path, counter: TokenCounter) -> None:
    builder = make_builder(tmp_path, counter, bootstrap_max_chars=1_000)
    (builder.workspace / "AGENTS.md").write_text("x" * 5_000)
    built = builder.build(inbound=inbound(), history=[], hints=HINTS)
    assert built.snapshot["bootstrap_cuts"] == ["AGENTS.md: cut from 5,000 to 1,000 characters"]
    assert "characters of AGENTS.md cut here" in built.messages[0]["content"]


# runtime block and user message -------------------------------------------------------------

def test_runtime_block(tmp_path: Path, counter: TokenCounter) -> None:
    builder = make_builder(tmp_path, counter)
    built = builder.build(inbound=inbound(thread_id="t9"), history=[], hints=HINTS)
    runtime, user = built.messages[-2:]
    assert runtime["role"] == "user" and user["role"] == "user"
    lines = runtime["content"].splitlines()
    assert lines[0] == RUNTIME_TAG
    assert lines[1] == "Time: 2024-07-07 00:30:00 Europe/Berlin (UTC+0200), Sunday"
    assert lines[2:] == [
        "Channel: telegram", "Chat ID: c42", "Chat type: direct", "Thread: t9",
        "Sender: Alice (id u7)", "Sender trust: owner", "Model: openai/test-model",
        "Channel hints:",
        "- Markup: Telegram HTML",
        "- Message length limit: 4096 characters (longer replies are split)",
        "- Etiquette: answer only when mentioned"]
    assert user["content"] == "hello there"
    assert built.user_message == {"role": "user", "content": "hello there"}


def test_runtime_time_comes_from_the_message(tmp_path: Path, counter: TokenCounter) -> None:
    builder = make_builder(tmp_path, counter)
    winter = datetime(2024, 1, 15, 8, 5, tzinfo=UTC)
    block = builder.runtime_block(inbound(received_at=winter), HINTS)
    assert "Time: 2024-01-15 09:05:00 Europe/Berlin (UTC+0100), Monday" in block


def test_group_message(tmp_path: Path, counter: TokenCounter) -> None:
    builder = make_builder(tmp_path, counter)
    built = builder.build(inbound=inbound("hi all", chat_type="group", mentioned=True),
                          history=[], hints=HINTS)
    assert built.user_message["content"] == "[Alice] hi all"
    assert built.messages[-1]["content"] == "[Alice] hi all"
    runtime = built.messages[-2]["content"]
    assert "Chat type: group" in runtime and "Mentioned: yes" in runtime
    direct = builder.build(inbound=inbound("hi"), history=[], hints=HINTS)
    assert direct.user_message["content"] == "hi" and "Mentioned" not in direct.messages[-2][
        "content"]
    anon = builder.build(inbound=inbound("yo", chat_type="group", sender_name=None),
                         history=[], hints=HINTS)
    assert anon.user_message["content"] == "[u7] yo"


def test_images_become_base64_parts(tmp_path: Path, counter: TokenCounter) -> None:
    builder = make_builder(tmp_path, counter)
    png = tmp_path / "dot.png"
    png.write_bytes(TINY_PNG)
    pdf = tmp_path / "report.pdf"
    msg = inbound("what is this?", media=(
        Media(kind="image", path=str(png), mime="image/png"),
        Media(kind="file", path=str(pdf), mime="application/pdf", size=1234)))
    built = builder.build(inbound=msg, history=[], hints=HINTS)
    text_part, image_part = built.messages[-1]["content"]
    assert image_part == {"type": "image_url", "image_url": {
        "url": "data:image/png;base64," + base64.b64encode(TINY_PNG).decode()}}
    assert text_part["type"] == "text"
    assert text_part["text"].startswith("what is this?")
    assert f"[attached file: {pdf} (application/pdf, 1234 bytes)]" in text_part["text"]
    # what is stored is text only: no base64 in the session log
    assert built.user_message["content"] == text_part["text"]
    assert f"[image: {png}]" in built.user_message["content"]
    assert "data:image" not in built.user_message["content"]
    assert built.snapshot["sources"]["images"] == 1
    assert built.snapshot["layers"]["user"] > counter.count_message(built.user_message)


def test_non_image_media_is_a_note(tmp_path: Path, counter: TokenCounter) -> None:
    builder = make_builder(tmp_path, counter)
    msg = inbound("listen", media=(Media(kind="audio", url="https://x.test/a.ogg"),))
    built = builder.build(inbound=msg, history=[], hints=HINTS)
    content = built.messages[-1]["content"]
    assert isinstance(content, str)
    assert content == "listen\n[attached audio: https://x.test/a.ogg (unknown type, ? bytes)]"


def test_unreadable_image_is_noted(tmp_path: Path, counter: TokenCounter) -> None:
    builder = make_builder(tmp_path, counter)
    msg = inbound("see", media=(Media(kind="image", path=str(tmp_path / "gone.png")),))
    (text_part,) = builder.build(inbound=msg, history=[], hints=HINTS).messages[-1]["content"]
    assert "[image gone.png could not be read" in text_part["text"]


def test_context_hash_forms() -> None:
    """The fingerprint is "3:" and the SHA-256 of the messages' own SHA-256 digests, each of a
    message in sorted-key compact JSON (key order does not change it, a new message does, and
    so does moving a byte from one message to the next); a stored fingerprint of form 2 (the
    SHA-256 of the whole list so written) or of the first form (bare SHA-256 of
    ``json.dumps(messages, sort_keys=True)``) gets that form back, and a later call's
    fingerprint keeps its first call's form."""
    import hashlib
    import json

    import orjson

    from agent.context import context_hash
    from agent.fingerprint import call_hash

    def sha(data: bytes) -> hashlib._Hash:
        return hashlib.sha256(data)

    history = [{"role": "user", "content": "héllo"},
               {"role": "assistant", "content": None, "tool_calls": [{"id": "1", "b": 2}]}]
    new = context_hash(history)
    assert new == "3:" + sha(b"".join(sha(orjson.dumps(m, option=orjson.OPT_SORT_KEYS)).digest()
                                      for m in history)).hexdigest()
    assert context_hash([{"content": "héllo", "role": "user"}, history[1]]) == new
    assert context_hash([*history, {"role": "user", "content": "a"}]) != \
        context_hash([*history, {"role": "user", "content": "b"}])
    assert context_hash([{"role": "user", "content": "ab"}, {"role": "user", "content": "c"}]) \
        != context_hash([{"role": "user", "content": "a"}, {"role": "user", "content": "bc"}])
    second = "2:" + sha(orjson.dumps(history, option=orjson.OPT_SORT_KEYS)).hexdigest()
    assert context_hash(history, like="2:" + "0" * 64) == second
    first = sha(json.dumps(history, sort_keys=True, ensure_ascii=False).encode()).hexdigest()
    assert context_hash(history, like="0" * 64) == first
    assert context_hash(history, like=new) == new
    assert call_hash(new, history, {}).startswith("3:")
    assert call_hash(second, history, {}).startswith("2:")
    assert call_hash(first, history, {}) == hashlib.sha256(json.dumps(
        {"base": first, "added": history, "shortened": []}, sort_keys=True,
        ensure_ascii=False).encode()).hexdigest()
