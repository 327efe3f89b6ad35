"""``parley config check``: the config file parses, and the paths it names can be used.

Finds before a start what would stop the gateway at start: a workspace or data folder that is
a file or cannot be created, a database that is not SQLite, a log file in a folder that cannot
be written. Each problem is one line naming its key.
"""

from __future__ import annotations

import os

from gateway.cli_common import ConfigOpt, err, load, say
from gateway.kernel.config import AgentConfig, Config

# gateway.cli imports this module to register it: the rest is imported when a command runs.


def key_source(agent: AgentConfig) -> tuple[bool, str]:
    """Whether the main model has a key (or needs none), and where it comes from, in words.

    A key written in the config (usually ``${VAR}``) is "set"; otherwise the provider's own
    variables are looked up, so "from environment" is said only when one of them is there."""
    if agent.api_key:
        return True, "set in the config"
    if agent.api_base:
        return True, "none (api_base needs none unless the server asks for one)"
    from agent.provider import _lib

    try:
        found = _lib().validate_environment(agent.model)
    except Exception:  # an unknown provider prefix: the first call will say so
        return True, "unknown for this provider (the first call will tell)"
    missing = list(found.get("missing_keys") or [])
    if missing:
        return False, (f"MISSING: export {' or '.join(missing)}, or set agent.api_key "
                       f"(e.g. api_key: ${{{missing[0]}}})")
    names = [n for n in os.environ if n.endswith("_API_KEY")]
    provider = agent.model.split("/", 1)[0].upper()
    named = next((n for n in names if n.startswith(provider)), None)
    return True, f"from the environment ({named})" if named else "from the environment"


def summary(config: Config) -> list[str]:
    from agent.provider import Provider

    channels = [n for n, c in config.channels if getattr(c, "enabled", False)]
    fallbacks = [f if isinstance(f, str) else f.model for f in config.agent.fallbacks]
    route = ("posted directly (OpenAI-compatible)" if Provider(config.agent).direct(
        config.agent.model) else "through litellm")
    base = f"api_base {config.agent.api_base}" if config.agent.api_base else "provider default"
    _, key = key_source(config.agent)
    lines = [
        f"  file:      {config.source}",
        f"  model:     {config.agent.model}"
        + (f" (fallbacks: {', '.join(fallbacks)})" if fallbacks else ""),
        f"  api:       {base}, key {key}, {route}",
        f"  workspace: {config.workspace_path}",
        f"  data:      {config.store_label}",
        f"  channels:  {', '.join(channels) or 'none'}",
    ]
    if config.channels.local.enabled:
        local = config.channels.local
        lines.append(f"  local:     http://{local.host}:{local.port}/v1/messages")
    if config.channels.webchat.enabled:
        web = config.channels.webchat
        lines.append(f"  webchat:   http://{web.host}:{web.port}")
    return lines


def config_check(config_path: ConfigOpt = None) -> None:
    """Validate the config and its paths: `ok` and a summary, or each error with its key."""
    import typer

    from gateway.preflight import path_problems

    config = load(config_path)
    problems = path_problems(config)
    if problems:
        err.print(f"invalid config {config.source}:", markup=False, highlight=False)
        for problem in problems:
            say(f"  {problem}", err)
        raise typer.Exit(2)
    say("ok")
    for line in summary(config):
        say(line)
