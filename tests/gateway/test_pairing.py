"""Pairing codes: issued, limited, expiring, approved from another connection, and the CLI."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from gateway.cli import app
from gateway.kernel.pairing import ALPHABET, CODE_LENGTH, PairingFull, PairingStore
from gateway.kernel.store import Store


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


async def test_code_shape_and_the_same_code_while_valid(store: Store, clock: Clock) -> None:
    pairing = PairingStore(store, clock=clock)
    first = await pairing.request("telegram", "42", user_name="Ada", chat_id="42")
    assert first.new and len(first.code) == CODE_LENGTH
    assert set(first.code) <= set(ALPHABET) and not set("01OIL") & set(first.code)
    again = await pairing.request("telegram", "42")
    assert again.code == first.code and not again.new
    assert first.expires_at - first.created_at == 3600


async def test_at_most_three_pending_per_channel(store: Store, clock: Clock) -> None:
    pairing = PairingStore(store, clock=clock)
    for user in ("1", "2", "3"):
        await pairing.request("telegram", user)
    with pytest.raises(PairingFull):
        await pairing.request("telegram", "4")
    await pairing.request("discord", "4")  # other channels have their own three
    clock.now += 3601  # expired codes free their places
    assert (await pairing.request("telegram", "4")).new
    assert [p.user_id for p in await pairing.pending("telegram")] == ["4"]


async def test_approve_from_another_connection(store: Store, clock: Clock,
                                               tmp_path: Path) -> None:
    pairing = PairingStore(store, clock=clock)
    code = await pairing.request("telegram", "42", user_name="Ada")
    assert not await pairing.is_approved("telegram", "42")
    other = await Store.open(tmp_path / "parley.db")  # what the CLI does, in its own process
    try:
        approval = await PairingStore(other, clock=clock).approve(
            "telegram", code.code.lower()[:4] + "-" + code.code[4:])
    finally:
        await other.close()
    assert approval is not None and approval.user_id == "42" and approval.user_name == "Ada"
    assert await pairing.is_approved("telegram", "42")
    assert not await pairing.is_approved("discord", "42")
    assert await pairing.pending() == []
    assert await pairing.approve("telegram", code.code) is None  # a code works once


async def test_expired_or_unknown_codes_approve_nobody(store: Store, clock: Clock) -> None:
    pairing = PairingStore(store, clock=clock)
    code = await pairing.request("telegram", "42")
    assert await pairing.approve("discord", code.code) is None
    clock.now += 3600
    assert await pairing.approve("telegram", code.code) is None
    assert not await pairing.is_approved("telegram", "42")


def _config(tmp_path: Path) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"workspace": "ws", "data_dir": "data"}))
    return path


def test_cli_list_and_approve(tmp_path: Path) -> None:
    config = _config(tmp_path)

    async def issue() -> str:
        store = await Store.open(tmp_path / "data" / "parley.db")
        try:
            return (await PairingStore(store).request("telegram", "42", user_name="Ada")).code
        finally:
            await store.close()

    code = asyncio.run(issue())
    runner = CliRunner()
    listed = runner.invoke(app, ["pairing", "list", "--config", str(config)])
    assert listed.exit_code == 0, listed.output
    assert code in listed.output and "Ada" in listed.output
    approved = runner.invoke(app, ["pairing", "approve", "telegram", code, "--config",
                                   str(config)])
    assert approved.exit_code == 0, approved.output
    assert "approved Ada (id 42) on telegram" in approved.output
    again = runner.invoke(app, ["pairing", "approve", "telegram", code, "--config", str(config)])
    assert again.exit_code == 1
    assert "no pending code" in again.output
    listed = runner.invoke(app, ["pairing", "list", "telegram", "-c", str(config)])
    assert "no pending codes" in listed.output and "42" in listed.output
    revoked = runner.invoke(app, ["pairing", "revoke", "telegram", "42", "-c", str(config)])
    assert revoked.exit_code == 0, revoked.output
    assert "revoked user 42 on telegram" in revoked.output
    listed = runner.invoke(app, ["pairing", "list", "telegram", "-c", str(config)])
    assert "no approved users" in listed.output
    again = runner.invoke(app, ["pairing", "revoke", "telegram", "42", "-c", str(config)])
    assert again.exit_code == 1 and "is not approved on telegram" in again.output


def test_cli_without_a_database_says_so(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["pairing", "approve", "telegram", "ABCD2345", "--config",
                                      str(_config(tmp_path))])
    assert result.exit_code == 1
    assert "no database" in result.output
