"""Profile the broker under W1 or W2 with py-spy: a flame graph SVG and a top-functions table.

    .venv/bin/python bench/profile_broker.py w1 [--records 2048] [--out docs/perf]
    .venv/bin/python bench/profile_broker.py w2 [--records 100000]
    .venv/bin/python bench/profile_broker.py w6 [--records 4096]  # one 16 KiB record per request
    .venv/bin/python bench/profile_broker.py w3  # W3 alone: W1's log read back by one consumer
    .venv/bin/python bench/profile_broker.py w5 [--consumers 20]  # W5 at full sizes

py-spy launches ``trio-broker serve`` itself (attaching to a running process
fails in this sandbox: "Failed to find python version"), samples it at
--rate Hz while the confluent-kafka workload runs in this process, and writes
collapsed stacks when the broker exits. ``bench/flamegraph.py`` turns them
into ``<out>/<workload>.svg``; ``<out>/<workload>-top.txt`` lists the functions
with the most samples on top of the stack (self) and anywhere in it (inclusive).
Idle samples (the event loop waiting in epoll, worker threads parked) are
dropped, so shares are of the broker's CPU time. For w3 an unprofiled broker writes
W1's log first and the profiled one serves that data dir, so the profile holds the
reads only: ``workloads.w3`` as run_all runs it (1 GiB: the log read again after a seek
to 0 until then).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import flamegraph
import run_all
import workloads
from produce import BrokerProcess, create_topic, run_producer

ROOT = Path(__file__).resolve().parent.parent
KIB = 1024
VENV_BIN = ROOT / ".venv" / "bin"


def tool(name: str) -> str:
    """The repo's venv's, else the running interpreter's (a git worktree has no .venv)."""
    for path in (VENV_BIN / name, Path(sys.executable).with_name(name)):
        if path.exists():
            return str(path)
    return name


class ProfiledBroker(BrokerProcess):
    """``py-spy record -- trio-broker serve``: stopping it stops the broker, not py-spy."""

    def __init__(self, stacks: Path, rate: int, model: str, extra: list[str] | None = None) -> None:
        launcher = [tool("py-spy"), "record", "--format", "raw", "--rate", str(rate),
                    "--output", str(stacks), "--"]  # fmt: skip
        super().__init__(model, extra=extra, launcher=launcher)
        self.broker = self.broker_pid()  # py-spy's child, the real broker process

    def cpu_seconds(self) -> float:
        """The broker's CPU, not py-spy's."""
        with open(f"/proc/{self.broker}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def rss_mib(self) -> float:
        with open(f"/proc/{self.broker}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
        return 0.0

    def broker_pid(self) -> int:
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text()
        return int(children.split()[0])

    def stop(self) -> None:
        """SIGTERM the broker: it shuts down and py-spy, seeing it exit, writes the stacks.

        The broker's pid was taken while py-spy was surely alive (at start): if py-spy
        died meanwhile, the broker is still stopped instead of being left orphaned.
        """
        try:
            os.kill(self.broker, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and Path(f"/proc/{self.broker}").exists():
            time.sleep(0.1)
        if Path(f"/proc/{self.broker}").exists():
            os.kill(self.broker, signal.SIGKILL)
        shutil.rmtree(self.data_dir, ignore_errors=True)


def consume_all(bootstrap: str, topic: str, want: int, time_limit: float = 120.0) -> dict[str, Any]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({
        "bootstrap.servers": bootstrap, "group.id": "profile", "enable.auto.commit": False,
        "fetch.max.bytes": 64 * 1024 * 1024, "max.partition.fetch.bytes": 16 * 1024 * 1024,
        "receive.message.max.bytes": 80 * 1024 * 1024,
    })  # fmt: skip
    consumer.assign([TopicPartition(topic, 0, 0)])
    got = nbytes = 0
    start = time.perf_counter()
    try:
        while got < want and time.perf_counter() - start < time_limit:
            msg = consumer.poll(1.0)
            if msg is None or msg.error():
                continue
            got += 1
            nbytes += len(msg.value() or b"")
    finally:
        consumer.close()
    elapsed = time.perf_counter() - start
    return {"records": got, "seconds": elapsed, "mb_per_s": nbytes / elapsed / 1e6}


#: Frames of the broker's start-up and shut-down inside trio.run (building the broker,
#: importing handlers and capture, opening and closing logs: all in ``serve`` itself, while
#: connections and handlers run in tasks of their own): not the workload's cost.
STARTING = ("Broker.__init__ ", "load_handlers ", "serve ")
#: A trio worker thread blocked on its job lock shows this frame on top (the lock is C).
PARKED = ("WorkerThread._work ", "get_os_thread_name_func.")


def drop_idle(stacks: list[tuple[list[str], int]]) -> list[tuple[list[str], int]]:
    """Keep the broker at work: drop waiting threads and start-up (imports, argument parsing)."""
    idle = re.compile(r"^(poll|select|epoll|wait|_wait_for_tstate_lock|get_events|acquire) ")

    def at_work(frames: list[str]) -> bool:
        if not frames or idle.match(frames[-1]) or frames[-1].startswith(PARKED):
            return False
        # The main thread counts only inside trio's run loop (not imports at start), and
        # not while the broker is being built or closed there.
        main_thread = frames[0].startswith("<module> ")
        if any(f.startswith(STARTING) for f in frames):
            return False
        return not main_thread or any(f.startswith("unrolled_run ") for f in frames)

    return [(f, n) for f, n in stacks if at_work(f)]


def top_table(stacks: list[tuple[list[str], int]], limit: int = 25) -> str:
    total = sum(n for _, n in stacks) or 1
    own, inclusive = flamegraph.self_and_inclusive(stacks)
    lines = [f"{total} non-idle samples", "", "self %  function (file)"]
    lines += [f"{100 * n / total:6.1f}  {name}" for name, n in own.most_common(limit)]
    lines += ["", "incl %  function (file) [trio_broker only]"]
    ours = [(k, v) for k, v in inclusive.most_common() if "trio_broker/" in k][:limit]
    lines += [f"{100 * n / total:6.1f}  {name}" for name, n in ours]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("workload", choices=["w1", "w2", "w3", "w5", "w6"])
    parser.add_argument("--records", type=int, default=None)
    parser.add_argument("--rate", type=int, default=500, help="samples per second")
    parser.add_argument("--model", default="pipelined", choices=["pipelined", "serial"])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "perf")
    parser.add_argument("--consumers", type=int, default=0, help="w5: long-polling consumers")
    args = parser.parse_args(argv)
    if shutil.which(tool("py-spy")) is None:
        print("py-spy is not installed: .venv/bin/pip install py-spy", file=sys.stderr)
        return 2

    args.out.mkdir(parents=True, exist_ok=True)
    stacks_path = args.out / f"{args.workload}.stacks.txt"
    if args.workload == "w3":
        records = args.records or 4096
        result = profile_w3(stacks_path, args.rate, args.model, records)
    elif args.workload == "w5":
        result = workloads.w5(
            *run_all.FULL["w5"],
            start=lambda: ProfiledBroker(
                stacks_path, args.rate, args.model, extra=["--metrics-listen", "127.0.0.1:0"]
            ),
            consumers=args.consumers,
        )
        records = result["sent"]
    else:
        result, records = profile_produce(stacks_path, args)
    stacks = drop_idle(flamegraph.read_stacks(stacks_path))
    title = f"trio-broker {args.workload} ({args.model}), {records} records"
    svg = args.out / f"{args.workload}.svg"
    svg.write_text(flamegraph.render(flamegraph.build_tree(stacks), title))
    table = top_table(stacks)
    (args.out / f"{args.workload}-top.txt").write_text(title + "\n" + table)
    stacks_path.unlink(missing_ok=True)
    print(json.dumps({k: round(v, 2) if isinstance(v, float) else v
                      for k, v in result.items() if not isinstance(v, list)}))  # fmt: skip
    print(f"wrote {svg}")
    print(table)
    return 0


def profile_w3(stacks_path: Path, rate: int, model: str, records: int) -> dict[str, Any]:
    """W1's log from an unprofiled broker, then W3 on a profiled one serving that dir."""
    writer = BrokerProcess(model)
    data_dir = writer.data_dir
    try:
        create_topic(writer.bootstrap, "w1")
        run_producer(writer.bootstrap, "w1", 1, 64 * KIB, {})  # W1's warm-up record
        run_producer(writer.bootstrap, "w1", records, 64 * KIB, {})
        writer.proc.send_signal(signal.SIGTERM)
        writer.proc.wait(60)
        # The profiled broker's own (empty) dir is replaced by W1's: the last flag wins.
        broker = ProfiledBroker(stacks_path, rate, model, extra=["--data-dir", str(data_dir)])
        try:
            passes = max(1, -(-(1024**3) // (records * 64 * KIB)))  # >= 1 GiB, as run_all
            return workloads.w3(broker, records, passes=passes)
        finally:
            broker.stop()
    finally:
        if writer.proc.poll() is None:
            writer.proc.kill()
            writer.proc.wait()
        shutil.rmtree(data_dir, ignore_errors=True)


def profile_produce(stacks_path: Path, args: argparse.Namespace) -> tuple[dict[str, Any], int]:
    broker = ProfiledBroker(stacks_path, args.rate, args.model)
    try:
        if args.workload == "w2":
            create_topic(broker.bootstrap, "w2")
            records = args.records or 100_000
            result = run_producer(broker.bootstrap, "w2", records, KIB, {"linger.ms": 5})
        else:
            create_topic(broker.bootstrap, "w1")
            records = args.records or 4096
            size, conf = (16 * KIB, workloads.W6_CONF) if args.workload == "w6" else (64 * KIB, {})
            result = run_producer(broker.bootstrap, "w1", records, size, conf)
    finally:
        broker.stop()
    return result, records


if __name__ == "__main__":
    raise SystemExit(main())
