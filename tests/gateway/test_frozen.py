"""The suite runs the checked build of ``@frozen`` classes (``tests/conftest.py``): an
assignment to a built value raises; without the check they compare and hash alike."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.kernel.events import InboundMessage
from gateway.kernel.frozen import CHECKED


def test_the_suite_runs_with_assignments_refused() -> None:
    assert CHECKED
    msg = InboundMessage(channel="local", chat_id="c", sender_id="u", text="hi")
    with pytest.raises(dataclasses.FrozenInstanceError):
        msg.text = "changed"  # type: ignore[misc]


def test_the_unchecked_build_compares_hashes_and_replaces_alike() -> None:
    script = (
        "from dataclasses import replace\n"
        "from gateway.kernel.events import InboundMessage, Media\n"
        "from gateway.kernel.frozen import CHECKED\n"
        "a = InboundMessage(channel='l', chat_id='c', sender_id='u', text='x')\n"
        "b, c = replace(a, text='x'), replace(a, text='y')\n"
        "m = Media(kind='image', path='/a.png')\n"
        "print(CHECKED, a == b, a != c, hash(m) == hash(replace(m)),"
        " len({m, Media(kind='image', path='/a.png'), Media(kind='file', path='/a.png')}))\n"
        "a.text = 'changed'\n")  # not refused in this build: what the type checker catches
    env = {**os.environ, "PARLEY_CHECKED_FROZEN": "0"}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                         text=True, check=True).stdout.split()
    assert out == ["False", "True", "True", "True", "2"]


def test_no_value_class_of_ours_is_a_plain_frozen_dataclass() -> None:
    """A plain frozen dataclass beside ``@frozen`` ones breaks only the unchecked build
    (a frozen class and a non-frozen one cannot inherit from each other): none may exist."""
    root = Path(__file__).resolve().parents[2]
    found = [f"{path.relative_to(root)}:{n}"
             for package in ("agent", "channels", "gateway", "parley", "workspace")
             for path in sorted((root / package).rglob("*.py"))
             for n, line in enumerate(path.read_text().splitlines(), 1)
             if re.match(r"\s*@(dataclasses\.)?dataclass\(.*frozen=True", line)]
    assert not found, f"use @frozen (gateway/kernel/frozen.py): {found}"
