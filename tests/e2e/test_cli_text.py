"""The ``parley`` command shows what was stored as text, and its small promises hold:
``--version``, plain output unwrapped, cron's times and channels, ``config check``'s key line,
``pairing revoke``. Real subprocesses against the scripted model."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from tests.e2e.test_cli import _env, parley, write_config
from tests.fakes.openai_server import ScriptedLLM

MARKUP = "[red]RED[/red] and [note] and [/bold] and [bold]b"


async def test_version() -> None:
    code, out, _ = await parley("--version")
    assert code == 0 and out.startswith("parley 0.")


async def test_sessions_show_prints_stored_markup_as_text(tmp_path: Path,
                                                          llm: ScriptedLLM) -> None:
    llm.reply(f"echo: {MARKUP}")
    config = str(write_config(tmp_path, llm))
    code, _, err = await parley("chat", "-m", MARKUP, "--config", config)
    assert code == 0, err
    code, out, err = await parley("sessions", "show", "terminal:terminal", "--config", config)
    assert code == 0, err
    assert "Traceback" not in err
    assert f"user {MARKUP}" in out
    assert f"assistant echo: {MARKUP}" in out
    code, out, err = await parley("sessions", "show", "no[/x]such", "--config", config)
    assert code == 1 and "no session 'no[/x]such'" in err and "Traceback" not in err


async def test_plain_chat_output_is_not_wrapped(tmp_path: Path, llm: ScriptedLLM) -> None:
    line = " ".join(f"word{i}" for i in range(60))  # ~400 characters, one line
    llm.reply(f"{line}\n\nsecond paragraph").reply(line)
    config = str(write_config(tmp_path, llm))
    env = {k: v for k, v in _env().items() if k != "COLUMNS"}  # a pipe: rich assumes 80
    code, out, err = await parley("chat", "-m", "hi", "--plain", "--config", config, env=env)
    assert code == 0, err
    assert f"{line}\n\nsecond paragraph" in out
    code, out, _ = await parley("chat", "--plain", "--config", config, env=env,
                                stdin=b"again\n/exit\n")
    assert code == 0 and line in out


async def test_cron_add_with_markup_in_the_name_saves_once(tmp_path: Path) -> None:
    config = str(write_config(tmp_path, None))
    code, out, err = await parley("cron", "add", "--name", "job[/x]", "--message", "[b]hi",
                                  "--every", "1h30m", "--channel", "local", "--to", "c1",
                                  "--config", config)
    assert code == 0, err
    assert "added reminder" in out and "(job[/x]): every 90m" in out
    for columns in ("200", "80"):
        code, out, err = await parley("cron", "list", "--config", config,
                                      env={**_env(), "COLUMNS": columns})
        assert code == 0, err
        assert "job[/x]" in out and "Traceback" not in err
    code, out, err = await parley("cron", "add", "--name", "job[/x]", "--message", "[b]hi",
                                  "--every", "90m", "--channel", "local", "--to", "c1",
                                  "--config", config)  # a retry: the same job again
    assert code == 0 and "already scheduled (nothing added): reminder" in out, err
    with sqlite3.connect(tmp_path / "data" / "parley.db") as db:
        assert db.execute("SELECT COUNT(*) FROM cron_jobs").fetchone() == (1,)


async def test_cron_at_a_time_of_day_and_unknown_channels(tmp_path: Path) -> None:
    config = str(write_config(tmp_path, None))
    code, out, err = await parley("cron", "add", "--name", "m", "--message", "x", "--at",
                                  "09:00", "--tz", "Europe/Berlin", "--channel", "local",
                                  "--to", "c1", "--config", config)
    assert code == 0, err
    assert " 09:00:00 CE" in out  # the next 09:00 in Berlin (CET or CEST)
    code, _, err = await parley("cron", "add", "--name", "m", "--message", "x", "--at", "1h",
                                "--channel", "telegarm", "--to", "1", "--config", config)
    assert code == 1
    assert "'telegarm' is not a channel" in err and "telegram" in err and "local" in err
    code, _, err = await parley("cron", "add", "--name", "m", "--message", "x", "--at",
                                "25:00", "--channel", "local", "--to", "1", "--config", config)
    assert code == 1 and "is not a time" in err and "09:00" in err


async def test_config_check_says_whether_the_key_is_there(tmp_path: Path) -> None:
    config = str(write_config(tmp_path, None))  # openai/test-model, no api_key, no api_base
    code, out, _ = await parley("config", "check", "--config", config)
    assert code == 0
    assert "key MISSING: export OPENAI_API_KEY" in out
    code, out, _ = await parley("config", "check", "--config", config,
                                env=_env(OPENAI_API_KEY="sk-from-env"))
    assert code == 0
    assert "key from the environment (OPENAI_API_KEY)" in out
    assert "sk-from-env" not in out
