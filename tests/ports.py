"""Ports for test brokers that restart on the same port.

A broker that a test stops and starts again keeps its port (its clients and peers know
it by that address). A port the kernel chose (bind to port 0) comes from the ephemeral
range, the same one every outgoing connection on the machine takes its local port from:
while the broker is down, any client of any test (three xdist workers, their brokers,
JVMs and Spark) may get that port, and the restart fails with "Address already in use"
(ci17: test_sigterm_right_after_listening_exits_0). Ports below the ephemeral range are
never handed out that way; each xdist worker takes its own block of them, and a port is
used only if nothing holds it now.
"""

from __future__ import annotations

import itertools
import os
import random
import socket
from pathlib import Path

#: The lowest port used, and each worker's block of them.
FIRST = 20_000
BLOCK = 1_500


def _ephemeral_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768  # Linux's default


def _worker_index() -> int:
    name = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    return int(name[2:]) if name[2:].isdigit() else 0


def _block() -> range:
    top = _ephemeral_start()
    blocks = max(1, (top - FIRST) // BLOCK)
    start = FIRST + (_worker_index() % blocks) * BLOCK
    return range(start, min(start + BLOCK, top))


_BLOCK = _block()
#: Candidates in a shuffled cycle: two test runs side by side (a developer's and CI's)
#: rarely try the same port at once; a port in use is skipped anyway.
_CANDIDATES = itertools.cycle(random.sample(_BLOCK, len(_BLOCK)) if _BLOCK else [0])


def restartable_port(host: str = "127.0.0.1") -> int:
    """A free port outside the ephemeral range (0 if this machine has none there)."""
    for _ in range(len(_BLOCK)):
        port = next(_CANDIDATES)
        if port == 0:
            return 0
        with socket.socket() as probe:
            try:
                probe.bind((host, port))
            except OSError:
                continue  # held by a listener, a connection, or one in TIME_WAIT
            return port
    return 0


def free_port(host: str = "127.0.0.1") -> int:
    """A free port to give a listener a test starts later (a broker, a JVM daemon).

    :func:`restartable_port` when this machine has ports below its ephemeral range: the
    process binds it moments or minutes later (or again after a restart), and a kernel-
    chosen port may meanwhile go to any outgoing connection. Otherwise one the kernel
    picks, never 0 (the caller must know the port before the process starts)."""
    port = restartable_port(host)
    if port:
        return port
    with socket.socket() as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])
