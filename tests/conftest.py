"""Shared fixtures: a scripted model server, a config pointing at it, a running gateway."""

from __future__ import annotations

import os
import re
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ["PARLEY_CHECKED_FROZEN"] = "1"  # value classes raise on assignment, here and in
# the gateways the tests start (gateway/kernel/frozen.py); before anything of ours is imported

from gateway.app import Gateway  # noqa: E402
from gateway.kernel.config import Config, parse_config  # noqa: E402
from tests.fakes.openai_server import ScriptedLLM  # noqa: E402

MakeConfig = Callable[..., Config]


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(
            out.get(key), dict) else value
    return out


@pytest.fixture
async def llm() -> AsyncIterator[ScriptedLLM]:
    async with ScriptedLLM() as server:
        yield server


@pytest.fixture
def make_config(tmp_path: Path, llm: ScriptedLLM) -> MakeConfig:
    """A config for a gateway in ``tmp_path`` talking to the scripted model."""

    def make(**overrides: Any) -> Config:
        data = {
            "workspace": str(tmp_path / "workspace"),
            "data_dir": str(tmp_path / "data"),
            "agent": {"model": "openai/test-model", "api_base": llm.base_url,
                      "api_key": "sk-test", "retry_backoff": "0.01s", "timeout": "10s",
                      "context": {"max_context_tokens": 32000}},
            "channels": {"local": {"port": 0}},
        }
        return parse_config(_merge(data, overrides), env={})

    return make


@pytest.fixture
async def gateway(make_config: MakeConfig) -> AsyncIterator[Gateway]:
    gw = Gateway(make_config(), grace=2.0)
    await gw.start()
    try:
        yield gw
    finally:
        await gw.stop()


def offered_tools(request: dict[str, Any], *, loadable: bool = True) -> set[str]:
    """The tools a model request offers in full, and (``loadable``) those ``load_tools``
    names in its one line."""
    names: set[str] = set()
    for schema in request.get("tools") or ():
        fn = schema["function"]
        names.add(fn["name"])
        if fn["name"] == "load_tools" and loadable:
            names |= set(re.findall(r"(?:: |; )([\w-]+) \(", fn["description"]))
    return names


# PostgreSQL (issue 19): one throwaway cluster for the session, a fresh database per test --------

@pytest.fixture(scope="session")
def postgres_cluster() -> Any:
    """A running throwaway cluster (tests/fakes/postgres.py); skips, saying why, when Debian's
    ``postgresql`` is not installed (``make test`` installs it)."""
    from tests.fakes.postgres import PostgresCluster, find_bin_dir

    bin_dir = find_bin_dir()
    if bin_dir is None:
        pytest.skip("PostgreSQL is not installed (apt-get install postgresql; make test does)")
    cluster = PostgresCluster(bin_dir)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def postgres_url(postgres_cluster: Any) -> str:
    """The URL of a new, empty database on the session's cluster."""
    return str(postgres_cluster.fresh_database())
