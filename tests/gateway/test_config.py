"""Config: YAML, ${VAR} substitution, durations, unknown keys, and the example file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from gateway.kernel.config import Config, ConfigError, load_config, parse_config, parse_duration

ROOT = Path(__file__).resolve().parents[2]


def errors_of(data: Any, env: dict[str, str] | None = None) -> list[tuple[str, str]]:
    with pytest.raises(ConfigError) as info:
        parse_config(data, env=env or {})
    return info.value.errors


@pytest.mark.parametrize(("text", "seconds"), [
    ("90s", 90), ("30m", 1800), ("2h", 7200), ("1.5d", 129600), ("250ms", 0.25), (45, 45),
    ("12", 12), ("1h30m", 5400), ("1d 12h", 129600), ("2m30s", 150)])
def test_durations(text: Any, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("bad", ["soon", "5 minutes", "-3s", True, "1h30", "h30m", "1h-30m"])
def test_bad_durations(bad: Any) -> None:
    with pytest.raises(ValueError):
        parse_duration(bad)


def test_env_substitution() -> None:
    env = {"MODEL": "openai/gpt-4o", "PORT": "9000"}
    config = parse_config({"agent": {"model": "${MODEL}", "api_key": "${KEY:-}"},
                           "channels": {"local": {"port": "${PORT}", "host": "${H:-::1}"}}},
                          env=env)
    assert config.agent.model == "openai/gpt-4o"
    assert config.agent.api_key is None
    assert config.channels.local.port == 9000 and config.channels.local.host == "::1"


def test_missing_variable_names_the_key() -> None:
    assert errors_of({"agent": {"fallbacks": ["a", "${NOPE}"]}}) == [
        ("agent.fallbacks[1]", "environment variable NOPE is not set "
                               "(write ${NOPE:-default} to give a default)")]


def test_unknown_and_invalid_keys_are_each_named() -> None:
    errs = dict(errors_of({"agnet": {}, "agent": {"context": {"max_recent_messages": 0},
                                                   "queue_mode": "fifo", "timezone": "Mars/Base"}}))
    assert errs["agnet"] == "unknown key"
    assert "greater than 0" in errs["agent.context.max_recent_messages"]
    assert "'collect', 'followup' or 'steer'" in errs["agent.queue_mode"]
    assert errs["agent.timezone"] == "unknown IANA timezone 'Mars/Base'"


def test_not_a_mapping() -> None:
    assert errors_of(["a"])[0][1] == "the config must be a mapping of keys to values"


def test_relative_paths_follow_the_config_file(tmp_path: Path) -> None:
    path = tmp_path / "conf" / "parley.yaml"
    path.parent.mkdir()
    path.write_text("workspace: ws\ndata_dir: ../data\n")
    config = load_config(path, env={})
    assert config.workspace_path == (tmp_path / "conf" / "ws").resolve()
    assert config.db_path == (tmp_path / "data" / "parley.db").resolve()


def test_config_env_var_finds_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("agent:\n  model: openai/x\n")
    monkeypatch.setenv("PARLEY_CONFIG", str(path))
    assert load_config().agent.model == "openai/x"


def _keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    out = []
    for name, field in model.model_fields.items():
        out.append(prefix + name)
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            out += _keys(ann, f"{prefix}{name}.")
    return out


def test_example_config_is_valid_and_documents_every_option() -> None:
    example = ROOT / "config.example.yaml"
    config = load_config(example, env={})
    assert config.channels.local.host == "127.0.0.1"
    assert config.agent.tools.files.restrict_to_workspace is True
    data = yaml.safe_load(example.read_text())

    def has(path: str) -> bool:
        node: Any = data
        for part in path.split("."):
            if not isinstance(node, dict) or part not in node:
                return False
            node = node[part]
        return True

    missing = [k for k in _keys(Config) if not has(k)]
    assert missing == []


def test_bad_usage_limits_and_models_are_named() -> None:
    errs = dict(errors_of({"agent": {
        "limits": {"guest": {"messages_per_minute": 0}, "people": {"ada": {}},
                   "member": {"per_hour": 3}},
        "models": {"aliases": {"fast": {}}, "switch": ["admin"]},
        "usage": {"prices": {"m": {"input": -1}}}}}))
    assert "greater than 0" in errs["agent.limits.guest.messages_per_minute"]
    assert "'ada' is not a person: write channel:id" in errs["agent.limits.people"]
    assert errs["agent.limits.member.per_hour"] == "unknown key"
    assert "agent.models.aliases.fast.model" in errs
    assert "agent.models.switch[0]" in errs
    assert "greater than or equal to 0" in errs["agent.usage.prices.m.input"]
    errs = dict(errors_of({"agent": {"models": {"aliases": {"default": {"model": "x"}}}}}))
    assert "'default' is reserved" in errs["agent.models.aliases"]
    errs = dict(errors_of({"agent": {"chats": {"local:x": {"model": "smart"}}}}))
    assert "chats.local:x.model: 'smart' is not an alias" in errs["agent"]


def test_secrets_env_beside_the_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``${NAME}`` reads the environment first, then ``secrets.env`` beside the config."""
    monkeypatch.delenv("PARLEY_T_KEY", raising=False)
    monkeypatch.setenv("PARLEY_T_BASE", "http://from-env/v1")
    (tmp_path / "config.yaml").write_text("agent:\n  api_key: ${PARLEY_T_KEY}\n"
                                          "  api_base: ${PARLEY_T_BASE}\n")
    (tmp_path / "secrets.env").write_text("# keys\nexport PARLEY_T_KEY='sk-file'\n"
                                          "PARLEY_T_BASE=http://from-file/v1\n")
    config = load_config(tmp_path / "config.yaml")
    assert config.agent.api_key == "sk-file"
    assert config.agent.api_base == "http://from-env/v1"
    (tmp_path / "secrets.env").write_text("not a line\n")
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "config.yaml")
    assert info.value.errors == [("line 1", "expected NAME=value")]
