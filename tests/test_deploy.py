"""The systemd unit and the Dockerfile name real paths, commands and options: parsed here, and
their commands checked against the ``parley`` that is installed (no docker, no systemd)."""

from __future__ import annotations

import configparser
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import yaml

from gateway.cli_onboard import Choices, render

ROOT = Path(__file__).resolve().parent.parent
PARLEY = str(Path(sys.executable).parent / "parley")


def _help(argv: list[str]) -> str:
    """``parley <subcommand> --help``: fails if the subcommand does not exist."""
    assert argv[0] == "parley", argv
    args = [a for a in argv[1:] if not a.startswith("-")]
    done = subprocess.run([PARLEY, *args, "--help"], capture_output=True, text=True,
                          env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, (argv, done.stderr)
    for option in (a.split("=")[0] for a in argv[1:] if a.startswith("--")):
        assert option in done.stdout, (option, argv)
    return done.stdout


ONBOARDED = render(Choices(), "~/.parley/workspace", "~/.parley/data")
"""The config ``parley onboard --non-interactive`` writes (the container's first start)."""


def test_systemd_unit() -> None:
    unit = configparser.ConfigParser(interpolation=None, strict=True)
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read_string((ROOT / "deploy" / "parley.service").read_text())
    assert set(unit.sections()) == {"Unit", "Service", "Install"}
    service = unit["Service"]
    start = shlex.split(service["ExecStart"])
    assert start[0].endswith("/parley") and start[1:] == ["gateway"]
    _help(["parley", *start[1:]])
    assert service["KillSignal"] == "SIGTERM"  # what the gateway drains on
    assert service["Restart"] == "on-failure"
    # Exit status 2 is a config or path problem, which restarting cannot fix.
    assert service["RestartPreventExitStatus"] == "2"
    bad = subprocess.run([PARLEY, "gateway", "--config", "/nonexistent/config.yaml"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert unit["Install"]["WantedBy"] == "default.target"  # a user unit


def _instructions(text: str) -> list[tuple[str, str]]:
    joined = re.sub(r"\\\n", " ", text)
    out = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_dockerfile() -> None:
    steps = _instructions((ROOT / "Dockerfile").read_text())
    copied = set()
    for word, rest in steps:
        if word == "COPY":
            *sources, _ = rest.split()
            for source in sources:
                assert (ROOT / source).exists(), source
                copied.add(source.rstrip("/"))
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = {p.rstrip("*") for p in project["tool"]["setuptools"]["packages"]["find"]
                ["include"]} - {"tests"}
    assert packages <= copied, packages - copied
    assert {"pyproject.toml", "constraints.txt", "README.md"} <= copied  # README: the metadata
    [(_, cmd)] = [s for s in steps if s[0] == "CMD"]
    argv = yaml.safe_load(cmd)  # the JSON form
    assert argv[:2] == ["sh", "-c"]
    for command in argv[2].replace("exec ", "").split("&&"):
        _help(shlex.split(command))
    env = " ".join(rest for word, rest in steps if word == "ENV")
    assert "PARLEY_HOST=0.0.0.0" in env and "${PARLEY_HOST:-127.0.0.1}" in ONBOARDED
    exposed = {int(p) for word, rest in steps if word == "EXPOSE" for p in rest.split()}
    assert exposed == {int(p) for p in re.findall(r"PORT:-(\d+)\}", ONBOARDED)}
    user = [rest for word, rest in steps if word == "USER"]
    assert user == ["parley"]  # not root
    [volume] = [rest for word, rest in steps if word == "VOLUME"]
    assert volume == "/home/parley/.parley"  # where onboard writes for that user


def test_readme_documents_both() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Running as a service", 1)[1].split("\n## ", 1)[0]
    assert "deploy/parley.service" in section and "Dockerfile" in section
