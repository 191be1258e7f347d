"""Physical limits on this machine, for putting benchmark figures in proportion.

* loopback TCP: a sender and a receiver process, 1 MiB sends, ~3 s;
* write + fdatasync of 1 MiB blocks on the data dir's disk (MB/s);
* 64 KiB append + fsync rate on the same disk (ops/s).

    .venv/bin/python bench/limits.py [--dir bench] [--seconds 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import socket
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MIB = 1024 * 1024


def _receiver(port_queue: Any, result_queue: Any) -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port_queue.put(server.getsockname()[1])
    conn, _ = server.accept()
    buf = bytearray(MIB)
    view = memoryview(buf)
    total = 0
    while True:
        n = conn.recv_into(view)
        if n == 0:
            break
        total += n
    result_queue.put(total)
    conn.close()
    server.close()


def loopback_mb_per_s(seconds: float) -> float:
    ctx = multiprocessing.get_context("spawn")
    port_q, result_q = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=_receiver, args=(port_q, result_q))
    proc.start()
    try:
        port = port_q.get(timeout=30)
        sock = socket.create_connection(("127.0.0.1", port))
        payload = os.urandom(MIB)
        sent = 0
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            sock.sendall(payload)
            sent += MIB
        sock.shutdown(socket.SHUT_WR)
        received = result_q.get(timeout=60)
        elapsed = time.perf_counter() - start
        sock.close()
        return received / elapsed / 1e6
    finally:
        proc.join(30)
        if proc.is_alive():
            proc.kill()


def fdatasync_mb_per_s(directory: Path, seconds: float) -> float:
    payload = os.urandom(MIB)
    fd, path = tempfile.mkstemp(prefix="limits-", dir=directory)
    try:
        written = 0
        start = time.perf_counter()
        while time.perf_counter() - start < seconds and written < 4096 * MIB:
            os.write(fd, payload)
            os.fdatasync(fd)
            written += MIB
        return written / (time.perf_counter() - start) / 1e6
    finally:
        os.close(fd)
        os.unlink(path)


def append_fsync_per_s(directory: Path, seconds: float, size: int = 64 * 1024) -> float:
    payload = os.urandom(size)
    fd, path = tempfile.mkstemp(prefix="limits-", dir=directory)
    try:
        ops = 0
        start = time.perf_counter()
        while time.perf_counter() - start < seconds and ops < 1_000_000:
            os.write(fd, payload)
            os.fsync(fd)
            ops += 1
        return ops / (time.perf_counter() - start)
    finally:
        os.close(fd)
        os.unlink(path)


def measure(directory: Path = ROOT / "bench", seconds: float = 3.0) -> dict[str, Any]:
    return {
        "data_dir": str(directory),
        "loopback_tcp_mb_per_s": loopback_mb_per_s(seconds),
        "fdatasync_1mib_mb_per_s": fdatasync_mb_per_s(directory, seconds),
        "append_fsync_64kib_per_s": append_fsync_per_s(directory, seconds),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=ROOT / "bench", help="disk to measure")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    result = measure(args.dir, args.seconds)
    print(f"loopback TCP (1 MiB sends)      {result['loopback_tcp_mb_per_s']:>10.0f} MB/s")
    print(f"1 MiB write + fdatasync         {result['fdatasync_1mib_mb_per_s']:>10.0f} MB/s")
    print(f"64 KiB append + fsync           {result['append_fsync_64kib_per_s']:>10.0f} /s")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
