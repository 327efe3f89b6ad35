"""Concurrent chats (item 3) and many sessions (the workload of item 5).

``others_cpu_cores`` is the machine's busy CPU during the run that none of our three processes
used (other work on a shared machine): a figure taken while it is well above zero is noisy.

Every chat sends its next message only after the answer to the last one came, as a person
does; throughput is answered turns per second of wall time. Every answer is checked (the
scripted model echoes the text), and a turn that is not answered correctly is counted as
failed, never as done.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bench.client import LocalClient, TurnFailed, expect
from bench.procs import (
    GatewayProcess,
    ModelServer,
    SkeletonProcess,
    cpu_seconds,
    machine_cpu_seconds,
    own_cpu_seconds,
)
from bench.stats import summary_ms


@dataclass
class _Tally:
    done: int = 0
    failed: int = 0
    errors: list[str] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)

    async def turn(self, client: LocalClient, chat_id: str, text: str) -> None:
        try:
            seconds, record = await client.turn(chat_id, text)
            expect(record, text)
        except (TurnFailed, OSError, TimeoutError) as exc:
            self.failed += 1
            if len(self.errors) < 5:
                self.errors.append(f"{chat_id}: {type(exc).__name__}: {exc}")
            return
        self.done += 1
        self.latencies.append(seconds)


def _result(tally: _Tally, wall: float, cpu: dict[str, float], **extra: Any) -> dict[str, Any]:
    turns = max(tally.done, 1)
    machine = cpu.pop("machine_busy")
    ours = sum(cpu.values())
    return {**extra, "turns_done": tally.done, "turns_failed": tally.failed,
            "others_cpu_cores": round(max(machine - ours, 0.0) / wall, 2),
            "loadavg_1m": round(os.getloadavg()[0], 2),
            "errors": tally.errors, "wall_s": round(wall, 3),
            "turns_per_s": round(tally.done / wall, 1) if wall else None,
            "latency": summary_ms(tally.latencies),
            "cpu_ms_per_turn": {k: round(v / turns * 1000, 2) for k, v in cpu.items()},
            "cpu_share_of_wall": {k: round(v / wall, 2) for k, v in cpu.items()}}


class _Cpu:
    def __init__(self, gateway: GatewayProcess | SkeletonProcess, server: ModelServer) -> None:
        self.gateway, self.server = gateway, server
        self.start = self._read()

    def _read(self) -> dict[str, float]:
        return {"gateway": self.gateway.cpu(), "model_server": cpu_seconds(self.server.pid),
                "client": own_cpu_seconds(), "machine_busy": machine_cpu_seconds()[0]}

    def delta(self) -> dict[str, float]:
        now = self._read()
        return {k: now[k] - self.start[k] for k in now}


async def concurrent_chats(client: LocalClient, gateway: GatewayProcess | SkeletonProcess,
                           server: ModelServer, *, chats: int, seconds: float,
                           tag: str) -> dict[str, Any]:
    """``chats`` chats, each turn after turn until ``seconds`` have passed (``gateway``: or
    ``bench.skeleton``, the same I/O without the gateway)."""
    tally = _Tally()
    deadline = time.perf_counter() + seconds

    async def chat(j: int) -> None:
        i = 0
        while time.perf_counter() < deadline:
            await tally.turn(client, f"{tag}-{j}", f"load {i} from chat {j}")
            i += 1

    cpu = _Cpu(gateway, server)
    started = time.perf_counter()
    await asyncio.gather(*(chat(j) for j in range(chats)))
    wall = time.perf_counter() - started
    return _result(tally, wall, cpu.delta(), chats=chats)


async def many_sessions(client: LocalClient, gateway: GatewayProcess, server: ModelServer, *,
                        sessions: int, turns: int, concurrency: int, tag: str,
                        on_progress: Callable[[int], None] | None = None) -> dict[str, Any]:
    """``sessions`` chats of ``turns`` turns each, ``concurrency`` chats at a time."""
    tally = _Tally()
    queue: asyncio.Queue[int] = asyncio.Queue()
    for s in range(sessions):
        queue.put_nowait(s)
    finished = 0

    async def worker() -> None:
        nonlocal finished
        while not queue.empty():
            s = queue.get_nowait()
            for i in range(turns):
                await tally.turn(client, f"{tag}-{s}", f"session {s} turn {i}")
            finished += 1
            if on_progress is not None:
                on_progress(finished)

    cpu = _Cpu(gateway, server)
    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - started
    return _result(tally, wall, cpu.delta(), sessions=sessions, turns_per_session=turns,
                   concurrency=concurrency)
