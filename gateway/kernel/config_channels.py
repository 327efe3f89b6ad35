"""The ``channels:`` section: one model per adapter (local, terminal, Telegram, Discord,
WebChat) and the outbox's delivery deadlines.

Separate from the root ``Config`` (``gateway/kernel/config.py``), which re-exports every class
here, so each adapter's settings and their cross-checks read on their own.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from gateway.kernel import channel_registry
from gateway.kernel.config_fields import Duration, IdList, OptionalSecret, OptionalStr, Section


def _require_token(value: SecretStr | None, info: ValidationInfo, how: str) -> SecretStr | None:
    if value is None and info.data.get("enabled"):
        raise ValueError(how)
    return value


# --- live replies (issue 17) -------------------------------------------------------------------
class StreamingConfig(Section):
    """``channels.<name>.streaming``: the answer shown while the model writes it
    (``gateway/streaming.py``). Off: the reply arrives whole, as before."""

    enabled: bool = False
    interval: Duration = 1.0
    """Seconds between two updates of the shown text at least (Telegram and Discord allow
    about one edit a second per chat)."""
    min_chars: int = Field(20, ge=0)
    """Characters the text must grow by before it is shown again."""
    status: bool = False
    """While tools run and no answer text is shown, show one status line
    (``running web_fetch``) in its place; the answer replaces it."""
    reactions: bool = False
    """React to the user's message: 👀 when taken, ⏳ while queued behind a busy turn, ✅ or
    ❌ at the end (Telegram, Discord and Slack)."""

    @model_validator(mode="after")
    def _positive(self) -> StreamingConfig:
        if self.interval < 0:
            raise ValueError("interval must be 0 or more seconds")
        return self


def _live(interval: float, min_chars: int = 20) -> Any:
    return Field(default_factory=lambda: StreamingConfig(interval=interval, min_chars=min_chars))
# --- end live replies ----------------------------------------------------------------------------


class LocalChannelConfig(Section):
    enabled: bool = True
    host: str = "127.0.0.1"
    port: int = Field(8765, ge=0, le=65535)
    token: OptionalStr = None
    max_text_chars: int = Field(100_000, gt=0)
    max_media_bytes: int = Field(20 * 1024 * 1024, gt=0)
    streaming: StreamingConfig = _live(0.0, 0)
    body_timeout: Duration = Field(30.0, gt=0)
    """A request body not received in full within this is refused (408)."""


class TerminalChannelConfig(Section):
    enabled: bool = True
    chat_id: str = "terminal"
    sender_id: str = "owner"


class TelegramChannelConfig(Section):
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
    """The owner: user ids (or @usernames) served with every tool and the owner's memory."""
    members: IdList = Field(default_factory=list)
    """Users trusted as members (as if approved by pairing): their own memory, no host tools."""
    dm_policy: Literal["pairing", "allowlist", "open", "disabled"] = "pairing"
    group_policy: Literal["mention", "open", "disabled"] = "mention"
    allow_groups: IdList = Field(default_factory=list)
    group_history: int = Field(20, ge=0, le=500)
    max_media_bytes: int = Field(20 * 1024 * 1024, gt=0)
    poll_timeout: Duration = 30.0
    watchdog: Duration = 90.0
    typing_interval: Duration = 5.0
    streaming: StreamingConfig = _live(1.0)

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


class DiscordChannelConfig(Section):
    """``channels/discord.py``."""

    enabled: bool = False
    token: OptionalSecret = Field(None, validate_default=True)
    api_base: str = "https://discord.com/api/v10"
    """Discord's REST base; another Discord-compatible server's (its ``GET /gateway`` names
    the websocket). Process-wide in discord.py: one Discord base per gateway process."""
    allow_from: IdList = Field(default_factory=list)
    """The owner: user ids always served, with every tool and the owner's memory."""
    members: IdList = Field(default_factory=list)
    """User ids trusted as members (as if approved by pairing): their own memory, no host
    tools."""
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
    streaming: StreamingConfig = _live(1.0)

    @field_validator("token")
    @classmethod
    def _token_when_enabled(cls, value: SecretStr | None,
                            info: ValidationInfo) -> SecretStr | None:
        return _require_token(value, info, "required when channels.discord.enabled is true: "
                              "create a bot in the Discord developer portal (Bot → Reset "
                              "Token) and set channels.discord.token (e.g. ${DISCORD_BOT_TOKEN})")

    @field_validator("allow_from", "members", "allow_guilds", "allow_channels")
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


class WebchatChannelConfig(Section):
    """``channels/webchat.py``: the chat page in the browser, served by the gateway."""

    enabled: bool = False
    host: str = "127.0.0.1"
    port: int = Field(8766, ge=0, le=65535)
    token: str | None = Field(None, validate_default=True)
    """Required beyond loopback: the page asks for it once; HTTP sends it as a bearer token."""
    max_text_chars: int = Field(20_000, gt=0)
    max_image_bytes: int = Field(5 * 1024 * 1024, gt=0)
    max_audio_bytes: int = Field(10 * 1024 * 1024, ge=0)
    """A recording from the page's microphone (transcribed by ``agent.media``); 0: none."""
    allowed_origins: list[str] = Field(default_factory=list)
    """Extra page origins (``https://chat.example.com``) allowed to open the WebSocket."""
    history_limit: int = Field(200, gt=0, le=5000)
    """Most messages one history request returns (the page pages on for more)."""
    streaming: StreamingConfig = _live(0.05, 0)
    body_timeout: Duration = Field(30.0, gt=0)
    """A request body not received in full within this is refused (408)."""

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


# --- channels.openai: the OpenAI-compatible API (channels/openai_api.py) ---------------------

class OpenAIChannelConfig(Section):
    """``channels/openai_api.py``: ``POST /v1/chat/completions`` and ``GET /v1/models`` for
    tools that speak the OpenAI protocol. Each request is one turn of a Parley session."""

    enabled: bool = False
    host: str = "127.0.0.1"
    port: int = Field(8767, ge=0, le=65535)
    token: OptionalSecret = None
    """The API key clients send (``Authorization: Bearer``); required beyond loopback."""
    trust: Literal["owner", "member", "guest"] = "owner"
    """What a request counts as: the token's holder is the owner unless this says less."""
    sender_id: str = Field("owner", min_length=1, max_length=128)
    """Who the requests come from, for memory and the usage ledger."""
    reply_timeout: Duration = 600.0
    """How long a request waits for its turn's answer (the answer stays in the session)."""
    max_text_chars: int = Field(100_000, gt=0)
    """The longest new user message taken."""
    max_body_bytes: int = Field(8 * 1024 * 1024, gt=0)
    """The largest request body (clients resend the whole conversation each time)."""

    @model_validator(mode="after")
    def _token_beyond_loopback(self) -> OpenAIChannelConfig:
        if self.token is None and not loopback_host(self.host):
            raise ValueError(f"channels.openai.token is required to listen on {self.host!r}, "
                             "which is not loopback; set a token or use host 127.0.0.1")
        if self.reply_timeout <= 0:
            raise ValueError("reply_timeout must be more than 0")
        return self


def loopback_host(host: str) -> bool:
    import ipaddress

    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# --- channels.slack: Slack over Socket Mode (channels/slack.py) -------------------------------

class SlackChannelConfig(Section):
    """``channels/slack.py``: a Slack app over Socket Mode (no public URL needed)."""

    enabled: bool = False
    bot_token: OptionalSecret = Field(None, validate_default=True)
    """The bot token (``xoxb-…``): the Web API, and downloading files users share."""
    app_token: OptionalSecret = Field(None, validate_default=True)
    """The app-level token (``xapp-…``, scope ``connections:write``): Socket Mode."""
    api_base: str = "https://slack.com/api/"
    allow_from: IdList = Field(default_factory=list)
    """The owner: member ids (``U…``) served with every tool and the owner's memory."""
    members: IdList = Field(default_factory=list)
    allow_channels: IdList = Field(default_factory=list)
    """Channel ids (``C…``): when set, the bot answers in these channels only, and there to
    anyone."""
    dm_policy: Literal["pairing", "allowlist", "open", "disabled"] = "pairing"
    group_policy: Literal["mention", "open", "disabled"] = "mention"
    group_history: int = Field(20, ge=0, le=500)
    max_media_bytes: int = Field(20 * 1024 * 1024, gt=0)
    reactions: bool = True
    """👀 on the message being answered while its turn runs (Slack bots cannot show typing);
    ``streaming.reactions`` shows every stage instead."""
    streaming: StreamingConfig = _live(1.5)
    """The answer shown while it is written, one message updated with ``chat.update`` (a
    Tier 3 method: about 50 a minute), at most every 1.5 s by default."""
    watchdog: Duration = 90.0
    ping_interval: Duration = 10.0

    @field_validator("bot_token", "app_token")
    @classmethod
    def _tokens_when_enabled(cls, value: SecretStr | None,
                             info: ValidationInfo) -> SecretStr | None:
        which = str(info.field_name)
        prefix = "xoxb-" if which == "bot_token" else "xapp-"
        value = _require_token(value, info, f"required when channels.slack.enabled is true: "
                               f"create a Slack app with Socket Mode on and set "
                               f"channels.slack.{which} ({prefix}…)")
        if value is not None and not value.get_secret_value().startswith(prefix):
            raise ValueError(f"a Slack {which.replace('_', ' ')} starts with {prefix}")
        return value

    @field_validator("api_base")
    @classmethod
    def _base(cls, value: str) -> str:
        if not re.match(r"^https?://", value):
            raise ValueError(f"{value!r} must start with http:// or https://")
        return value.rstrip("/") + "/"

    @model_validator(mode="after")
    def _positive_times(self) -> SlackChannelConfig:
        for name in ("watchdog", "ping_interval"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be more than 0")
        return self


class DeliveryConfig(Section):
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


class ChannelsConfig(Section):
    """Built-in sections are typed here; a plugin channel's section (``channels.<name>`` of an
    installed channel, ``channel_registry``) is kept as given and validated against the
    plugin's own ``config_model`` by ``check_plugin_sections`` right after loading."""

    model_config = ConfigDict(extra="allow", frozen=True)

    delivery: DeliveryConfig = DeliveryConfig()
    local: LocalChannelConfig = LocalChannelConfig()
    terminal: TerminalChannelConfig = TerminalChannelConfig()
    telegram: TelegramChannelConfig = TelegramChannelConfig()
    discord: DiscordChannelConfig = DiscordChannelConfig()
    webchat: WebchatChannelConfig = WebchatChannelConfig()
    openai: OpenAIChannelConfig = OpenAIChannelConfig()
    slack: SlackChannelConfig = SlackChannelConfig()


# --- plugin channels' sections -------------------------------------------------------------------

def check_plugin_sections(channels: ChannelsConfig) -> list[tuple[str, str]]:
    """Validate each ``channels.<name>`` that is not a built-in field against the installed
    channel's ``config_model`` (in place: ``channels.<name>`` is then that model). Returns
    (key path, reason) pairs: an unknown name lists the installed channels."""
    errors: list[tuple[str, str]] = []
    extra = channels.__pydantic_extra__ or {}
    if not extra:
        return errors
    installed = channel_registry.installed()
    for name, raw in list(extra.items()):
        path = f"channels.{name}"
        if name not in installed:
            errors.append((path, "unknown channel (installed channels: "
                                 f"{', '.join(installed) or 'none'})"))
            continue
        try:
            model = channel_registry.load(name, installed[name]).config_model
            extra[name] = raw if isinstance(raw, model) else model.model_validate(raw or {})
        except channel_registry.ChannelPluginError as exc:
            errors.append((path, str(exc)))
        except ValidationError as exc:
            for err in exc.errors():
                where = ".".join(str(p) for p in err["loc"])
                reason = "unknown key" if err["type"] == "extra_forbidden" else err["msg"]
                errors.append((f"{path}.{where}" if where else path,
                               reason.removeprefix("Value error, ")))
    return errors


def section_of(channels: ChannelsConfig, name: str) -> BaseModel | None:
    """``channels.<name>``: a built-in section or a plugin's; None when not configured."""
    value = getattr(channels, name, None)
    return value if isinstance(value, BaseModel) else None
