"""``parley doctor``: checks for real what a gateway needs, each failure with its fix.

The config and its paths, the model's key, one model call (with its latency), the chat
channels' tokens against their servers, the ports the channels listen on, the workspace and
data folder writable (a file written and removed), the exec sandbox, the free disk space.
Exit status 1 when anything failed.
"""

from __future__ import annotations

import typer
from rich.text import Text

from gateway.cli_common import ConfigOpt, load, out, run_sync
from gateway.kernel.config import Config

# gateway.cli imports this module to register it: the rest is imported when a command runs.


class Report:
    def __init__(self) -> None:
        self.failed = 0

    def ok(self, what: str, detail: str) -> None:
        out.print(Text.assemble(("ok    ", "green"), f"{what}: {detail}"), soft_wrap=True)

    def note(self, what: str, detail: str) -> None:
        out.print(Text.assemble(("note  ", "yellow"), f"{what}: {detail}"), soft_wrap=True)

    def fail(self, what: str, detail: str, fix: str) -> None:
        self.failed += 1
        out.print(Text.assemble(("FAIL  ", "bold red"), f"{what}: {detail}"), soft_wrap=True)
        out.print(Text(f"      fix: {fix}"), soft_wrap=True)


def _model(config: Config, report: Report) -> None:
    from gateway.checks import probe_model
    from gateway.cli_config import key_source

    has_key, where = key_source(config.agent)
    if has_key:
        report.ok("key", where)
    else:
        report.fail("key", "no API key for " + config.agent.model, where.removeprefix(
            "MISSING: "))
        return
    probe = run_sync(probe_model(config.agent))
    if probe.ok:
        report.ok("model", probe.detail)
    else:
        report.fail("model", probe.detail, "check agent.model, agent.api_base and the key; "
                    "`parley chat -m hello` shows the same error in context")


def _channels(config: Config, report: Report) -> None:
    from gateway.checks import probe_discord, probe_telegram

    telegram, discord = config.channels.telegram, config.channels.discord
    if telegram.enabled and telegram.token:
        probe = run_sync(probe_telegram(telegram.base_url, telegram.token.get_secret_value()))
        (report.ok("telegram", probe.detail) if probe.ok else
         report.fail("telegram", probe.detail, "set channels.telegram.token to the token "
                     "@BotFather gave (e.g. ${TELEGRAM_BOT_TOKEN})"))
    if discord.enabled and discord.token:
        probe = run_sync(probe_discord(discord.api_base, discord.token.get_secret_value()))
        (report.ok("discord", probe.detail) if probe.ok else
         report.fail("discord", probe.detail, "set channels.discord.token to the bot's token "
                     "(e.g. ${DISCORD_BOT_TOKEN})"))


def _ports(config: Config, report: Report) -> None:
    from gateway.cli_inspect import probe_health
    from gateway.preflight import listeners, port_problems

    if not listeners(config):
        return
    if probe_health(config) is not None:
        report.ok("ports", "in use by this config's running gateway")
        return
    problems = port_problems(config)
    for problem in problems:
        report.fail("ports", problem.message.split(";")[0], problem.message.split("; ")[-1])
    if not problems:
        report.ok("ports", "free: " + ", ".join(f"{h}:{p}" for _, h, p in listeners(config)))


def _sandbox(config: Config, report: Report) -> None:
    from agent.tools.exec_access import GatewayFiles, resolve_exec_access

    access = run_sync(resolve_exec_access(config.agent.tools.exec, GatewayFiles.of(config)))
    line = access.describe()
    if access.state in ("sandboxed", "disabled"):
        report.ok("sandbox", line)
    elif access.state == "unsandboxed":
        report.note("sandbox", line)
    else:
        report.fail("sandbox", line, "install bubblewrap (Debian/Ubuntu: apt install "
                    "bubblewrap) or set agent.tools.exec.enabled: false")


def doctor(config_path: ConfigOpt = None) -> None:
    """Check config, key, a model call, tokens, ports, folders, sandbox and disk.

    Exit status 1 when anything failed, each failure with its fix."""
    from gateway.preflight import disk_problem, free_bytes, path_problems

    config = load(config_path)
    report = Report()
    report.ok("config", str(config.source))
    problems = path_problems(config)
    for problem in problems:
        report.fail(problem.key, problem.message.split(";")[0], problem.message.split("; ")[-1])
    for key, path in (("workspace", config.workspace_path), ("data_dir", config.data_path)):
        if not any(p.key == key for p in problems):  # a folder was made in it and removed
            report.ok(key, f"{path} {'writable' if path.exists() else 'can be created'}")
    _model(config, report)
    _channels(config, report)
    _ports(config, report)
    _sandbox(config, report)
    if disk := disk_problem(config):
        report.fail("disk", disk.message.split(";")[0], disk.message.split("; ")[-1])
    else:
        report.ok("disk", f"{free_bytes(config.data_path) // (1024 * 1024):,} MB free under "
                          f"{config.data_path}")
    if report.failed:
        out.print(Text(f"{report.failed} check(s) failed"), style="bold red")
        raise typer.Exit(1)
    out.print(Text("all checks passed"), style="green")
