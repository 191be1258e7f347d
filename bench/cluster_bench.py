"""W1 and W6 on RF=3 topics: a 3-broker trio-broker cluster beside a 3-node Kafka KRaft cluster.

Four clusters run one after the other, each for both workloads (a fresh RF=3 topic,
``min.insync.replicas=2``, one partition, confluent-kafka with ``acks=all``):

* **trio (fsync)**: ``trio-broker cluster up --brokers 3`` (a private ZooKeeper), the
  default durability: every ISR member fsyncs a write before it counts;
* **trio (replication)**: the same with ``acks.all.fsync=false`` and
  ``log.flush.interval.messages=9223372036854775807``: a write counts once every ISR
  member has it in page cache, and nothing is synced in the background, as Kafka;
* **Kafka**: three Apache Kafka 4.4 nodes, each broker and controller (KRaft), with
  Kafka's defaults (page cache, replication);
* **Kafka (fsync)**: the same with ``log.flush.interval.messages=1``.

For each it prints throughput, p50/p99 latency (librdkafka's own per-message latency),
and the CPU seconds of the three broker processes (utime + stime from /proc/PID/stat,
summed; ZooKeeper's are shown apart, Kafka's controllers live inside its brokers), the
ratios trio/Kafka for like durability, and this machine's limits (bench/limits.py).

    PYTHONPATH=. .venv/bin/python bench/cluster_bench.py --quick       # 1-2 minutes
    PYTHONPATH=. .venv/bin/python bench/cluster_bench.py --json out.json   # ~5 minutes
    PYTHONPATH=. .venv/bin/python bench/cluster_bench.py --rounds 3        # medians of 3

Each workload first writes a quarter of its records to the measured topic, unmeasured
(the JVMs compile their hot paths, connections and fetchers settle). Data dirs are
temporary directories under ``--data-parent`` (the system's temp dir), removed after.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

sys.path.insert(0, str(Path(__file__).resolve().parent))

import kafka_peer
import limits
from produce import run_producer
from workloads import KIB, W6_CONF

ROOT = Path(__file__).resolve().parent.parent
BROKERS = 3
MIN_INSYNC = 2
NEVER = "9223372036854775807"  # Long.MAX_VALUE: Kafka's default log.flush.interval.messages
READY = re.compile(r"cluster ready: bootstrap (\S+)")
START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 40.0

#: records of W1 (64 KiB) and W6 (16 KiB) per run
FULL = {"w1": 4096, "w6": 2048}
QUICK = {"w1": 256, "w6": 512}
WORKLOADS: dict[str, tuple[int, dict[str, Any]]] = {
    "w1": (64 * KIB, {}),  # batch 1 MiB, linger 1 ms (produce.run_producer's defaults)
    "w6": (16 * KIB, W6_CONF),  # one record per request, linger 0
}


def _proc_cpu_seconds(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:  # exited
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid == pid:
            found.append(int(entry))
    return found


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


class Cluster(Protocol):
    label: str
    bootstrap: str
    #: the three broker processes whose CPU is counted
    broker_pids: list[int]

    def broker_cpu_seconds(self) -> float: ...

    def other_cpu_seconds(self) -> float: ...

    def exited(self) -> dict[int, int | None]:
        """Broker PID -> its exit status, for the brokers that are gone (or not ours)."""
        ...

    def log_tail(self) -> str: ...

    def stop(self) -> None: ...


def _tails(paths: list[Path], lines: int = 15) -> str:
    out = []
    for path in paths:
        try:
            text = path.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            continue
        out.append(f"--- {path.name}\n" + "\n".join(text))
    return "\n".join(out)


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def trio_broker_exe() -> list[str]:
    """The venv's console script next to this interpreter, else ``python -m trio_broker.cli``."""
    exe = Path(sys.executable).with_name("trio-broker")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "trio_broker.cli"]


class TrioCluster:
    """``trio-broker cluster up --brokers 3 --base-port 0`` in a temp dir, until stop()."""

    def __init__(self, label: str, broker_config: dict[str, str], parent: Path) -> None:
        self.label = label
        self.data_dir = Path(tempfile.mkdtemp(prefix=f"cluster-bench-{label}-", dir=parent))
        argv = [*trio_broker_exe(), "cluster", "up", "--brokers", str(BROKERS),
                "--base-port", "0", "--data-dir", str(self.data_dir),
                "--min-insync-replicas", str(MIN_INSYNC)]  # fmt: skip
        for key, value in broker_config.items():
            argv += ["--broker-config", f"{key}={value}"]
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        }
        self.proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
            text=True, env=env,
        )  # fmt: skip
        self._stderr: list[str] = []
        threading.Thread(target=self._drain_stderr, daemon=True).start()
        self.bootstrap = self._wait_ready()
        children = _children(self.proc.pid)
        self.broker_pids = [pid for pid in children if " serve " in _cmdline(pid)]
        self.zookeeper_pids = [pid for pid in children if pid not in self.broker_pids]
        if len(self.broker_pids) != BROKERS:
            self.stop()
            raise RuntimeError(f"expected {BROKERS} broker processes, found {self.broker_pids}")

    def _drain_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self._stderr.append(line)

    def _wait_ready(self) -> str:
        assert self.proc.stdout is not None
        result: list[str] = []

        def read() -> None:
            assert self.proc.stdout is not None
            for line in self.proc.stdout:
                found = READY.search(line)
                if found:
                    result.append(found[1])
                    return

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        reader.join(START_TIMEOUT_S)
        if not result:
            logs = "".join(p.read_text(errors="replace")[-1500:]
                           for p in sorted(self.data_dir.glob("broker-*.log")))  # fmt: skip
            self.stop()
            raise RuntimeError(
                f"trio-broker cluster did not start: {''.join(self._stderr)[-2000:]}\n{logs}"
            )
        return result[0]

    def broker_cpu_seconds(self) -> float:
        return sum(_proc_cpu_seconds(pid) for pid in self.broker_pids)

    def exited(self) -> dict[int, int | None]:
        # cluster up's children: their statuses are its own to reap; a zombie is gone.
        return {pid: None for pid in self.broker_pids if _gone(pid)}

    def log_tail(self) -> str:
        return "".join(self._stderr)[-1500:] + _tails(sorted(self.data_dir.glob("broker-*.log")))

    def other_cpu_seconds(self) -> float:
        return sum(_proc_cpu_seconds(pid) for pid in self.zookeeper_pids)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # cluster up stops its brokers and ZooKeeper
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.data_dir, ignore_errors=True)


#: What every Kafka node gets besides its own keys: RF=3 and min ISR 2 as the trio
#: cluster's defaults, one __consumer_offsets partition, no rebalance delay.
KAFKA_CLUSTER_DEFAULTS = {
    "default.replication.factor": str(BROKERS),
    "min.insync.replicas": str(MIN_INSYNC),
    "offsets.topic.replication.factor": str(BROKERS),
    "offsets.topic.num.partitions": "1",
    "transaction.state.log.replication.factor": str(BROKERS),
    "transaction.state.log.min.isr": str(MIN_INSYNC),
    "group.initial.rebalance.delay.ms": "0",
    "auto.create.topics.enable": "false",
}


def kafka_cluster_node_keys(
    node_id: int, ports: list[int], controller_ports: list[int], data_dir: Path
) -> dict[str, str]:
    """One of three combined broker+controller nodes; all three are the quorum's voters."""
    voters = ",".join(f"{i + 1}@127.0.0.1:{port}" for i, port in enumerate(controller_ports))
    port, controller_port = ports[node_id - 1], controller_ports[node_id - 1]
    return {
        **kafka_peer.kafka_node_keys(port, controller_port, data_dir),
        "node.id": str(node_id),
        "controller.quorum.voters": voters,
    }


class KafkaCluster:
    """Three Kafka 4.4 KRaft nodes (broker and controller each) on free 127.0.0.1 ports."""

    def __init__(self, label: str, overrides: dict[str, str], parent: Path) -> None:
        libs = kafka_peer.resolve()
        java = shutil.which("java")
        if java is None:
            raise RuntimeError("Java is missing: scripts/install-system-deps.sh installs it")
        self.label = label
        self.data_dir = Path(tempfile.mkdtemp(prefix=f"cluster-bench-{label}-", dir=parent))
        ports = [kafka_peer._free_port() for _ in range(BROKERS)]
        controller_ports = [kafka_peer._free_port() for _ in range(BROKERS)]
        cluster_id = kafka_peer._cluster_id()
        log4j = self.data_dir / "log4j2.properties"
        log4j.write_text(kafka_peer.LOG4J2_PROPERTIES)
        base = [java, f"-Dlog4j2.configurationFile={log4j}", "-cp", str(libs / "*")]
        self.procs: list[subprocess.Popen[bytes]] = []
        self._logs: list[Any] = []
        self.bootstrap = ",".join(f"127.0.0.1:{port}" for port in ports)
        self.broker_pids: list[int] = []
        try:
            configs = []
            for node_id in range(1, BROKERS + 1):
                node_dir = self.data_dir / f"node-{node_id}"
                node_dir.mkdir()
                keys = {**KAFKA_CLUSTER_DEFAULTS,
                        **kafka_cluster_node_keys(node_id, ports, controller_ports, node_dir),
                        **overrides}  # fmt: skip
                config = node_dir / "server.properties"
                config.write_text("".join(f"{k}={v}\n" for k, v in keys.items()))
                configs.append(config)
            # The three formats at once: each is a JVM start of a few seconds.
            formats = [
                subprocess.Popen(
                    [
                        *base[:1],
                        *kafka_peer.tool_jvm_options(),
                        *base[1:],
                        "kafka.tools.StorageTool",
                        "format",
                        "--config",
                        str(config),
                        "--cluster-id",
                        cluster_id,
                    ],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                )
                for config in configs
            ]
            for fmt in formats:
                output, _ = fmt.communicate(timeout=kafka_peer.FORMAT_TIMEOUT_S)
                if fmt.returncode != 0:
                    raise RuntimeError(f"kafka-storage format failed:\n{output.decode()}")
            for node_id, config in enumerate(configs, start=1):
                out = (self.data_dir / f"node-{node_id}" / "kafka.log").open("wb")
                self._logs.append(out)
                self.procs.append(
                    subprocess.Popen(
                        [
                            java,
                            *kafka_peer.broker_jvm_options(),
                            *base[1:],
                            "kafka.Kafka",
                            str(config),
                        ],
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL,
                    )
                )
            self.broker_pids = [proc.pid for proc in self.procs]
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self) -> None:
        from confluent_kafka.admin import AdminClient

        deadline = time.monotonic() + START_TIMEOUT_S
        admin = None
        while time.monotonic() < deadline:
            for proc in self.procs:
                if proc.poll() is not None:
                    raise RuntimeError(f"a Kafka node exited with {proc.returncode}")
            try:
                if admin is None:
                    socket_ok = all(_port_open(addr) for addr in self.bootstrap.split(","))
                    if not socket_ok:
                        time.sleep(0.3)
                        continue
                    admin = AdminClient({"bootstrap.servers": self.bootstrap})
                if len(admin.list_topics(timeout=2).brokers) == BROKERS:
                    return
            except Exception:
                pass
            time.sleep(0.3)
        raise RuntimeError("the Kafka cluster did not list its 3 brokers in time")

    def broker_cpu_seconds(self) -> float:
        return sum(_proc_cpu_seconds(proc.pid) for proc in self.procs)

    def other_cpu_seconds(self) -> float:
        return 0.0  # the controllers run inside the broker JVMs

    def exited(self) -> dict[int, int | None]:
        return {p.pid: p.returncode for p in self.procs if p.poll() is not None}

    def log_tail(self) -> str:
        return _tails(sorted(self.data_dir.glob("node-*/kafka.log")))

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for proc in self.procs:
            try:
                proc.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for out in self._logs:
            out.close()
        shutil.rmtree(self.data_dir, ignore_errors=True)


def _port_open(address: str) -> bool:
    import socket

    host, port = address.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=1).close()
        return True
    except OSError:
        return False


def create_replicated_topic(bootstrap: str, topic: str) -> None:
    """RF=3, min.insync.replicas=2, one partition; returns once every replica is in sync."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    new = NewTopic(topic, num_partitions=1, replication_factor=BROKERS,
                   config={"min.insync.replicas": str(MIN_INSYNC)})  # fmt: skip
    for future in admin.create_topics([new]).values():
        future.result(30)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        meta = admin.list_topics(topic, timeout=5).topics.get(topic)
        if meta is not None and not meta.error and meta.partitions:
            partition = meta.partitions[0]
            if partition.leader >= 0 and len(partition.isrs) == BROKERS:
                return
        time.sleep(0.2)
    raise RuntimeError(f"{topic}: not all {BROKERS} replicas in sync within 30 s")


MODES: dict[str, tuple[str, dict[str, str]]] = {
    # label -> (kind, broker config)
    "trio_fsync": ("trio", {}),
    "trio_replication": ("trio", {"acks.all.fsync": "false", "log.flush.interval.messages": NEVER}),
    "kafka": ("kafka", {}),
    "kafka_fsync": ("kafka", dict(kafka_peer.FSYNC_EVERY_MESSAGE)),
}
#: Like durability side by side: (trio mode, Kafka mode).
PAIRS = [("trio_fsync", "kafka_fsync"), ("trio_replication", "kafka")]


def start_cluster(mode: str, parent: Path) -> Cluster:
    kind, config = MODES[mode]
    if kind == "trio":
        return TrioCluster(mode, config, parent)
    return KafkaCluster(mode, config, parent)


def run_mode(mode: str, records: dict[str, int], parent: Path, deadline: float) -> dict[str, Any]:
    t0 = time.monotonic()
    cluster = start_cluster(mode, parent)
    out: dict[str, Any] = {
        "start_s": time.monotonic() - t0,
        "broker_processes": len(set(cluster.broker_pids)),
    }
    try:
        for name, (size, conf) in WORKLOADS.items():
            if time.monotonic() > deadline:
                out[name] = {"skipped": "time bound reached"}
                continue
            topic = f"{name}-rf3"
            create_replicated_topic(cluster.bootstrap, topic)
            # Warm up on the measured topic (JIT for the JVMs, connections, the fetchers'
            # first rounds): a quarter of the run, not counted.
            run_producer(cluster.bootstrap, topic, max(records[name] // 4, 8), size, conf)
            cpu0, other0 = cluster.broker_cpu_seconds(), cluster.other_cpu_seconds()
            result = run_producer(cluster.bootstrap, topic, records[name], size, conf)
            result["broker_cpu_s"] = cluster.broker_cpu_seconds() - cpu0
            result["zookeeper_cpu_s"] = cluster.other_cpu_seconds() - other0
            result.pop("cdf_ms", None)
            out[name] = result
            print(f"  {mode} {name}: {result['mb_per_s']:.1f} MB/s, p99 "
                  f"{result['p99_ms']:.1f} ms, broker CPU {result['broker_cpu_s']:.1f} s",
                  flush=True)  # fmt: skip
    except Exception as exc:  # recorded, with the brokers' logs; the run goes on
        out["failed"] = f"{type(exc).__name__}: {exc}"
        out["exited"] = cluster.exited()
        out["log_tail"] = cluster.log_tail()
        print(f"  {mode}: FAILED {out['failed']}; exited: {out['exited']}\n{out['log_tail']}",
              flush=True)  # fmt: skip
    finally:
        t1 = time.monotonic()
        cluster.stop()
        out["stop_s"] = time.monotonic() - t1
    return out


def kafka_available() -> str | None:
    """None if Kafka's jars are (or can be) had, else why not."""
    if shutil.which("java") is None:
        return "Java is missing (scripts/install-system-deps.sh)"
    try:
        kafka_peer.resolve()
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        return f"Kafka's jars cannot be obtained: {exc}"
    return None


def table(results: dict[str, Any]) -> str:
    lines = []
    # CPU: the three brokers' utime+stime, summed; ZooKeeper's (trio-broker's cluster
    # only: Kafka's KRaft controllers run inside its brokers) in a column of its own.
    header = ("| workload | cluster | MB/s (each round) | rec/s | p50 ms | p99 ms | broker CPU s "
              "| broker CPU s/GB | ZooKeeper CPU s | errors |")  # fmt: skip
    lines += [header, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    modes = results["modes"]
    for name in WORKLOADS:
        for mode in (m for m in MODES if m in modes):
            r = modes[mode].get(name)
            if not r or "mb_per_s" not in r:
                why = ((r or {}).get("skipped") or modes[mode].get("skipped")
                       or modes[mode].get("failed", "not run"))  # fmt: skip
                lines.append(f"| {name.upper()} | {mode} | {why} | | | | | | | |")
                continue
            gb = r["records"] * r["record_bytes"] / 1e9
            every = r.get("mb_per_s_rounds", [])
            rounds_note = f" ({', '.join(map(str, every))})" if len(every) > 1 else ""
            zookeeper = f"{r['zookeeper_cpu_s']:.1f}" if MODES[mode][0] == "trio" else "-"
            lines.append(
                f"| {name.upper()} | {mode} | {r['mb_per_s']:.1f}{rounds_note} "
                f"| {r['records_per_s']:.0f} "
                f"| {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | {r['broker_cpu_s']:.1f} "
                f"| {r['broker_cpu_s'] / gb:.0f} | {zookeeper} "
                f"| {r['errors'] + r['undelivered']} |"
            )
    lines.append("")
    for trio_mode, kafka_mode in PAIRS:
        for name in WORKLOADS:
            ratio = results["ratios"].get(f"{name}:{trio_mode}/{kafka_mode}")
            if ratio:
                lines.append(
                    f"- {name.upper()} {trio_mode} / {kafka_mode}: throughput "
                    f"x{ratio['throughput']:.2f}, p99 x{ratio['p99']:.2f}, "
                    f"broker CPU per byte x{ratio['cpu_per_byte']:.2f}"
                )
    lim = results.get("limits") or {}
    if lim:
        lines.append(
            f"- limits: loopback TCP {lim['loopback_tcp_mb_per_s']:.0f} MB/s, 1 MiB write + "
            f"fdatasync {lim['fdatasync_1mib_mb_per_s']:.0f} MB/s, 64 KiB append + fsync "
            f"{lim['append_fsync_64kib_per_s']:.0f}/s"
        )
    lines.append(
        f"- {results['cpus']} CPUs, load average {results['loadavg_before'][0]:.1f} before, "
        f"{results['loadavg_after'][0]:.1f} after"
    )
    return "\n".join(lines)


def ratios(modes: dict[str, Any]) -> dict[str, dict[str, float]]:
    out = {}
    for trio_mode, kafka_mode in PAIRS:
        for name in WORKLOADS:
            t = modes.get(trio_mode, {}).get(name, {})
            k = modes.get(kafka_mode, {}).get(name, {})
            if "mb_per_s" not in t or "mb_per_s" not in k:
                continue
            out[f"{name}:{trio_mode}/{kafka_mode}"] = {
                "throughput": t["mb_per_s"] / k["mb_per_s"],
                "p99": t["p99_ms"] / k["p99_ms"] if k["p99_ms"] else float("nan"),
                # Same bytes on both sides: CPU seconds compare per byte directly.
                "cpu_per_byte": (t["broker_cpu_s"] / (t["records"] * t["record_bytes"]))
                / max(k["broker_cpu_s"] / (k["records"] * k["record_bytes"]), 1e-12),
            }
    return out


def run(
    modes: list[str],
    records: dict[str, int],
    time_limit: float,
    limit_seconds: float,
    parent: Path,
    log: Callable[[str], None] = print,
    rounds: int = 1,
    checkpoint: Callable[[dict[str, Any]], None] = lambda results: None,
) -> dict[str, Any]:
    """Every mode ``rounds`` times, the order rotating from round to round (a busy spell
    of a shared machine then falls on different modes); ``modes`` holds each mode's
    median round per workload (see :func:`median_rounds`)."""
    deadline = time.monotonic() + time_limit
    results: dict[str, Any] = {
        "started_utc": time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime()),
        "cpus": os.cpu_count(), "platform": platform.platform(),
        "loadavg_before": os.getloadavg(), "records": records,
        "replication_factor": BROKERS, "min_insync_replicas": MIN_INSYNC,
        "rounds": [],
    }  # fmt: skip
    unavailable = kafka_available() if any(MODES[m][0] == "kafka" for m in modes) else None
    results["kafka_unavailable"] = unavailable
    for round_index in range(rounds):
        this_round: dict[str, Any] = {}
        results["rounds"].append(this_round)
        shift = round_index % len(modes)
        for mode in modes[shift:] + modes[:shift]:
            if MODES[mode][0] == "kafka" and unavailable:
                this_round[mode] = {"skipped": unavailable}
                log(f"{mode}: skipped ({unavailable})")
                continue
            if time.monotonic() > deadline:
                this_round[mode] = {"skipped": "time bound reached"}
                continue
            log(f"round {round_index + 1}/{rounds}, {mode}: starting 3 brokers")
            try:
                this_round[mode] = run_mode(mode, records, parent, deadline)
            except Exception as exc:  # the cluster did not start: the other modes still run
                this_round[mode] = {"failed": f"{type(exc).__name__}: {exc}"}
                log(f"{mode}: FAILED to start: {exc}")
            checkpoint(results)  # a run cut short keeps what it measured
    results["modes"] = median_rounds(results["rounds"], modes)
    if limit_seconds > 0:
        results["limits"] = limits.measure(parent, limit_seconds)
    results["loadavg_after"] = os.getloadavg()
    results["ratios"] = ratios(results["modes"])
    return results


def median_rounds(rounds: list[dict[str, Any]], modes: list[str]) -> dict[str, Any]:
    """Per mode and workload, the round with the median throughput (the lower middle of
    an even count), whole: its latency and CPU belong to the same run. Each result also
    lists every round's MB/s (``mb_per_s_rounds``)."""
    out: dict[str, Any] = {}
    for mode in modes:
        runs = [r[mode] for r in rounds if mode in r]
        done = [r for r in runs if "skipped" not in r]
        if not done:
            out[mode] = runs[0] if runs else {"skipped": "not run"}
            continue
        merged: dict[str, Any] = {
            "broker_processes": done[0].get("broker_processes"),
            "failed_rounds": sum("failed" in r for r in runs),
        }
        for name in WORKLOADS:
            measured = sorted(
                (r[name] for r in done if "mb_per_s" in r.get(name, {})),
                key=lambda result: float(result["mb_per_s"]),
            )
            if not measured:
                merged[name] = next((r[name] for r in done if name in r), {"skipped": "not run"})
                continue
            median = dict(measured[(len(measured) - 1) // 2])
            median["mb_per_s_rounds"] = [round(r["mb_per_s"], 1) for r in measured]
            merged[name] = median
        out[mode] = merged
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller runs: 1-2 minutes")
    parser.add_argument("--modes", default=",".join(MODES), help=f"of {', '.join(MODES)}")
    parser.add_argument("--rounds", type=int, default=1,
                        help="run every mode this many times, in rotating order; the table "
                        "shows each one's median round")  # fmt: skip
    parser.add_argument("--w1-records", type=int, help="override W1's record count")
    parser.add_argument("--w6-records", type=int, help="override W6's record count")
    parser.add_argument("--time-limit", type=float, default=900.0,
                        help="seconds; modes and workloads past it are skipped")  # fmt: skip
    parser.add_argument("--limits-seconds", type=float, default=None,
                        help="seconds per physical limit (0: skip; default 1 quick, 3 full)")  # fmt: skip
    parser.add_argument("--data-parent", type=Path, default=Path(tempfile.gettempdir()),
                        help="where the clusters' temporary data dirs go")  # fmt: skip
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        parser.error(f"unknown modes {unknown}; known: {', '.join(MODES)}")
    records = dict(QUICK if args.quick else FULL)
    if args.w1_records:
        records["w1"] = args.w1_records
    if args.w6_records:
        records["w6"] = args.w6_records
    limit_seconds = args.limits_seconds
    if limit_seconds is None:
        limit_seconds = 1.0 if args.quick else 3.0

    def checkpoint(partial: dict[str, Any]) -> None:
        if args.json:
            args.json.write_text(json.dumps(partial, indent=2))

    results = run(
        modes, records, args.time_limit, limit_seconds, args.data_parent, rounds=args.rounds,
        checkpoint=checkpoint,
    )  # fmt: skip
    text = table(results)
    print(text)
    results["table_markdown"] = text
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    failed = any(
        "failed" in mode
        or any(
            r.get("errors", 0) + r.get("undelivered", 0)
            for r in mode.values()
            if isinstance(r, dict)
        )
        for this_round in results["rounds"]
        for mode in this_round.values()
    )
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
