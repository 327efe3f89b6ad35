"""``make bench`` item 8 still runs: the exec cost probe goes through the real tool (as the
owner, in the sandbox and on the host) and gets the command's answer back."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from bench import exec_cost


async def test_the_exec_probe_runs(tmp_path: Path) -> None:
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap (bwrap) is not installed; `make test` installs it")
    figures = await exec_cost.measure(tmp_path, 2)
    assert figures["commands"] == 2 and "sandboxed" in figures and "host" in figures
