"""deploy/compose.yaml and deploy/cluster.yaml (README, "Running several processes"): the
example is a config Parley accepts, and both gateways share one PostgreSQL."""

from __future__ import annotations

from pathlib import Path

import yaml

from gateway.kernel.config import load_config

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"


def test_two_gateways_share_one_postgresql() -> None:
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services = compose["services"]
    gateways = {k: v for k, v in services.items() if k.startswith("gateway")}
    assert len(gateways) == 2 and "postgres" in services
    urls = {g["environment"]["PARLEY_DATABASE"] for g in gateways.values()}
    assert len(urls) == 1 and next(iter(urls)).startswith("postgresql://")
    for gateway in gateways.values():
        assert "/etc/parley/cluster.yaml" in gateway["command"]


def test_the_cluster_config_is_valid(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("PARLEY_DATABASE", "postgresql://parley:pw@postgres:5432/parley")
    monkeypatch.setenv("PARLEY_LOCAL_TOKEN", "t" * 32)
    config = load_config(DEPLOY / "cluster.yaml")
    assert config.store_target == "postgresql://parley:pw@postgres:5432/parley"
    assert config.store_label == "postgresql://parley:***@postgres:5432/parley"
    assert config.cluster.lease == 15 and config.cron.enabled


def test_the_cluster_config_runs_a_bot_in_both_gateways_when_asked(  # type: ignore[no-untyped-def]
        monkeypatch) -> None:
    """Off by default (no token needed); with the variables compose passes, Telegram and
    Discord are on in every gateway (one holds each connection: a leader lease)."""
    monkeypatch.setenv("PARLEY_DATABASE", "postgresql://parley:pw@postgres:5432/parley")
    monkeypatch.setenv("PARLEY_LOCAL_TOKEN", "t" * 32)
    config = load_config(DEPLOY / "cluster.yaml")
    assert not config.channels.telegram.enabled and not config.channels.discord.enabled
    for name, value in {"TELEGRAM_ENABLED": "true", "TELEGRAM_BOT_TOKEN": "123:abc",
                        "DISCORD_ENABLED": "true", "DISCORD_BOT_TOKEN": "d" * 40}.items():
        monkeypatch.setenv(name, value)
    config = load_config(DEPLOY / "cluster.yaml")
    assert config.channels.telegram.enabled and config.channels.telegram.mode == "polling"
    assert config.channels.discord.enabled
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    for gateway in (v for k, v in compose["services"].items() if k.startswith("gateway")):
        assert {"TELEGRAM_ENABLED", "TELEGRAM_BOT_TOKEN", "DISCORD_ENABLED",
                "DISCORD_BOT_TOKEN"} <= gateway["environment"].keys()
