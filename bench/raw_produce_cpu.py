"""Broker CPU per pipelined acks=all Produce request, from a raw client (issue 33).

    .venv/bin/python bench/raw_produce_cpu.py --trees /tmp/before /tmp/after --rounds 5
    .venv/bin/python bench/raw_produce_cpu.py --requests 60 --size 1024 --batch-records 1000
    .venv/bin/python bench/raw_produce_cpu.py --count --rounds 1   # + scheduler counts

The same figure as ``produce_cpu.py`` (utime+stime of the broker process and of its
event-loop thread, from /proc, over a fixed number of requests, divided by them), with a
client that costs next to nothing and never gives up: one blocking socket sending the same
pre-encoded Produce v9 frame (one batch of ``--batch-records`` records of ``--size``
bytes, a correlation id patched in), ``--inflight`` requests unanswered at a time, the
next sent as each answer arrives. librdkafka's W6 on a machine at load 15-25, with the
benches at nice 19, timed its requests out (300 s message timeout) and counted half the
records; this client has no timeouts. The defaults are W6's shape (16 KiB, one record
per request, 5 in flight); ``--size 1024 --batch-records 1000`` is W2's (~1 MiB batches).

Each round starts one ``trio-broker serve`` per tree (file storage, pipelined,
``acks.all.fsync`` from ``--fsync``; ``PYTHONPATH`` = the tree), warms it up with 200
requests, then measures ``--requests``. ``--count`` runs the broker under this script
(``--serve-counted``), which adds a trio Instrument to its run: scheduler passes and
task steps per request (by task name) over the measured requests, counted, not timed
(the loop watchdog's steps follow the wall clock, so they grow on a loaded machine).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

TICK = os.sysconf("SC_CLK_TCK")
LISTENING = re.compile(r"listening on [^\s:]+:(\d+)")
TOPIC = "raw"


def _cpu_seconds(path: str) -> float:
    with open(path) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def _frames(size: int, records: int) -> tuple[bytes, bytearray]:
    """A CreateTopics frame and the Produce frame sent again and again."""
    from trio_broker.protocol import messages as m
    from trio_broker.protocol.records import build_batch

    req = m.ProduceRequest
    batch = bytes(build_batch([(None, b"x" * size)] * records))
    part = req.TopicProduceData.PartitionProduceData(index=0, records=batch)
    produce = m.encode_request(0, 9, 0, "raw-produce-cpu", req(
        acks=-1, timeout_ms=30_000, topic_data=[req.TopicProduceData(name=TOPIC, partition_data=[part])]
    ))  # fmt: skip
    ct = m.CreateTopicsRequest
    create = m.encode_request(19, 4, 1, "raw-produce-cpu", ct(
        topics=[ct.CreatableTopic(name=TOPIC, num_partitions=1, replication_factor=1,
                                  assignments=[], configs=[])],
        timeout_ms=10_000, validate_only=False,
    ))  # fmt: skip
    return create, bytearray(produce)


def _read_exactly(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise RuntimeError("the broker closed the connection")
        buf += chunk
    return bytes(buf)


def _read_response(sock: socket.socket) -> bytes:
    (size,) = struct.unpack(">i", _read_exactly(sock, 4))
    return _read_exactly(sock, size)


def _pipelined(sock: socket.socket, frame: bytearray, n: int, inflight: int) -> None:
    sent = answered = 0
    while answered < n:
        while sent < n and sent - answered < inflight:
            struct.pack_into(">i", frame, 8, sent)  # the correlation id
            sock.sendall(frame)
            sent += 1
        _read_response(sock)
        answered += 1


def run_one(
    tree: Path, args: argparse.Namespace, frames: tuple[bytes, bytearray]
) -> dict[str, Any]:
    data_dir = Path(tempfile.mkdtemp(prefix="raw-produce-cpu-"))
    config = data_dir.with_suffix(".properties")
    config.write_text(f"acks.all.fsync={args.fsync}\n")
    counts = data_dir.with_suffix(".counts.json")
    exe = Path(sys.executable).with_name("trio-broker")
    serve = [str(exe), "serve", "--listen", "127.0.0.1:0", "--data-dir", str(data_dir),
             "--storage", "file", "--processing-model", "pipelined", "--config", str(config)]  # fmt: skip
    if args.count:
        serve = [sys.executable, __file__, "--serve-counted", str(counts), *serve[1:]]
    env = dict(os.environ, PYTHONPATH=str(tree))
    proc = subprocess.Popen(serve, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stderr is not None
        port = None
        for line in proc.stderr:
            match = LISTENING.search(line)
            if match:
                port = int(match.group(1))
                break
        if port is None:
            raise RuntimeError("the broker did not start")
        threading.Thread(target=proc.stderr.read, daemon=True).start()
        create, frame = frames
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.sendall(create)
            _read_response(sock)
            _pipelined(sock, frame, min(200, args.requests), args.inflight)  # warm-up
            pid = proc.pid
            if args.count:
                os.kill(pid, signal.SIGUSR2)
            loop0, process0 = (
                _cpu_seconds(f"/proc/{pid}/task/{pid}/stat"),
                _cpu_seconds(f"/proc/{pid}/stat"),
            )
            started = time.perf_counter()
            _pipelined(sock, frame, args.requests, args.inflight)
            wall = time.perf_counter() - started
            loop1, process1 = (
                _cpu_seconds(f"/proc/{pid}/task/{pid}/stat"),
                _cpu_seconds(f"/proc/{pid}/stat"),
            )
            if args.count:
                os.kill(pid, signal.SIGUSR2)
    finally:
        proc.terminate()
        try:
            proc.wait(600)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(data_dir, ignore_errors=True)
        config.unlink(missing_ok=True)
    n = args.requests
    result = {"process_us": (process1 - process0) / n * 1e6,
              "loop_us": (loop1 - loop0) / n * 1e6, "wall_s": wall}  # fmt: skip
    if args.count and counts.exists():
        counted = json.loads(counts.read_text())
        counts.unlink()
        result["per_request"] = {
            k: round(v / n, 2) for k, v in counted.items() if k != "steps_by_task"
        }
        result["steps_by_task"] = {k: round(v / n, 2) for k, v in counted["steps_by_task"].items()}
    return result


def serve_counted(out: str, argv: list[str]) -> None:
    """Run ``trio-broker serve`` here, with an Instrument that SIGUSR2 turns on, then off."""
    import trio

    class Counter(trio.abc.Instrument):
        def __init__(self) -> None:
            self.on = False
            self.counts = {"scheduler_passes": 0, "task_steps": 0, "tasks_spawned": 0}
            self.by_task: dict[str, int] = {}

        def after_io_wait(self, timeout: float) -> None:
            if self.on:
                self.counts["scheduler_passes"] += 1

        def before_task_step(self, task: trio.lowlevel.Task) -> None:
            if self.on:
                self.counts["task_steps"] += 1
                name = task.name.rsplit(".", 1)[-1]
                self.by_task[name] = self.by_task.get(name, 0) + 1

        def task_spawned(self, task: trio.lowlevel.Task) -> None:
            if self.on:
                self.counts["tasks_spawned"] += 1

    counter = Counter()
    signal.signal(signal.SIGUSR2, lambda *_: setattr(counter, "on", not counter.on))
    real_run = trio.run

    def run(*a: Any, **kw: Any) -> Any:
        kw["instruments"] = [*kw.get("instruments", ()), counter]
        return real_run(*a, **kw)

    trio.run = run  # type: ignore[assignment]
    from trio_broker.cli import main

    try:
        main(argv)
    finally:
        Path(out).write_text(json.dumps({**counter.counts, "steps_by_task": counter.by_task}))


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--serve-counted":
        serve_counted(sys.argv[2], sys.argv[3:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trees", nargs="+", type=Path, default=[Path(".")])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--size", type=int, default=16 * 1024, help="bytes per record")
    parser.add_argument("--batch-records", type=int, default=1, help="records per request")
    parser.add_argument("--inflight", type=int, default=5)
    parser.add_argument("--fsync", default="true", choices=["true", "false"])
    parser.add_argument("--count", action="store_true", help="also count scheduler work")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    trees = [tree.resolve() for tree in args.trees]
    sys.path.insert(0, str(trees[0]))
    frames = _frames(args.size, args.batch_records)
    runs: dict[str, list[dict[str, Any]]] = {str(t): [] for t in trees}
    for round_ in range(args.rounds):
        for tree in trees:
            r = run_one(tree, args, frames)
            runs[str(tree)].append(r)
            print(f"round {round_} {tree}: process {r['process_us']:.1f} µs/request, loop thread "
                  f"{r['loop_us']:.1f}, wall {r['wall_s']:.1f} s, load {os.getloadavg()[0]:.1f}"
                  + (f"\n  per request {r['per_request']}, steps {r['steps_by_task']}"
                     if "per_request" in r else ""), flush=True)  # fmt: skip
    first = None
    for tree, results in runs.items():
        process = statistics.median(r["process_us"] for r in results)
        loop = statistics.median(r["loop_us"] for r in results)
        ratio = "" if first is None else f" (x{process / first[0]:.2f}, x{loop / first[1]:.2f})"
        first = first or (process, loop)
        print(f"{tree}: medians of {len(results)}: process {process:.1f} µs/request, "
              f"loop thread {loop:.1f}{ratio}")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps({"loadavg": os.getloadavg(), "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
