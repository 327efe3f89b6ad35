"""``parley onboard`` asks (and tries what it is given) and ``parley doctor`` checks for real:
both against the scripted model, the fake Bot API and the fake Discord on loopback."""

from __future__ import annotations

import socket
import stat
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml

from tests.e2e.test_cli import _env, parley, write_config
from tests.fakes.discord_server import FakeDiscord
from tests.fakes.openai_server import ScriptedLLM
from tests.fakes.telegram_server import FakeTelegram


@pytest.fixture
async def tg() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram() as server:
        yield server


def _secret_free(home: Path, *secrets: str) -> None:
    """No secret in any file but secrets.env."""
    for path in home.rglob("*"):
        if path.is_file() and path.name != "secrets.env":
            text = path.read_text(errors="replace")
            assert not any(s in text for s in secrets), path


async def test_onboard_non_interactive_tries_model_and_tokens(
        tmp_path: Path, llm: ScriptedLLM, tg: FakeTelegram, dc: FakeDiscord) -> None:
    home = tmp_path / "home"
    env = _env(MY_KEY="sk-test", TG_TOKEN=tg.token, DC_TOKEN=dc.token)
    args = ["onboard", "--dir", str(home), "--non-interactive", "--model", "openai/test-model",
            "--api-base", llm.base_url, "--api-key-env", "MY_KEY",
            "--telegram-token-env", "TG_TOKEN", "--telegram-base-url", tg.base_url,
            "--discord-token-env", "DC_TOKEN", "--discord-api-base", dc.api_base]
    llm.reply("OK")
    code, out, err = await parley(*args, env=env)
    assert code == 0, out + err
    assert "model: ok: openai/test-model answered 'OK' in" in out
    assert "telegram: ok: token accepted: @parley_bot" in out
    assert "discord: ok: token accepted: parley" in out
    data = yaml.safe_load((home / "config.yaml").read_text())
    assert data["agent"]["api_key"] == "${MY_KEY}"
    assert data["channels"]["telegram"]["token"] == "${TG_TOKEN}"
    assert data["channels"]["webchat"]["enabled"] is True
    _secret_free(home, "sk-test", tg.token, dc.token)
    assert tg.token not in out + err and dc.token not in out + err

    # A token the platform refuses: nothing is written, and the fix is named.
    llm.reply("OK")
    code, out, err = await parley(*args, "--force", env={**env, "TG_TOKEN": "1:wrong"})
    assert code == 1
    assert "telegram: FAILED: Telegram refused the token" in out
    assert "not written: telegram failed" in err
    # A secret given as a value instead of a variable's name is refused, never stored.
    code, _, err = await parley("onboard", "--dir", str(tmp_path / "other"), "--non-interactive",
                                "--model", "openai/x", "--api-key-env", "sk-live-123", env=env)
    assert code == 1 and "--api-key-env takes the NAME of an environment variable" in err
    assert "sk-live-123" not in err
    assert not (tmp_path / "other").exists()
    code, _, err = await parley("onboard", "--dir", str(tmp_path / "other"), "--non-interactive",
                                "--model", "openai/x", "--api-key-env", "NOT_SET_HERE", env=env)
    assert code == 1 and "--api-key-env NOT_SET_HERE: NOT_SET_HERE is not set" in err


async def test_onboard_asks(tmp_path: Path, llm: ScriptedLLM, tg: FakeTelegram) -> None:
    home = tmp_path / "home"
    answers = "\n".join([
        "3", llm.base_url, "test-model", "PARLEY_TEST_KEY", "y", "sk-typed-key",  # model
        "y", "1:wrong-token", tg.token, "1001",  # Telegram: a refused token, then the right one
        "n",  # Discord
        "",  # WebChat: the default (on)
    ]) + "\n"
    llm.reply("OK")
    code, out, err = await parley("onboard", "--dir", str(home), "--telegram-base-url",
                                  tg.base_url, stdin=answers.encode(), env=_env())
    assert code == 0, out + err
    assert "ok: openai/test-model answered 'OK'" in out
    assert "FAILED: Telegram refused the token" in out and "token accepted: @parley_bot" in out
    assert llm.last_request["model"] == "test-model"
    assert llm.request_headers[-1]["authorization"] == "Bearer sk-typed-key"
    for secret in ("sk-typed-key", tg.token):
        assert secret not in out + err  # never echoed
    _secret_free(home, "sk-typed-key", tg.token)
    secrets = home / "secrets.env"
    assert stat.S_IMODE(secrets.stat().st_mode) == 0o600
    assert secrets.read_text().splitlines() == ["PARLEY_TEST_KEY=sk-typed-key",
                                                f"TELEGRAM_BOT_TOKEN={tg.token}"]
    data = yaml.safe_load((home / "config.yaml").read_text())
    assert data["agent"] == {"model": "openai/test-model", "api_key": "${PARLEY_TEST_KEY}",
                             "api_base": llm.base_url}
    assert data["channels"]["telegram"]["allow_from"] == ["1001"]
    assert data["channels"]["webchat"]["enabled"] is True
    # The config reads its keys from secrets.env: the doctor finds everything in place.
    data["agent"]["tools"] = {"exec": {"enabled": False}}
    data["channels"]["local"]["port"] = data["channels"]["webchat"]["port"] = 0
    (home / "config.yaml").write_text(yaml.safe_dump(data))
    llm.reply("OK")
    code, out, err = await parley("doctor", "--config", str(home / "config.yaml"))
    assert code == 0, out + err
    assert "ok    key: set in the config" in out and "all checks passed" in out


async def test_doctor_passes_and_measures(tmp_path: Path, llm: ScriptedLLM,
                                          tg: FakeTelegram, dc: FakeDiscord) -> None:
    config = write_config(tmp_path, llm, tools={"exec": {"enabled": False}})
    data = yaml.safe_load(config.read_text())
    data["channels"].update(
        telegram={"enabled": True, "token": tg.token, "base_url": tg.base_url},
        discord={"enabled": True, "token": dc.token, "api_base": dc.api_base})
    config.write_text(yaml.safe_dump(data))
    llm.reply("OK")
    code, out, err = await parley("doctor", "--config", str(config))
    assert code == 0, out + err
    for line in ("ok    config: ", "ok    workspace: ", "ok    data_dir: ", "ok    key: ",
                 "ok    model: openai/test-model answered 'OK' in ", "ok    telegram: token "
                 "accepted: @parley_bot", "ok    discord: token accepted: parley",
                 "ok    sandbox: disabled", "ok    disk: ", "all checks passed"):
        assert line in out, line
    assert llm.calls == 1
    assert tg.token not in out and dc.token not in out


async def test_doctor_fails_with_each_fix(tmp_path: Path, llm: ScriptedLLM,
                                          tg: FakeTelegram) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        config = write_config(tmp_path, None)  # no key: openai/test-model at OpenAI itself
        data = yaml.safe_load(config.read_text())
        data["data_dir"] = str(blocker)
        data["channels"]["local"]["port"] = port
        data["channels"]["telegram"] = {"enabled": True, "token": "1:wrong",
                                        "base_url": tg.base_url}
        config.write_text(yaml.safe_dump(data))
        code, out, err = await parley("doctor", "--config", str(config))
    assert code == 1, out + err
    assert "Traceback" not in err
    assert f"FAIL  data_dir: {blocker} is a file, not a folder" in out
    assert "FAIL  key: no API key for openai/test-model" in out
    assert "fix: export OPENAI_API_KEY" in out
    assert "FAIL  telegram: Telegram refused the token" in out
    assert f"FAIL  ports: 127.0.0.1:{port} is already in use" in out
    assert "fix: stop it or set channels.local.port to a free port" in out
    assert out.count("FAIL  ") == out.count("fix: ") >= 4
    assert llm.calls == 0
