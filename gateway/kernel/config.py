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
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
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


def _blank_is_none(value: Any) -> Any:
    """An empty value means "not set": what ``${VAR:-}`` gives when VAR is unset."""
    return None if value == "" else value


def _ids_as_text(value: Any) -> Any:
    """Ids are numbers in YAML (``- 123456``); kept as text like the usernames beside them."""
    if isinstance(value, list):
        return [str(v) if isinstance(v, int) and not isinstance(v, bool) else v for v in value]
    return value


OptionalStr = Annotated[str | None, BeforeValidator(_blank_is_none)]
OptionalSecret = Annotated[SecretStr | None, BeforeValidator(_blank_is_none)]
IdList = Annotated[list[str], BeforeValidator(_ids_as_text)]


def _require_token(value: SecretStr | None, info: ValidationInfo, how: str) -> SecretStr | None:
    if value is None and info.data.get("enabled"):
        raise ValueError(how)
    return value


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


def _check_target(value: str) -> str:
    """``channel:chat_id`` (the chat id may itself hold colons)."""
    channel, _, chat_id = value.partition(":")
    if not channel or not chat_id:
        raise ValueError(f"{value!r} is not a target; write it as channel:chat_id "
                         "(e.g. telegram:123456789)")
    return value


class MessageToolConfig(_Model):
    """``agent/tools/message.py``: the agent sends text and workspace files to its chat."""

    enabled: bool = True
    allowed_targets: list[str] = Field(default_factory=list)
    """Other chats (``channel:chat_id``) the agent may message; its own chat always."""

    @field_validator("allowed_targets")
    @classmethod
    def _targets(cls, values: list[str]) -> list[str]:
        return [_check_target(v) for v in values]


class CronToolConfig(_Model):
    """``agent/tools/cron.py``: the agent adds, lists and removes its chat's scheduled jobs."""

    enabled: bool = True


class WebSearchConfig(_Model):
    """``web_search`` (``agent/tools/web.py``): offered only when a provider is set."""

    provider: Literal["none", "brave", "searxng"] = "none"
    api_key: OptionalSecret = None
    base_url: OptionalStr = None
    """Brave: the API endpoint (default Brave's); SearXNG: the instance (JSON format on)."""
    max_results: int = Field(5, gt=0, le=20)

    @model_validator(mode="after")
    def _provider_needs(self) -> WebSearchConfig:
        if self.provider == "brave" and self.api_key is None:
            raise ValueError("provider brave needs api_key (e.g. ${BRAVE_API_KEY})")
        if self.provider == "searxng" and not self.base_url:
            raise ValueError("provider searxng needs base_url (e.g. http://localhost:8888)")
        return self


class WebToolsConfig(_Model):
    """``web_fetch`` (``agent/tools/web.py``) and its SSRF guard; ``search``: web_search."""

    enabled: bool = True
    allow_hosts: list[str] = Field(default_factory=list)
    """Host names, addresses or networks (10.0.0.0/8) web_fetch may reach although they are
    private, loopback or link-local."""
    max_bytes: int = Field(2_000_000, gt=0)
    max_chars: int = Field(12_000, gt=100)
    timeout: Duration = 20.0
    search: WebSearchConfig = WebSearchConfig()


class SpawnToolConfig(_Model):
    """``agent/subagent.py``: the ``spawn`` tool hands a task to a subagent."""

    enabled: bool = True
    max_iterations: int = Field(15, gt=0)
    max_concurrent: int = Field(3, gt=0)
    timeout: Duration = 300.0


class ToolsConfig(_Model):
    files: FileToolsConfig = FileToolsConfig()
    exec: ExecToolConfig = ExecToolConfig()
    message: MessageToolConfig = MessageToolConfig()
    cron: CronToolConfig = CronToolConfig()
    web: WebToolsConfig = WebToolsConfig()
    spawn: SpawnToolConfig = SpawnToolConfig()
    max_result_chars: int = Field(16_000, gt=100)


class MCPServerConfig(_Model):
    """One MCP server (``agent/mcp.py``): ``command`` (stdio) or ``url`` (streamable HTTP)."""

    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,32}$")
    enabled: bool = True
    command: str | None = None
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    """Added to a small safe environment (PATH, HOME, ...): the gateway's secrets stay out."""
    url: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    tools: list[str] = Field(default_factory=list)
    """Offer only these of the server's tools (its own names); empty: all of them."""
    tool_timeout: Duration = 60.0

    @model_validator(mode="after")
    def _one_transport(self) -> MCPServerConfig:
        if (self.command is None) == (self.url is None):
            raise ValueError("give either command (a stdio server) or url (streamable HTTP)")
        if self.url is not None and not re.match(r"^https?://", self.url):
            raise ValueError(f"url {self.url!r} must start with http:// or https://")
        if self.command is None and (self.args or self.env):
            raise ValueError("args and env are for stdio servers (command)")
        if self.url is None and self.headers:
            raise ValueError("headers are for HTTP servers (url)")
        return self


class MCPConfig(_Model):
    servers: list[MCPServerConfig] = Field(default_factory=list)
    connect_timeout: Duration = 15.0
    """How long the gateway's start waits for the servers; a slower one joins when ready."""
    max_backoff: Duration = 60.0

    @field_validator("servers")
    @classmethod
    def _unique(cls, servers: list[MCPServerConfig]) -> list[MCPServerConfig]:
        names = [s.name for s in servers]
        if dupes := sorted({n for n in names if names.count(n) > 1}):
            raise ValueError(f"server names must be unique: {', '.join(dupes)}")
        return servers


class MemoryConfig(_Model):
    """``workspace/memory.py``: MEMORY.md (lasting facts, in the system prompt), daily logs
    ``memory/YYYY-MM-DD.md``, the ``memory`` tool and recall into the runtime block."""

    enabled: bool = True
    daily_log: bool = True
    max_memory_chars: int = Field(8_000, gt=100)
    """MEMORY.md is sent with every request: past this the model must consolidate it."""
    recall_sources: Literal["logs", "all"] = "logs"
    recall_max_items: int = Field(3, ge=0)
    recall_max_tokens: int = Field(300, ge=0)
    recall_min_score: float = Field(1.0, ge=0)


class FallbackModelConfig(_Model):
    """A fallback on another server or provider: its own ``api_base`` and ``api_key``
    (unset: the provider's own, e.g. ``OPENAI_API_KEY``). A fallback written as a plain
    model name shares the main model's ``api_base`` and ``api_key``."""

    model: str = Field(min_length=1)
    api_base: OptionalStr = None
    api_key: OptionalStr = None


class AgentConfig(_Model):
    model: str = "openai/gpt-4o-mini"
    api_base: OptionalStr = None
    api_key: OptionalStr = None
    fallbacks: list[str | FallbackModelConfig] = Field(default_factory=list)
    temperature: float | None = Field(None, ge=0, le=2)
    max_tokens: int = Field(4096, gt=0)
    max_iterations: int = Field(20, gt=0)
    timeout: Duration = 120.0
    max_retries: int = Field(3, ge=0)
    retry_backoff: Duration = 1.0
    stream: bool = False
    transport: Literal["auto", "litellm"] = "auto"
    """``auto``: ``openai/<name>`` at an ``api_base`` is posted directly (aiohttp), everything
    else goes through litellm; ``litellm``: every call goes through litellm."""
    timezone: str = "UTC"
    max_concurrent_turns: int = Field(4, gt=0)
    queue_mode: Literal["collect", "followup", "steer"] = "collect"
    queue_cap: int = Field(20, ge=2)
    shutdown_grace: Duration = 10.0
    context: ContextConfig = ContextConfig()
    tools: ToolsConfig = ToolsConfig()
    memory: MemoryConfig = MemoryConfig()
    mcp: MCPConfig = MCPConfig()

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
    token: OptionalStr = None
    max_text_chars: int = Field(100_000, gt=0)
    max_media_bytes: int = Field(20 * 1024 * 1024, gt=0)


class TerminalChannelConfig(_Model):
    enabled: bool = True
    chat_id: str = "terminal"
    sender_id: str = "owner"


class TelegramChannelConfig(_Model):
    """``channels/telegram.py``."""

    enabled: bool = False
    token: OptionalSecret = Field(None, validate_default=True)
    base_url: str = "https://api.telegram.org/bot"
    base_file_url: str = "https://api.telegram.org/file/bot"
    mode: Literal["polling", "webhook"] = "polling"
    webhook_url: OptionalStr = None
    webhook_secret: OptionalSecret = None
    webhook_listen: str = "127.0.0.1"
    webhook_port: int = Field(8443, ge=0, le=65535)
    allow_from: IdList = Field(default_factory=list)
    dm_policy: Literal["pairing", "allowlist", "open", "disabled"] = "pairing"
    group_policy: Literal["mention", "open", "disabled"] = "mention"
    allow_groups: IdList = Field(default_factory=list)
    group_history: int = Field(20, ge=0, le=500)
    max_media_bytes: int = Field(20 * 1024 * 1024, gt=0)
    poll_timeout: Duration = 30.0
    watchdog: Duration = 90.0
    typing_interval: Duration = 5.0

    @field_validator("token")
    @classmethod
    def _token_when_enabled(cls, value: SecretStr | None,
                            info: ValidationInfo) -> SecretStr | None:
        return _require_token(value, info, "required when channels.telegram.enabled is true: "
                              "create a bot with @BotFather and set channels.telegram.token "
                              "(e.g. ${TELEGRAM_BOT_TOKEN})")

    @field_validator("webhook_secret")
    @classmethod
    def _secret_chars(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and not re.fullmatch(r"[A-Za-z0-9_-]{1,256}",
                                                  value.get_secret_value()):
            raise ValueError("1-256 characters A-Z, a-z, 0-9, _ and - (Telegram's rule)")
        return value

    @model_validator(mode="after")
    def _cross_checks(self) -> TelegramChannelConfig:
        if self.mode == "webhook" and (not self.webhook_url or not self.webhook_secret):
            raise ValueError("mode webhook needs webhook_url (the public https URL Telegram "
                             "calls) and webhook_secret")
        if self.poll_timeout <= 0 or self.watchdog < 2 * self.poll_timeout:
            raise ValueError("watchdog must be at least twice poll_timeout (> 0), or a "
                             "healthy long poll would look stalled")
        if self.typing_interval <= 0:
            raise ValueError("typing_interval must be more than 0")
        return self


class DiscordChannelConfig(_Model):
    """``channels/discord.py``."""

    enabled: bool = False
    token: OptionalSecret = Field(None, validate_default=True)
    api_base: str = "https://discord.com/api/v10"
    """Discord's REST base; another Discord-compatible server's (its ``GET /gateway`` names
    the websocket). Process-wide in discord.py: one Discord base per gateway process."""
    allow_from: IdList = Field(default_factory=list)
    """User ids always served."""
    allow_guilds: IdList = Field(default_factory=list)
    """Server ids: when set, the bot answers in these servers only, and there to anyone."""
    allow_channels: IdList = Field(default_factory=list)
    """Channel ids: when set, the bot answers in these channels (and their threads) only, and
    there to anyone."""
    dm_policy: Literal["pairing", "allowlist", "open", "disabled"] = "pairing"
    group_policy: Literal["mention", "open", "disabled"] = "mention"
    group_history: int = Field(20, ge=0, le=500)
    allow_bots: bool = False
    allow_mentions: bool = False
    reply_ping: bool = False
    max_media_bytes: int = Field(25 * 1024 * 1024, gt=0)
    typing_interval: Duration = 8.0
    watchdog: Duration = 90.0
    connect_timeout: Duration = 30.0

    @field_validator("token")
    @classmethod
    def _token_when_enabled(cls, value: SecretStr | None,
                            info: ValidationInfo) -> SecretStr | None:
        return _require_token(value, info, "required when channels.discord.enabled is true: "
                              "create a bot in the Discord developer portal (Bot → Reset "
                              "Token) and set channels.discord.token (e.g. ${DISCORD_BOT_TOKEN})")

    @field_validator("allow_from", "allow_guilds", "allow_channels")
    @classmethod
    def _snowflakes(cls, values: list[str]) -> list[str]:
        for i, value in enumerate(values):
            if not value.strip().isdigit():
                raise ValueError(f"[{i}] {value!r} is not a Discord id: ids are numbers (turn "
                                 "on Developer Mode in Discord, then right-click → Copy ID)")
        return [v.strip() for v in values]

    @field_validator("api_base")
    @classmethod
    def _base(cls, value: str) -> str:
        if not re.match(r"^https?://", value):
            raise ValueError(f"{value!r} must start with http:// or https://")
        return value.rstrip("/")

    @model_validator(mode="after")
    def _positive_times(self) -> DiscordChannelConfig:
        for name in ("typing_interval", "watchdog", "connect_timeout"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be more than 0")
        return self


class WebchatChannelConfig(_Model):
    """``channels/webchat.py``: the chat page in the browser, served by the gateway."""

    enabled: bool = False
    host: str = "127.0.0.1"
    port: int = Field(8766, ge=0, le=65535)
    token: str | None = Field(None, validate_default=True)
    """Required beyond loopback: the page asks for it once; HTTP sends it as a bearer token."""
    max_text_chars: int = Field(20_000, gt=0)
    max_image_bytes: int = Field(5 * 1024 * 1024, gt=0)
    allowed_origins: list[str] = Field(default_factory=list)
    """Extra page origins (``https://chat.example.com``) allowed to open the WebSocket."""
    history_limit: int = Field(200, gt=0, le=5000)
    """Most messages one history request returns (the page pages on for more)."""

    @field_validator("allowed_origins")
    @classmethod
    def _origins(cls, origins: list[str]) -> list[str]:
        out = []
        for i, origin in enumerate(origins):
            if not re.fullmatch(r"https?://[A-Za-z0-9.\-\[\]:]+", origin.rstrip("/")):
                raise ValueError(f"allowed_origins[{i}] {origin!r} is not an origin such as "
                                 "https://chat.example.com (scheme, host, optional port)")
            out.append(origin.rstrip("/").lower())
        return out

    @field_validator("token", mode="before")
    @classmethod
    def _token_beyond_loopback(cls, value: Any, info: Any) -> Any:
        """Anyone who can reach the page can talk to the agent (and its tools): beyond
        loopback that must take a secret."""
        import ipaddress

        value = None if value == "" else value
        host = str(info.data.get("host", "127.0.0.1"))
        try:
            loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = False
        if value is None and not loopback:
            raise ValueError(f"channels.webchat.token is required to listen on {host!r}, "
                             "which is not loopback; set a token or use host 127.0.0.1")
        return value


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


def _check_timezone(value: str | None) -> str | None:
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    if value is not None:
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError) as exc:
            raise ValueError(f"unknown IANA timezone {value!r}") from exc
    return value


class CronConfig(_Model):
    """``gateway/cron.py``: scheduled reminders and agent tasks, stored in the database."""

    enabled: bool = True
    timezone: str | None = None
    """For naive ``at`` times and cron expressions without ``tz``; None: ``agent.timezone``."""
    missed_grace: Duration = 600.0
    """A run missed while the gateway was down still runs at start if at most this late."""
    poll_interval: Duration = 5.0
    """How often a running gateway looks for jobs added by ``parley cron`` (another process)."""
    min_interval: Duration = 60.0
    """Shortest ``every`` the gateway accepts: no job may flood a chat."""

    @field_validator("timezone")
    @classmethod
    def _known_timezone(cls, value: str | None) -> str | None:
        return _check_timezone(value)

    @field_validator("poll_interval")
    @classmethod
    def _positive(cls, value: float) -> float:
        if value <= 0:
            raise ValueError("must be more than 0")
        return value


_HOURS = re.compile(r"^\s*([01]?\d|2[0-4]):([0-5]\d)\s*-\s*([01]?\d|2[0-4]):([0-5]\d)\s*$")


class HeartbeatConfig(_Model):
    """``gateway/heartbeat.py``: a periodic turn over HEARTBEAT.md's tasks. Off by default:
    every beat with tasks costs a model call."""

    enabled: bool = False
    every: Duration = 1800.0
    active_hours: str | None = "08:00-22:00"
    """``HH:MM-HH:MM`` in the cron timezone (``22:00-06:00`` spans midnight); None: always."""
    target: str = "none"
    """Where an alert goes: ``channel:chat_id``, or ``none`` (the turn runs, nothing is sent)."""

    @field_validator("every")
    @classmethod
    def _at_least_a_minute(cls, value: float) -> float:
        if value < 60:
            raise ValueError("must be at least 1m")
        return value

    @field_validator("active_hours", mode="before")
    @classmethod
    def _hours(cls, value: Any) -> Any:
        if value in (None, ""):
            return None
        match = _HOURS.match(str(value))
        if not match or any(int(h) == 24 and m != "00"
                            for h, m in (match.group(1, 2), match.group(3, 4))):
            raise ValueError(f"{value!r} is not a span of hours; write it like 08:00-22:00")
        return value

    @field_validator("target")
    @classmethod
    def _target(cls, value: str) -> str:
        return value if value == "none" else _check_target(value)

    def hours(self) -> tuple[int, int] | None:
        """(start, end) in minutes after midnight, or None for all day."""
        if self.active_hours is None:
            return None
        match = _HOURS.match(self.active_hours)
        assert match is not None
        h1, m1, h2, m2 = (int(g) for g in match.groups())
        return h1 * 60 + m1, h2 * 60 + m2


class LoggingConfig(_Model):
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    file: str | None = None


class Config(_Model):
    workspace: Path = Path("~/.parley/workspace")
    data_dir: Path = Path("~/.parley/data")
    agent: AgentConfig = AgentConfig()
    channels: ChannelsConfig = ChannelsConfig()
    cron: CronConfig = CronConfig()
    heartbeat: HeartbeatConfig = HeartbeatConfig()
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
