"""Configuration: pydantic models, YAML loading and ``${VAR}`` substitution.

Unknown keys are errors naming their path, so a typo never silently falls back to a default.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
)

DEFAULT_CONFIG_PATH = Path("~/.parley/config.yaml")

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def parse_duration(value: Any) -> float:
    """``90s``, ``30m``, ``2h``, ``1.5d`` or a bare number of seconds → seconds."""
    if isinstance(value, bool):
        raise ValueError("expected a duration such as 90s, 30m or 2h")
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        match = _DURATION.match(str(value))
        if not match:
            raise ValueError(f"{value!r} is not a duration; write it like 90s, 30m or 2h")
        seconds = float(match.group(1)) * _UNITS[match.group(2)]
    if seconds < 0:
        raise ValueError("a duration cannot be negative")
    return seconds


Duration = Annotated[float, BeforeValidator(parse_duration)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CompactionConfig(_Model):
    enabled: bool = True
    keep_recent_share: float = Field(0.3, gt=0, lt=1)
    """Share of the history budget kept word for word after a compaction."""
    memory_flush: bool = True
    timeout: Duration = 60.0
    summary_max_tokens: int = Field(800, gt=50)


class ContextConfig(_Model):
    max_context_tokens: int | None = Field(
        None, gt=0, description="None: the model's window from litellm, else 32,000")
    max_recent_messages: int = Field(50, gt=0)
    max_tool_snippet_tokens: int = Field(2000, gt=0)
    reply_reserve_tokens: int = Field(4096, ge=0)
    bootstrap_max_chars: int = Field(20_000, gt=100)
    bootstrap_total_max_chars: int = Field(150_000, gt=100)
    compaction: CompactionConfig = CompactionConfig()


class ExecToolConfig(_Model):
    enabled: bool = True
    timeout: Duration = 60.0
    max_output_chars: int = Field(10_000, gt=100)
    deny: list[str] = Field(default_factory=list, description="extra regexes refused as commands")

    @field_validator("deny")
    @classmethod
    def _compiles(cls, patterns: list[str]) -> list[str]:
        for i, pattern in enumerate(patterns):
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"deny[{i}] {pattern!r} is not a valid regular expression: "
                                 f"{exc}") from None
        return patterns


class FileToolsConfig(_Model):
    enabled: bool = True
    restrict_to_workspace: bool = True
    max_read_chars: int = Field(12_000, gt=100)


class ToolsConfig(_Model):
    files: FileToolsConfig = FileToolsConfig()
    exec: ExecToolConfig = ExecToolConfig()
    max_result_chars: int = Field(16_000, gt=100)


class AgentConfig(_Model):
    model: str = "openai/gpt-4o-mini"
    api_base: str | None = None
    api_key: str | None = None
    fallbacks: list[str] = Field(default_factory=list)
    temperature: float | None = Field(None, ge=0, le=2)
    max_tokens: int = Field(4096, gt=0)
    max_iterations: int = Field(20, gt=0)
    timeout: Duration = 120.0
    max_retries: int = Field(3, ge=0)
    retry_backoff: Duration = 1.0
    stream: bool = False
    timezone: str = "UTC"
    max_concurrent_turns: int = Field(4, gt=0)
    queue_mode: Literal["collect", "followup", "steer"] = "collect"
    queue_cap: int = Field(20, ge=2)
    shutdown_grace: Duration = 10.0
    context: ContextConfig = ContextConfig()
    tools: ToolsConfig = ToolsConfig()

    @field_validator("api_base", "api_key", mode="before")
    @classmethod
    def _empty_is_none(cls, value: Any) -> Any:
        return None if value == "" else value

    @field_validator("timezone")
    @classmethod
    def _known_timezone(cls, value: str) -> str:
        from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError) as exc:
            raise ValueError(f"unknown IANA timezone {value!r}") from exc
        return value


class LocalChannelConfig(_Model):
    enabled: bool = True
    host: str = "127.0.0.1"
    port: int = Field(8765, ge=0, le=65535)
    token: str | None = None
    max_text_chars: int = Field(100_000, gt=0)
    max_media_bytes: int = Field(20 * 1024 * 1024, gt=0)

    @field_validator("token", mode="before")
    @classmethod
    def _empty_is_none(cls, value: Any) -> Any:
        return None if value == "" else value


class TerminalChannelConfig(_Model):
    enabled: bool = True
    chat_id: str = "terminal"
    sender_id: str = "owner"


class TelegramChannelConfig(_Model):
    """``channels/telegram.py``."""

    enabled: bool = False


class DiscordChannelConfig(_Model):
    """``channels/discord.py``."""

    enabled: bool = False


class WebchatChannelConfig(_Model):
    """``channels/webchat.py``."""

    enabled: bool = False


class DeliveryConfig(_Model):
    """The outbox: how long an undelivered message is retried before it is dead-lettered."""

    reply_ttl: Duration = 600.0
    notice_ttl: Duration = 600.0
    scheduled_ttl: Duration = 3600.0
    backoff: Duration = 1.0
    max_backoff: Duration = 60.0

    def ttl(self, kind: str) -> float:
        if kind in ("cron", "heartbeat"):
            return self.scheduled_ttl
        return self.reply_ttl if kind == "reply" else self.notice_ttl


class ChannelsConfig(_Model):
    delivery: DeliveryConfig = DeliveryConfig()
    local: LocalChannelConfig = LocalChannelConfig()
    terminal: TerminalChannelConfig = TerminalChannelConfig()
    telegram: TelegramChannelConfig = TelegramChannelConfig()
    discord: DiscordChannelConfig = DiscordChannelConfig()
    webchat: WebchatChannelConfig = WebchatChannelConfig()


class LoggingConfig(_Model):
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    file: str | None = None


class Config(_Model):
    workspace: Path = Path("~/.parley/workspace")
    data_dir: Path = Path("~/.parley/data")
    agent: AgentConfig = AgentConfig()
    channels: ChannelsConfig = ChannelsConfig()
    logging: LoggingConfig = LoggingConfig()

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


def _substitute(node: Any, path: str, env: dict[str, str], errors: list[tuple[str, str]]) -> Any:
    if isinstance(node, dict):
        return {k: _substitute(v, f"{path}.{k}" if path else str(k), env, errors)
                for k, v in node.items()}
    if isinstance(node, list):
        return [_substitute(v, f"{path}[{i}]", env, errors) for i, v in enumerate(node)]
    if not isinstance(node, str):
        return node

    def repl(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        if name in env:
            return env[name]
        if default is not None:
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
    data = _substitute(data, "", dict(os.environ) if env is None else env, errors)
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
    config._source = path
    return config


def find_config_path(explicit: str | Path | None = None) -> Path:
    if explicit:
        return Path(explicit).expanduser()
    env = os.environ.get("PARLEY_CONFIG")
    if env:
        return Path(env).expanduser()
    return DEFAULT_CONFIG_PATH.expanduser()


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
    return parse_config(data, source=str(path), env=env, path=path.resolve())
