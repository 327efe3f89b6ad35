"""``python -m bench.harness [--tracemalloc PREFIX] -- gateway --config F``: the ``parley``
command with benchmark instruments, for ``--profile``.

``--tracemalloc PREFIX``: the first SIGUSR1 starts tracing (and writes ``PREFIX-started``):
started once the gateway is warm, tracing skips the import of litellm, which under
tracemalloc takes minutes. Each later SIGUSR1 writes a snapshot to ``PREFIX-<n>.snap``: what
was allocated since tracing started and is still alive. Files are written under a temporary
name and renamed, so a reader never sees half a file."""

from __future__ import annotations

import os
import signal
import sys
import tracemalloc
from pathlib import Path
from types import FrameType

FRAMES = 4


def _tracemalloc_on_signal(prefix: str) -> None:
    taken = 0

    def on_signal(signum: int, frame: FrameType | None) -> None:
        nonlocal taken
        if not tracemalloc.is_tracing():
            tracemalloc.start(FRAMES)
            Path(f"{prefix}-started").touch()
            return
        taken += 1
        target = f"{prefix}-{taken}.snap"
        tracemalloc.take_snapshot().dump(target + ".part")
        os.replace(target + ".part", target)

    signal.signal(signal.SIGUSR1, on_signal)


def main() -> None:
    argv = sys.argv[1:]
    if "--" not in argv:
        raise SystemExit("usage: python -m bench.harness [--tracemalloc PREFIX] "
                         "-- PARLEY-ARGS...")
    split = argv.index("--")
    options, args = argv[:split], argv[split + 1:]
    while options:
        option, value, *options = options
        if option == "--tracemalloc":
            _tracemalloc_on_signal(value)
        else:
            raise SystemExit(f"unknown option {option}")
    sys.argv = ["parley", *args]
    from gateway.cli import main as cli

    cli()


if __name__ == "__main__":
    main()
