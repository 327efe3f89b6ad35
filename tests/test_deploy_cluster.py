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
