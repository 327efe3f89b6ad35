"""Configuration: the root ``Config``, YAML loading and ``${VAR}`` substitution.

Unknown keys are errors naming their path, so a typo never silently falls back to a default.

The sections live beside this module: ``config_agent`` (``agent:``), ``config_channels``
(``channels:``), ``config_schedules`` (``cron:``, ``heartbeat:``) and ``config_fields`` (the
shared value types). Every one of their classes is re-exported here, so
``from gateway.kernel.config import AgentConfig`` keeps working wherever it is written.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import PrivateAttr, SecretStr, ValidationError, field_validator

from gateway.kernel.config_agent import (
    AgentConfig,
    CompactionConfig,
    ContextConfig,
    CronToolConfig,
    ExecSandboxConfig,
    ExecToolConfig,
    FallbackModelConfig,
    FileToolsConfig,
    MCPConfig,
    MCPServerConfig,
    MemoryConfig,
    MessageToolConfig,
    SpawnToolConfig,
    ToolsConfig,
    WebSearchConfig,
    WebToolsConfig,
)
from gateway.kernel.config_channels import (
    ChannelsConfig,
    DeliveryConfig,
    DiscordChannelConfig,
    LocalChannelConfig,
    StreamingConfig,
    TelegramChannelConfig,
    TerminalChannelConfig,
    WebchatChannelConfig,
    check_plugin_sections,
)
from gateway.kernel.config_fields import (
    Duration,
    IdList,
    OptionalSecret,
    OptionalStr,
    Section,
    parse_duration,
)
from gateway.kernel.config_retention import RetentionConfig
from gateway.kernel.config_schedules import CronConfig, HeartbeatConfig
from gateway.kernel.config_trust import ChatTrustConfig, LevelConfig, TrustConfig
from gateway.kernel.store_sql import hide_password, is_postgres_url

__all__ = [
    "StreamingConfig",
    "DEFAULT_CONFIG_PATH", "SECRETS_FILE", "AgentConfig", "ChannelsConfig", "ChatTrustConfig",
    "CompactionConfig", "Config", "ConfigError", "ContextConfig", "CronConfig",
    "CronToolConfig", "DeliveryConfig", "DiscordChannelConfig", "Duration", "ExecSandboxConfig",
    "ExecToolConfig", "FallbackModelConfig", "FileToolsConfig", "HeartbeatConfig", "IdList",
    "LevelConfig", "LocalChannelConfig", "LoggingConfig", "MCPConfig", "MCPServerConfig",
    "MemoryConfig", "MessageToolConfig", "OptionalSecret", "OptionalStr", "Section",
    "SpawnToolConfig", "TelegramChannelConfig", "TerminalChannelConfig", "ToolsConfig",
    "TrustConfig", "WebSearchConfig", "WebToolsConfig", "WebchatChannelConfig",
    "find_config_path", "load_config", "parse_config", "parse_duration", "read_env_file",
]

DEFAULT_CONFIG_PATH = Path("~/.parley/config.yaml")


class ClusterConfig(Section):
    """Several gateway processes on one PostgreSQL store (``database``; gateway/cluster.py)."""

    lease: Duration = 15.0
    """How long a process that stopped answering (killed, frozen, cut off) keeps its chats
    and platform connections before the others take them over."""

    @field_validator("lease")
    @classmethod
    def _lease(cls, value: float) -> float:
        if not 0.3 <= value <= 600:
            raise ValueError("must be between 0.3s and 10m")
        return value


class LoggingConfig(Section):
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    file: str | None = None


class Config(Section):
    workspace: Path = Path("~/.parley/workspace")
    data_dir: Path = Path("~/.parley/data")
    agent: AgentConfig = AgentConfig()
    channels: ChannelsConfig = ChannelsConfig()
    cron: CronConfig = CronConfig()
    heartbeat: HeartbeatConfig = HeartbeatConfig()
    logging: LoggingConfig = LoggingConfig()
    retention: RetentionConfig = RetentionConfig()  # issue 24: gateway/retention.py
    # several processes on PostgreSQL (issue 19) ----------------------------------------------
    database: OptionalSecret = None
    cluster: ClusterConfig = ClusterConfig()
    """Empty: SQLite (``data_dir/parley.db``), one process. A ``postgresql://`` URL: the store
    on PostgreSQL, shared by every gateway process given the same URL."""

    @field_validator("database")
    @classmethod
    def _database_url(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and not is_postgres_url(value.get_secret_value()):
            raise ValueError("must be a postgresql:// URL (or empty: SQLite in data_dir)")
        return value

    @property
    def store_target(self) -> Path | str:
        """What ``Store.open`` opens: the PostgreSQL URL when set, else the SQLite file."""
        return self.database.get_secret_value() if self.database else self.db_path

    @property
    def store_label(self) -> str:
        """Where the data is, as shown (a URL's password hidden)."""
        return hide_password(self.database.get_secret_value()) if self.database \
            else str(self.db_path)
    # ------------------------------------------------------------------------------------------

    _source: Path | None = PrivateAttr(None)

    @property
    def source(self) -> Path | None:
        """The file this config was read from; relative paths are taken from its folder."""
        return self._source

    @property
    def workspace_path(self) -> Path:
        return self._resolve(self.workspace)

    @property
    def data_path(self) -> Path:
        return self._resolve(self.data_dir)

    @property
    def db_path(self) -> Path:
        return self.data_path / "parley.db"

    @property
    def cron_timezone(self) -> str:
        """The timezone of schedules and the heartbeat's active hours."""
        return self.cron.timezone or self.agent.timezone

    def _resolve(self, path: Path) -> Path:
        """Relative paths are read from the config file's folder, not the current directory."""
        path = path.expanduser()
        if not path.is_absolute() and self.source is not None:
            path = self.source.parent / path
        return path.resolve()


class ConfigError(Exception):
    """A config that cannot be used; ``errors`` holds (key path, reason) pairs."""

    def __init__(self, source: str, errors: list[tuple[str, str]]) -> None:
        self.source = source
        self.errors = errors
        lines = "\n".join(f"  {path or '(top level)'}: {reason}" for path, reason in errors)
        super().__init__(f"invalid config {source}:\n{lines}")


_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-(.*?))?\}")


def _substitute(node: Any, path: str, env: dict[str, str], errors: list[tuple[str, str]],
                defaulted: dict[str, str]) -> Any:
    """``${NAME}`` and ``${NAME:-default}`` replaced from ``env``; a default taken is noted
    in ``defaulted`` (key path → NAME)."""
    if isinstance(node, dict):
        return {k: _substitute(v, f"{path}.{k}" if path else str(k), env, errors, defaulted)
                for k, v in node.items()}
    if isinstance(node, list):
        return [_substitute(v, f"{path}[{i}]", env, errors, defaulted)
                for i, v in enumerate(node)]
    if not isinstance(node, str):
        return node

    def repl(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        if name in env:
            return env[name]
        if default is not None:
            defaulted[path] = name
            return default
        errors.append((path, f"environment variable {name} is not set "
                             f"(write ${{{name}:-default}} to give a default)"))
        return ""

    return _VAR.sub(repl, node)


def _format_loc(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def parse_config(data: Any, *, source: str = "<config>", env: dict[str, str] | None = None,
                 path: Path | None = None) -> Config:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(source, [("", "the config must be a mapping of keys to values")])
    errors: list[tuple[str, str]] = []
    defaulted: dict[str, str] = {}
    data = _substitute(data, "", dict(os.environ) if env is None else env, errors, defaulted)
    if errors:
        raise ConfigError(source, errors)
    try:
        config = Config.model_validate(data)
    except ValidationError as exc:
        for err in exc.errors():
            reason = "unknown key" if err["type"] == "extra_forbidden" else err["msg"]
            reason = reason.removeprefix("Value error, ")
            errors.append((_format_loc(err["loc"]), reason))
        raise ConfigError(source, errors) from None
    errors = check_plugin_sections(config.channels)  # plugin channels' own config models
    if errors:
        raise ConfigError(source, errors)
    config._source = path
    config.agent._defaulted = {key.removeprefix("agent."): name
                               for key, name in defaulted.items() if key.startswith("agent.")}
    return config


def find_config_path(explicit: str | Path | None = None) -> Path:
    if explicit:
        return Path(explicit).expanduser()
    env = os.environ.get("PARLEY_CONFIG")
    if env:
        return Path(env).expanduser()
    return DEFAULT_CONFIG_PATH.expanduser()


SECRETS_FILE = "secrets.env"
"""Beside the config: ``NAME=value`` lines that ``${NAME}`` reads when the environment has no
NAME (``parley onboard`` keeps the keys it is given there, mode 600, never in the config)."""


def read_env_file(path: Path) -> dict[str, str]:
    """``NAME=value`` lines (``#`` comments, blank lines, optional quotes, ``export``)."""
    found: dict[str, str] = {}
    if not path.is_file():
        return found
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(str(path), [("", f"cannot read it: {exc.strerror}")]) from None
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, value = line.removeprefix("export ").partition("=")
        name, value = name.strip(), value.strip()
        if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise ConfigError(str(path), [(f"line {number}", "expected NAME=value")])
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        found[name] = value
    return found


def load_config(explicit: str | Path | None = None, *, env: dict[str, str] | None = None) -> Config:
    path = find_config_path(explicit)
    if not path.exists():
        raise ConfigError(str(path), [("", "file not found (run `parley onboard` to write one, "
                                           "or pass --config FILE)")])
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(str(path), [(where, f"not valid YAML: {getattr(exc, 'problem', exc)}")]) \
            from None
    if env is None:  # the environment wins over the file beside the config
        env = {**read_env_file(path.parent / SECRETS_FILE), **os.environ}
    return parse_config(data, source=str(path), env=env, path=path.resolve())
