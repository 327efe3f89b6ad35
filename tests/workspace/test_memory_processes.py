"""Two processes on one workspace (the gateway and ``parley chat``) writing memory at once:
every note lands."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WRITER = """
import sys
from datetime import UTC, datetime
from pathlib import Path
from workspace.memory import MemoryStore

store = MemoryStore(Path(sys.argv[1]))
when = datetime(2026, 3, 2, 9, 30, tzinfo=UTC)
for i in range(int(sys.argv[3])):
    store.remember(f"note {sys.argv[2]}-{i}", kind="log", when=when)
"""


def test_two_processes_appending_lose_nothing(tmp_path: Path) -> None:
    n = 150
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path), name, str(n)],
                              cwd=ROOT) for name in ("gateway", "chat")]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    text = (tmp_path / "memory" / "2026-03-02.md").read_text()
    for name in ("gateway", "chat"):
        missing = [i for i in range(n) if f"note {name}-{i}\n" not in text]
        assert missing == []
