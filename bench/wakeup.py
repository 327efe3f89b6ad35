"""What waking another process costs here: the floor under a lone chat's CPU a turn.

A plain turn at one chat hands off between three processes twice (the gateway writes to the
model server and sleeps until it answers; it writes the reply to the client and sleeps until
the next request) and writes once more (the POST's 202). Each write wakes a process that
sleeps on another CPU (``--pin`` puts the gateway on one, the model server and the client on
the others), and each sleep ends with this process woken in turn. On a virtual machine that
is a call into the hypervisor each way, charged to the gateway's system time; at 100 chats
nobody sleeps and the cost is gone, which is most of why one chat's turn costs more CPU than
a turn among 100.

Measured here without the gateway: this process (on the gateway's CPU) and a child (on the
helpers' CPUs, or on the same one) pass a 2 KB request and a 300-byte answer over loopback
TCP, the child taking ``PEER_WORK`` seconds before it answers (as the model server does). The
figure is this side's CPU (user + system) per round trip, after a warm-up. Run in a process
of its own (``run_apart``: ``python -m bench.wakeup N HERE THERE`` — round trips, this side's
CPU, the peer's or nothing for none — forks, which the benchmark's own process, with its
threads, must not), printing JSON.
"""

from __future__ import annotations

import json
import os
import resource
import socket
import subprocess
import sys
import time
from typing import Any

from bench.procs import PINNING, ROOT, _pythonpath

REQUEST = b"x" * 2000
ANSWER = b"y" * 300
PEER_WORK = 0.0003
"""Seconds the peer takes before it answers: long enough that this side goes to sleep."""
WARMUP = 200


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _peer(port: int, cpu: int) -> None:
    os.sched_setaffinity(0, {cpu})
    conn = socket.create_connection(("127.0.0.1", port))
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while True:
        got = conn.recv(1 << 16)
        if not got:
            break
        while len(got) % len(REQUEST):
            more = conn.recv(1 << 16)
            if not more:
                return
            got += more
        time.sleep(PEER_WORK)
        conn.sendall(ANSWER)


def round_trips(n: int, here: int, there: int) -> dict[str, float]:
    """This side's CPU (user + system) and wall time per round trip, in µs, on CPU ``here``
    with the peer on CPU ``there``."""
    os.sched_setaffinity(0, {here})
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    pid = os.fork()
    if pid == 0:  # the peer
        try:
            server.close()
            _peer(port, there)
        finally:
            os._exit(0)
    conn, _ = server.accept()
    server.close()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    cpu0 = wall0 = 0.0
    try:
        for i in range(WARMUP + n):
            if i == WARMUP:
                cpu0, wall0 = _cpu(), time.perf_counter()
            conn.sendall(REQUEST)
            got = 0
            while got < len(ANSWER):
                piece = conn.recv(1 << 16)
                if not piece:
                    raise ConnectionError("the peer went away")
                got += len(piece)
        cpu, wall = _cpu() - cpu0, time.perf_counter() - wall0
    finally:
        conn.close()
        os.waitpid(pid, 0)
    return {"cpu_us": round(cpu / n * 1e6, 1), "wall_us": round(wall / n * 1e6, 1)}


def measure(n: int, here: int, there: int | None) -> dict[str, Any]:
    """Round trips with the peer on another CPU (``there``: as the benchmark pins the
    gateway and its helpers; None on a machine with one CPU) and on the same one."""
    return {"round_trips": n, "peer_work_ms": PEER_WORK * 1000,
            "other_cpu": round_trips(n, here, there) if there is not None else None,
            "same_cpu": round_trips(n, here, here)}


def run_apart(n: int) -> dict[str, Any] | None:
    """``measure`` in a process of its own, on the gateway's CPU with the peer on a helper's
    (``PINNING``; unpinned: the last CPU and the first); None when it failed."""
    gateway = sorted(PINNING.get("gateway") or os.sched_getaffinity(0) or {0})
    helpers = sorted(PINNING.get("helpers") or range(os.cpu_count() or 1))
    here = gateway[-1]
    there = next((c for c in helpers if c != here), None)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "bench.wakeup", str(n), str(here),
             "" if there is None else str(there)],
            capture_output=True, text=True, cwd=ROOT, timeout=300,
            env={**os.environ, "PYTHONPATH": _pythonpath()}, check=True)
        return json.loads(done.stdout)  # type: ignore[no-any-return]
    except (subprocess.SubprocessError, OSError, ValueError) as exc:
        print(f"bench.wakeup failed: {exc}", file=sys.stderr)
        return None


if __name__ == "__main__":
    count, cpu, other = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    print(json.dumps(measure(count, cpu, int(other) if other else None)))
