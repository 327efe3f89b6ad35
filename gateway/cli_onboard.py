"""``parley onboard``: a working setup in one command — it asks for the model (and tries it),
the key, the chat channels (and tries their tokens), and writes the config, the workspace and
``secrets.env``.

Keys and tokens never land in the config: it holds ``${NAME}`` references, and a value typed
here goes to ``secrets.env`` beside it (mode 600), which the config loader reads for names the
environment lacks. Nothing typed is echoed. ``--non-interactive`` takes the same choices as
options (secrets only by the name of a variable that holds them) for scripts; without options
it writes the config ``make run`` uses, which reads PARLEY_MODEL, PARLEY_API_KEY and
PARLEY_API_BASE from the environment.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

import typer

from gateway.cli_common import ConfigOpt, fail, run_sync, say
from gateway.kernel.config import DEFAULT_CONFIG_PATH, SECRETS_FILE, find_config_path

# gateway.cli imports this module to register it: the rest is imported when a command runs.

PROVIDERS = {
    # name: (default model, key variable, api_base asked for)
    "openai": ("openai/gpt-4o-mini", "OPENAI_API_KEY", False),
    "anthropic": ("anthropic/claude-sonnet-4-5", "ANTHROPIC_API_KEY", False),
    "openai-compatible": ("openai/llama3.1", "PARLEY_API_KEY", True),
}
ENV_DEFAULTS = ("${PARLEY_MODEL:-openai/gpt-4o-mini}", "${PARLEY_API_KEY:-}",
                "${PARLEY_API_BASE:-}")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass
class ChatChannel:
    token_var: str
    server: str
    """Telegram's ``base_url`` or Discord's ``api_base``."""
    allow_from: list[str] = field(default_factory=list)


@dataclass
class Choices:
    model: str = ENV_DEFAULTS[0]
    api_key: str = ENV_DEFAULTS[1]
    api_base: str = ENV_DEFAULTS[2]
    webchat: bool = True
    telegram: ChatChannel | None = None
    discord: ChatChannel | None = None


def render(choices: Choices, workspace: str, data_dir: str) -> str:
    """The config file's text for ``choices``."""
    lines = [
        "# Parley configuration, written by `parley onboard`. Every option, with comments:",
        "# config.example.yaml in the repository. Keys and tokens are ${NAME} references:",
        f"# the environment, else {SECRETS_FILE} beside this file (mode 600).",
        f"workspace: {workspace}",
        f"data_dir: {data_dir}",
        "",
        "agent:",
        "  # litellm model name: openai/gpt-4o-mini, anthropic/claude-sonnet-4-5, ...",
        f"  model: {choices.model}",
        "  # empty: the provider's own variable (OPENAI_API_KEY, ANTHROPIC_API_KEY, ...)",
        f"  api_key: {choices.api_key}",
        "  # an OpenAI-compatible server (Ollama, vLLM, LM Studio): http://localhost:11434/v1",
        f"  api_base: {choices.api_base}",
        "",
        "channels:",
        "  # Both listen on loopback; another host (PARLEY_HOST=0.0.0.0 in a container) needs",
        "  # their tokens: python3 -c 'import secrets; print(secrets.token_urlsafe())'",
        "  local:",
        "    enabled: true",
        "    host: ${PARLEY_HOST:-127.0.0.1}",
        "    port: ${PARLEY_LOCAL_PORT:-8765}",
        "    token: ${PARLEY_LOCAL_TOKEN:-}",
        "  webchat:",
        f"    enabled: {'true' if choices.webchat else 'false'}",
        "    host: ${PARLEY_HOST:-127.0.0.1}",
        "    port: ${PARLEY_WEBCHAT_PORT:-8766}",
        "    token: ${PARLEY_WEBCHAT_TOKEN:-}",
    ]
    for name, channel, server_key in (("telegram", choices.telegram, "base_url"),
                                      ("discord", choices.discord, "api_base")):
        if channel is None:
            continue
        lines += [f"  {name}:", "    enabled: true", f"    token: ${{{channel.token_var}}}",
                  f"    {server_key}: {channel.server}",
                  f"    allow_from: [{', '.join(repr(u) for u in channel.allow_from)}]"]
    return "\n".join(lines) + "\n"


def _template() -> str:
    """The default config with ``{workspace}`` and ``{data_dir}`` for ``str.format``."""
    text = render(Choices(), "\0w", "\0d").replace("{", "{{").replace("}", "}}")
    return text.replace("\0w", "{workspace}").replace("\0d", "{data_dir}")


ONBOARD_CONFIG = _template()
"""What ``parley onboard --non-interactive`` writes; the benchmarks start from it too."""


def _known(name: str, secrets: dict[str, str]) -> bool:
    return bool(os.environ.get(name) or secrets.get(name))


def store_secret(path: Path, name: str, value: str) -> None:
    """Set ``name`` in ``secrets.env`` (created with mode 600), keeping its other lines."""
    lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
    lines = [line for line in lines if line.partition("=")[0].strip() != name]
    lines.append(f"{name}={value}")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write("\n".join(lines) + "\n")
    path.chmod(0o600)


def hidden_prompt(text: str) -> str:
    """A secret, not echoed: from the terminal, or a line of stdin when it is not one (a
    pipe, a test) rather than waiting on a /dev/tty nobody types into."""
    if sys.stdin.isatty():
        return str(typer.prompt(text, hide_input=True)).strip()
    typer.echo(f"{text}: ", nl=False)
    line = sys.stdin.readline()
    if not line:
        raise typer.Abort()
    typer.echo()
    return line.strip()


def _secret(name: str, what: str, secrets_path: Path, secrets: dict[str, str]) -> str:
    """The value of ``name`` from the environment or secrets.env, else asked (hidden)."""
    if value := os.environ.get(name) or secrets.get(name):
        say(f"  using {name} from the {'environment' if os.environ.get(name) else SECRETS_FILE}")
        return value
    value = hidden_prompt(f"  {what} (input hidden; kept in {secrets_path} as {name})")
    secrets[name] = value
    return value


def _ask_model(choices: Choices, secrets_path: Path, secrets: dict[str, str]) -> None:
    from gateway.checks import probe_model
    from gateway.kernel.config import AgentConfig

    names = list(PROVIDERS)
    say("Model provider: " + ", ".join(f"{i + 1}) {n}" for i, n in enumerate(names)))
    pick = typer.prompt("  provider", default="1").strip()
    provider = names[int(pick) - 1] if pick.isdigit() and 0 < int(pick) <= len(names) else pick
    if provider not in PROVIDERS:
        raise fail(f"unknown provider {provider!r}: {', '.join(names)}")
    model, key_var, wants_base = PROVIDERS[provider]
    while True:
        choices.api_base = typer.prompt("  api_base (the server's /v1 URL)",
                                        default="http://localhost:11434/v1") if wants_base else ""
        choices.model = typer.prompt("  model", default=model).strip()
        if wants_base and not choices.model.startswith("openai/"):
            choices.model = "openai/" + choices.model
        key_var = typer.prompt("  environment variable holding the API key",
                               default=key_var).strip()
        if not _NAME.match(key_var):
            say(f"  {key_var!r} is not a variable name")
            continue
        key = "" if wants_base and not typer.confirm("  does the server need a key?",
                                                     default=False) \
            else _secret(key_var, "API key", secrets_path, secrets)
        choices.api_key = f"${{{key_var}}}" if key else ""
        say("  trying the model…")
        probe = run_sync(probe_model(AgentConfig(model=choices.model, api_key=key or None,
                                                 api_base=choices.api_base or None)))
        say(f"  {'ok' if probe.ok else 'FAILED'}: {probe.detail}")
        if probe.ok or not typer.confirm("  try other settings?", default=True):
            return


def _ask_channel(name: str, server: str, secrets_path: Path,
                 secrets: dict[str, str]) -> ChatChannel | None:
    from gateway.checks import probe_discord, probe_telegram

    if not typer.confirm(f"Use {name.capitalize()}?", default=False):
        return None
    var = f"{name.upper()}_BOT_TOKEN"
    for _ in range(3):
        token = _secret(var, f"{name.capitalize()} bot token", secrets_path, secrets)
        probe = run_sync((probe_telegram if name == "telegram" else probe_discord)(server, token))
        say(f"  {'ok' if probe.ok else 'FAILED'}: {probe.detail}")
        if probe.ok:
            who = typer.prompt(f"  your own {name.capitalize()} user id (served always; "
                               "empty: approve yourself by pairing)", default="").strip()
            return ChatChannel(var, server, [who] if who else [])
        secrets.pop(var, None)
        os.environ.pop(var, None)
    say(f"  {name} skipped; run `parley onboard --force` again when you have the token")
    return None


def _from_options(choices: Choices, *, model: str | None, api_base: str | None,
                  api_key_env: str | None, telegram_env: str | None, telegram_url: str,
                  discord_env: str | None, discord_url: str,
                  secrets: dict[str, str]) -> None:
    for option, name in (("--api-key-env", api_key_env), ("--telegram-token-env", telegram_env),
                         ("--discord-token-env", discord_env)):
        if name is None:
            continue
        if not _NAME.match(name):  # maybe the secret itself: never repeat it
            raise fail(f"{option} takes the NAME of an environment variable (letters, digits, "
                       "_) that holds the secret, never the secret itself")
        if not _known(name, secrets):
            raise fail(f"{option} {name}: {name} is not set; export it (the key or token "
                       f"itself) or put it in {SECRETS_FILE}, and run again")
    if model is not None:
        choices.model, choices.api_base = model, api_base or ""
        choices.api_key = f"${{{api_key_env}}}" if api_key_env else ""
    elif api_base or api_key_env:
        raise fail("--api-base and --api-key-env go with --model")
    if telegram_env:
        choices.telegram = ChatChannel(telegram_env, telegram_url)
    if discord_env:
        choices.discord = ChatChannel(discord_env, discord_url)


def _probe_all(choices: Choices, config_text: str, secrets: dict[str, str]) -> list[str]:
    """What fails among the model and the channels' tokens, as the config will read them."""
    import yaml

    from gateway.checks import probe_discord, probe_model, probe_telegram
    from gateway.kernel.config import parse_config

    config = parse_config(yaml.safe_load(config_text), env={**secrets, **os.environ})
    failed = []
    probes = [("model", probe_model(config.agent))]
    if choices.telegram and config.channels.telegram.token:
        probes.append(("telegram", probe_telegram(
            config.channels.telegram.base_url,
            config.channels.telegram.token.get_secret_value())))
    if choices.discord and config.channels.discord.token:
        probes.append(("discord", probe_discord(
            config.channels.discord.api_base, config.channels.discord.token.get_secret_value())))
    for name, coro in probes:
        probe = run_sync(coro)
        say(f"{name}: {'ok' if probe.ok else 'FAILED'}: {probe.detail}")
        if not probe.ok:
            failed.append(name)
    return failed


def onboard(
    directory: Annotated[Path, typer.Option("--dir", help="Where config and workspace go.")] =
    Path("~/.parley"),
    config_path: ConfigOpt = None,
    force: Annotated[bool, typer.Option(help="Overwrite an existing config.")] = False,
    non_interactive: Annotated[bool, typer.Option(
        "--non-interactive", help="Ask nothing: take the choices from the options.")] = False,
    model: Annotated[str | None, typer.Option(help="litellm model name (default: read "
                                                   "PARLEY_MODEL at start).")] = None,
    api_base: Annotated[str | None, typer.Option(help="OpenAI-compatible server URL.")] = None,
    api_key_env: Annotated[str | None, typer.Option(
        help="NAME of the variable holding the API key.")] = None,
    telegram_token_env: Annotated[str | None, typer.Option(
        help="NAME of the variable holding a Telegram bot token: enables Telegram.")] = None,
    telegram_base_url: Annotated[str, typer.Option(help="Bot API server.")] =
    "https://api.telegram.org/bot",
    discord_token_env: Annotated[str | None, typer.Option(
        help="NAME of the variable holding a Discord bot token: enables Discord.")] = None,
    discord_api_base: Annotated[str, typer.Option(help="Discord API server.")] =
    "https://discord.com/api/v10",
    webchat: Annotated[bool, typer.Option(help="The chat page on 127.0.0.1:8766.")] = True,
    skip_test: Annotated[bool, typer.Option(
        "--skip-test", help="Write without trying the model and the tokens.")] = False,
) -> None:
    """Set up: ask for model, key, channels and WebChat (each tried), write the config.

    Keys and tokens go to secrets.env beside the config (mode 600), never into it; the
    workspace is made from the templates. --non-interactive takes the choices from the
    options (secrets by the name of the variable that holds them)."""
    from gateway.kernel.config import read_env_file
    from workspace.bootstrap import seed_workspace

    base = directory.expanduser()
    default_dir = directory == Path("~/.parley")
    target = (config_path.expanduser() if config_path else
              find_config_path() if default_dir else base / "config.yaml")
    if default_dir and target != DEFAULT_CONFIG_PATH.expanduser():
        base = target.parent  # $PARLEY_CONFIG names the config: the rest goes beside it
    workspace, data_dir = base / "workspace", base / "data"
    if target.exists() and not force:
        say(f"config {target} exists; kept it (use --force to overwrite)")
    else:
        secrets_path = target.parent / SECRETS_FILE
        secrets = read_env_file(secrets_path)
        choices = Choices(webchat=webchat)
        if non_interactive:
            _from_options(choices, model=model, api_base=api_base, api_key_env=api_key_env,
                          telegram_env=telegram_token_env, telegram_url=telegram_base_url,
                          discord_env=discord_token_env, discord_url=discord_api_base,
                          secrets=secrets)
        else:
            _ask_model(choices, secrets_path, secrets)
            choices.telegram = _ask_channel("telegram", telegram_base_url, secrets_path, secrets)
            choices.discord = _ask_channel("discord", discord_api_base, secrets_path, secrets)
            choices.webchat = typer.confirm("Chat page in the browser (WebChat on "
                                            "127.0.0.1:8766)?", default=webchat)
        text = render(choices, str(workspace), str(data_dir))
        if non_interactive and not skip_test and (failed := _probe_all(choices, text, secrets)):
            raise fail(f"not written: {', '.join(failed)} failed (see above); fix it, or "
                       "write anyway with --skip-test")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
        say(f"wrote {target}")
        for name, value in secrets.items():
            if os.environ.get(name) != value:
                store_secret(secrets_path, name, value)
        if secrets_path.exists():
            say(f"secrets in {secrets_path} (mode 600)")
    written = seed_workspace(workspace)
    say(f"workspace {workspace}: {len(written)} new file(s)")
    flag = "" if target == find_config_path() else f" --config {target}"
    say(f"next: parley doctor{flag}; then parley gateway{flag}")
