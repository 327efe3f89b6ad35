"""The ``agent:`` section: model and transport, context budget and compaction, tools,
memory and MCP servers.

Separate from the root ``Config`` (``gateway/kernel/config.py``), which re-exports every class
here, so the agent's settings read on their own.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import ByteSize, Field, PrivateAttr, field_validator, model_validator

from gateway.kernel.config_fields import (
    Duration,
    OptionalSecret,
    OptionalStr,
    Section,
    check_target,
)
from gateway.kernel.config_media import MediaConfig
from gateway.kernel.config_trust import TrustConfig, check_tool_names
from gateway.kernel.config_usage import (
    ChatDefaults,
    LimitsConfig,
    ModelsConfig,
    UsageConfig,
    check_chat_defaults,
)


class CompactionConfig(Section):
    enabled: bool = True
    compact_at_share: float = Field(0.9, gt=0, le=1)
    """Compact when the history since the last compaction passes this share of its token
    budget (the window less the reply reserve and the fixed part of a request)."""
    keep_recent_share: float = Field(0.3, gt=0, lt=1)
    """Share of the history budget kept word for word after a compaction ..."""
    keep_recent_max_tokens: int = Field(8000, gt=0)
    """... but at most this many tokens: a large window then compacts rarely (about once
    per ``compact_at_share`` × budget − this much new history)."""
    memory_flush: bool = True
    memory_flush_at_share: float = Field(0.75, gt=0, le=1)
    """The memory flush (the agent saves lasting facts) runs once per compaction cycle, when
    the history passes this share of its budget: before the compaction is due."""
    timeout: Duration = 60.0
    summary_max_tokens: int = Field(800, gt=50)
    """A summary's cap; a small window caps it lower (a fifth of the history budget)."""

    @model_validator(mode="after")
    def _flush_before_compaction(self) -> CompactionConfig:
        if self.memory_flush_at_share > self.compact_at_share:
            raise ValueError(f"memory_flush_at_share ({self.memory_flush_at_share}) must not "
                             f"be above compact_at_share ({self.compact_at_share})")
        if self.keep_recent_share >= self.compact_at_share:
            raise ValueError(f"keep_recent_share ({self.keep_recent_share}) must be below "
                             f"compact_at_share ({self.compact_at_share})")
        return self


class BootstrapConfig(Section):
    """More workspace files in the system prompt (``agent.context.bootstrap``)."""

    extra_files: list[str] = Field(default_factory=list)
    """Workspace-relative paths, after TOOLS.md, within the same size limits; they reach
    every sender's prompt (like AGENTS.md), so keep private notes out of them."""

    @field_validator("extra_files")
    @classmethod
    def _relative(cls, paths: list[str]) -> list[str]:
        for i, path in enumerate(paths):
            if not path.strip() or Path(path).is_absolute() or ".." in Path(path).parts:
                raise ValueError(f"[{i}] {path!r} must be a path inside the workspace, "
                                 "relative to it (no '..')")
        return paths


class SkillsConfig(Section):
    """Where skills come from besides the built-in ones and the workspace's ``skills/``."""

    folders: list[Path] = Field(default_factory=list)
    """More skill folders; a later one overrides an earlier one's skill of the same name."""
    user_folder: Path | None = Path("~/.parley/skills")
    """Your own skills for every workspace; over ``folders``, under the workspace's."""

    @field_validator("folders", "user_folder")
    @classmethod
    def _expand(cls, value: Any) -> Any:
        if isinstance(value, list):
            return [p.expanduser() for p in value]
        return value.expanduser() if value is not None else None


class ContextConfig(Section):
    max_context_tokens: int | None = Field(
        None, gt=0, description="None: the model's window from litellm, else 32,000")
    max_recent_messages: int = Field(1000, gt=0)
    """At most this many stored messages are read for a request (a cap on the rows a turn
    reads); more than that makes the session due for compaction. Compaction itself follows
    the history's tokens (``compaction.compact_at_share``)."""
    max_tool_snippet_tokens: int = Field(2000, gt=0)
    reply_reserve_tokens: int | None = Field(None, ge=0)
    """Tokens kept free for the reply. None: scaled with the window (an eighth of it, at
    least 256, at most ``agent.max_tokens``)."""
    bootstrap_max_chars: int = Field(20_000, gt=100)
    bootstrap_total_max_chars: int = Field(150_000, gt=100)
    bootstrap: BootstrapConfig = BootstrapConfig()
    compaction: CompactionConfig = CompactionConfig()


Size = Annotated[ByteSize, Field(gt=0)]
"""A size in bytes, written ``100MiB``, ``1GiB``, ``512kB`` or a bare number."""


class ExecSandboxConfig(Section):
    """Where every ``exec`` command runs (``agent/tools/sandbox.py``): bubblewrap namespaces,
    the system read-only, only the workspace writable, limits per command."""

    bwrap: str = Field("bwrap", min_length=1)
    """The bubblewrap binary: a name looked up on PATH, or a path."""
    network: bool = False
    """Off: the command has only its own loopback. On: the host's network (and DNS)."""
    cpu_time: Duration = Field(60.0, gt=0)
    memory: Size = ByteSize(1 << 30)
    """Address space per process (RLIMIT_AS); also the size of the command's private /tmp."""
    processes: int = Field(64, ge=8)
    """Processes and threads the command may have at once, the sandbox's own two included."""
    file_size: Size = ByteSize(100 << 20)
    ro_paths: list[Path] = Field(default_factory=list)
    """More host folders shown read-only (e.g. /opt, /nix); the system folders always are."""
    hide: list[Path] = Field(default_factory=list)
    """More host paths never shown, on top of the gateway's config, data and log files."""

    @field_validator("ro_paths", "hide")
    @classmethod
    def _absolute(cls, paths: list[Path]) -> list[Path]:
        for path in paths:
            if not path.expanduser().is_absolute():
                raise ValueError(f"{str(path)!r} must be an absolute path")
        return [path.expanduser() for path in paths]


class ExecToolConfig(Section):
    enabled: bool = True
    timeout: Duration = 60.0
    max_output_chars: int = Field(10_000, gt=100)
    deny: list[str] = Field(default_factory=list, description="extra regexes refused as commands")
    sandbox: ExecSandboxConfig = ExecSandboxConfig()
    dangerously_run_unsandboxed: bool = False
    """Run commands without the sandbox, as the gateway's own user seeing everything it sees
    (its config, keys and data included). Only for a machine that is itself disposable."""

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


class FileToolsConfig(Section):
    enabled: bool = True
    restrict_to_workspace: bool = True
    max_read_chars: int = Field(12_000, gt=100)


class MessageToolConfig(Section):
    """``agent/tools/message.py``: the agent sends text and workspace files to its chat."""

    enabled: bool = True
    allowed_targets: list[str] = Field(default_factory=list)
    """Other chats (``channel:chat_id``) the agent may message; its own chat always."""

    @field_validator("allowed_targets")
    @classmethod
    def _targets(cls, values: list[str]) -> list[str]:
        return [check_target(v) for v in values]


class CronToolConfig(Section):
    """``agent/tools/cron.py``: the agent adds, lists and removes its chat's scheduled jobs."""

    enabled: bool = True


class WebSearchConfig(Section):
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


class WebToolsConfig(Section):
    """``web_fetch`` (``agent/tools/web.py``) and its SSRF guard; ``search``: web_search."""

    enabled: bool = True
    allow_hosts: list[str] = Field(default_factory=list)
    """Host names, addresses or networks (10.0.0.0/8) web_fetch may reach although they are
    private, loopback or link-local."""
    max_bytes: int = Field(2_000_000, gt=0)
    max_chars: int = Field(12_000, gt=100)
    timeout: Duration = 20.0
    search: WebSearchConfig = WebSearchConfig()


class SpawnToolConfig(Section):
    """``agent/subagent.py``: the ``spawn`` tool hands a task to a subagent."""

    enabled: bool = True
    max_iterations: int = Field(15, gt=0)
    max_concurrent: int = Field(3, gt=0)
    timeout: Duration = 300.0


CORE_TOOLS = ("read_file", "write_file", "edit_file", "list_dir", "exec", "memory",
              "web_fetch", "web_search")


class SessionSearchConfig(Section):
    """``session_search`` (``agent/tools/session_search.py``): this chat's past messages."""

    enabled: bool = True


class ToolsConfig(Section):
    core: list[str] = Field(default_factory=lambda: list(CORE_TOOLS))
    """Tools offered in full on every request (names, shell-style patterns; ``["*"]``: all).
    The others a sender may use are named in one line (``load_tools``) and offered once the
    model loads them, or when the conversation used them lately."""
    files: FileToolsConfig = FileToolsConfig()
    exec: ExecToolConfig = ExecToolConfig()
    message: MessageToolConfig = MessageToolConfig()
    cron: CronToolConfig = CronToolConfig()
    web: WebToolsConfig = WebToolsConfig()
    spawn: SpawnToolConfig = SpawnToolConfig()
    session_search: SessionSearchConfig = SessionSearchConfig()
    max_result_chars: int = Field(16_000, gt=100)

    @field_validator("core")
    @classmethod
    def _core_names(cls, names: list[str]) -> list[str]:
        return check_tool_names(names)


class MCPServerConfig(Section):
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


class MCPConfig(Section):
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


class MemoryConfig(Section):
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


class FallbackModelConfig(Section):
    """A fallback on another server or provider: its own ``api_base`` and ``api_key``
    (unset: the provider's own, e.g. ``OPENAI_API_KEY``). A fallback written as a plain
    model name shares the main model's ``api_base`` and ``api_key``."""

    model: str = Field(min_length=1)
    api_base: OptionalStr = None
    api_key: OptionalStr = None


class AgentConfig(Section):
    _defaulted: dict[str, str] = PrivateAttr(default_factory=dict)
    """Keys whose ``${NAME:-default}`` took its default (NAME unset where the config was
    read): key → NAME (``parse_config``), so a message about them can name the variable."""
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
    degraded_after_failures: int = Field(3, ge=1)
    """Model calls failing in a row (after retries and fallbacks) before health says
    ``degraded``."""
    context: ContextConfig = ContextConfig()
    skills: SkillsConfig = SkillsConfig()
    tools: ToolsConfig = ToolsConfig()
    memory: MemoryConfig = MemoryConfig()
    mcp: MCPConfig = MCPConfig()
    trust: TrustConfig = TrustConfig()
    usage: UsageConfig = UsageConfig()
    limits: LimitsConfig = LimitsConfig()
    models: ModelsConfig = ModelsConfig()
    media: MediaConfig = MediaConfig()
    """Received files: the inbox's cleanup, transcription, images, documents, voice replies
    (``gateway/kernel/config_media.py``)."""
    chats: dict[str, ChatDefaults] = Field(default_factory=dict)
    """``channel:chat_id`` (one chat), ``channel:server:<id>`` (a Discord server's chats) or
    ``channel`` (all its chats) → the default model alias and a system-prompt addition; the
    chat's own entry wins, then its server's, then its channel's."""

    @model_validator(mode="after")
    def _chat_models(self) -> AgentConfig:
        check_chat_defaults(self.chats, self.models)
        return self

    @field_validator("timezone")
    @classmethod
    def _known_timezone(cls, value: str) -> str:
        from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError) as exc:
            raise ValueError(f"unknown IANA timezone {value!r}") from exc
        return value
