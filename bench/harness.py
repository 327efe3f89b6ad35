"""``python -m bench.harness [--tracemalloc PREFIX] [--prototype NAME] -- gateway --config F``:
the ``parley`` command with benchmark instruments, for ``--profile`` and ``--prototype``.

``--tracemalloc PREFIX``: the first SIGUSR1 starts tracing (and writes ``PREFIX-started``):
started once the gateway is warm, tracing skips the import of litellm, which under
tracemalloc takes minutes. Each later SIGUSR1 writes a snapshot to ``PREFIX-<n>.snap``: what
was allocated since tracing started and is still alive. Files are written under a temporary
name and renamed, so a reader never sees half a file.

``--prototype NAME``: a fix for a hot path tried without touching the code under test, to put
an "after" figure beside the "before" one (see ``PROTOTYPES``). Never part of the gateway.
"""

from __future__ import annotations

import os
import signal
import sys
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

FRAMES = 4


def _hosted_vllm() -> None:
    """Send ``openai/<name>`` calls to an ``api_base`` through litellm's ``hosted_vllm``
    provider, which builds the request itself instead of through the OpenAI SDK, whose
    ``async_maybe_transform`` walks every message of every request in Python."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    original = litellm.acompletion

    async def acompletion(*args: Any, **kwargs: Any) -> Any:
        model = kwargs.get("model", "")
        if kwargs.get("api_base") and isinstance(model, str) and model.startswith("openai/"):
            kwargs["model"] = "hosted_vllm/" + model.removeprefix("openai/")
        return await original(*args, **kwargs)

    litellm.acompletion = acompletion


PROTOTYPES: dict[str, Callable[[], None]] = {"hosted-vllm": _hosted_vllm}


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
                         "[--prototype NAME] -- PARLEY-ARGS...")
    split = argv.index("--")
    options, args = argv[:split], argv[split + 1:]
    while options:
        option, value, *options = options
        if option == "--tracemalloc":
            _tracemalloc_on_signal(value)
        elif option == "--prototype":
            PROTOTYPES[value]()
        else:
            raise SystemExit(f"unknown option {option}")
    sys.argv = ["parley", *args]
    from gateway.cli import main as cli

    cli()


if __name__ == "__main__":
    main()
