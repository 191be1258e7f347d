"""Power-cut loop: kill -9 the broker and cut the power under it, then check what it kept.

A real ``trio-broker serve`` process runs with its ``--data-dir`` on a fault filesystem
(``tests/faultfs``: a FUSE mount that keeps, at a power cut, only what was fsynced). An
idempotent confluent-kafka producer (acks=all) writes records with unique, self-checking
values (``pc|RUN|SEQ|`` and a SHA-256-derived body; key ``kSEQ``) to a topic with
``PARTITIONS`` partitions; every delivery callback that reports success is recorded with its
partition and offset. A second thread changes metadata all the time, each change recorded
as acknowledged, unanswered (sent, the broker died) or never sent: CreateTopics (with a
config), IncrementalAlterConfigs, CreateAcls and AlterUserScramCredentials (over the wire
with the admin CLI's client, ``trio_broker.admin.client.BlockingClient``) and OffsetCommit
(a confluent-kafka Consumer, ``commit(asynchronous=False)``). At a random moment the
harness kills the broker with SIGKILL - most kills are timed to a moment when the mount
holds un-synced file data (the broker is frozen with SIGSTOP then), so that the cut has
something to lose - cuts the power (``FaultFS.power_cut``: "drop" reverts every un-synced
byte, "tear" keeps a random prefix of it, "garble" fills it with random bytes), and
restarts the broker on the same data dir and port.

After every restart, and at the end, with the metadata thread paused, over the wire
(records with ``RawConnection`` from tests/e2e, everything else with a confluent-kafka
AdminClient):

- every acknowledged record is at its acknowledged (partition, offset) with its exact key
  and value bytes: **lost** if it is nowhere in the log, **changed** if it is elsewhere or
  damaged; no record of the run appears twice (**duplicated**); every batch served has a
  right CRC-32C (computed here with the ``crc32c`` package, not the broker's codec), every
  record served is one the producer wrote (**corrupt** otherwise) and offsets are
  contiguous;
- one cluster id (Metadata) across all cuts;
- topics (partition count, topic id), topic configs, committed offsets, ACLs and SCRAM
  credentials (mechanism, iterations) are as acknowledged: each is a register that must
  hold its last acknowledged value, or the value of a later change whose answer never came
  (the broker died under it); what a check sees then becomes the value to keep.

The broker can be swapped for the planted bug (``--no-fsync``: the broker through
``tests/reliability/nofsync_broker.py``, fsync and fdatasync are no-ops; the loop must then
report loss) or for another source tree (``--broker-pythonpath DIR``: its ``trio_broker``
is imported instead of this one's).

    .venv/bin/python bench/power_cut.py                      # 200 cuts, drop mode
    .venv/bin/python bench/power_cut.py --cuts 50 --mode tear --json tear.json
    .venv/bin/python bench/power_cut.py --cuts 5 --no-fsync  # must report loss

``tests/reliability/test_power_cut.py`` runs the same harness in CI (20 cuts, mixed modes,
and the planted bug). Needs FUSE (``tests.faultfs.fuse_available``).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import random
import shutil
import signal
import statistics
import struct
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import attrs

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import crc32c  # noqa: E402
from confluent_kafka import (  # noqa: E402
    Consumer,
    ConsumerGroupTopicPartitions,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import (  # noqa: E402
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ConfigResource,
    ConfigSource,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)

from tests.e2e.conftest import BROKER_EXE, RawConnection  # noqa: E402
from tests.faultfs import MODES, CutReport, FaultFS, FaultFSError, fuse_available  # noqa: E402
from tests.reliability.conftest import ConfiguredBroker  # noqa: E402
from trio_broker.admin.acls import ACL_API_VERSION  # noqa: E402
from trio_broker.admin.client import AdminError, BlockingClient  # noqa: E402
from trio_broker.handlers.alter_configs import TOPIC_RESOURCE  # noqa: E402
from trio_broker.protocol import messages as m  # noqa: E402
from trio_broker.security.acl import Operation as AclOp  # noqa: E402
from trio_broker.security.acl import PatternType as AclPattern  # noqa: E402
from trio_broker.security.acl import Permission as AclPermission  # noqa: E402
from trio_broker.security.acl import ResourceType as AclResource  # noqa: E402
from trio_broker.security.credentials import MECHANISM_IDS  # noqa: E402

TOPIC = "power-cut"
PARTITIONS = 3
GROUP = "power-cut-group"
#: Small segments, so that segment files are created (and their directory synced) often.
SEGMENT_BYTES = 96 * 1024
#: retention.ms values: a week and then some, so retention never deletes anything here.
RETENTION_BASE_MS = 7 * 24 * 3600 * 1000
#: The planted bug: the broker with fsync and fdatasync replaced by no-ops.
NOFSYNC_LAUNCHER = (sys.executable, str(ROOT / "tests" / "reliability" / "nofsync_broker.py"))
#: Bounded waits (seconds): one admin request, the whole metadata check, a paused worker.
REQUEST_TIMEOUT_S = 10.0
RESULT_TIMEOUT_S = 30.0
PAUSE_TIMEOUT_S = 60.0
#: A register's value when the thing does not exist (no topic, no ACL, no credential...).
ABSENT = "(absent)"
DYNAMIC_TOPIC_CONFIG = ConfigSource.DYNAMIC_TOPIC_CONFIG.value
#: SCRAM mechanisms with their PBKDF2 digest, used in turn.
SCRAM = (("SCRAM-SHA-512", "sha512"), ("SCRAM-SHA-256", "sha256"))

BROKER_CONFIG: dict[str, Any] = {
    "num.partitions": PARTITIONS,
    "auto.create.topics.enable": False,  # a topic lost in a cut must not come back empty
    "group.initial.rebalance.delay.ms": 0,
    "authorizer.class.name": "acl",  # CreateAcls answers SECURITY_DISABLED without one
    "super.users": "User:ANONYMOUS",  # the harness's plaintext clients may do everything
}
CLIENT_CONFIG: dict[str, Any] = {
    "reconnect.backoff.ms": 50,
    "reconnect.backoff.max.ms": 500,
    "socket.timeout.ms": 10_000,
    "log_level": 2,  # connection-refused noise while the broker is down
}

Key = tuple[Any, ...]


class FuseUnavailable(RuntimeError):
    """FUSE cannot work here: the harness cannot run (and must not pass)."""


# ------------------------------------------------------------------------------ records


def record_bytes(run: str, seq: int) -> tuple[bytes, bytes]:
    """The key and value of record ``seq``: unique and checkable byte for byte."""
    head = b"pc|%s|%09d|" % (run.encode(), seq)
    digest = hashlib.sha256(head).hexdigest().encode()
    length = 40 + (seq * 37) % 260
    body = (digest * (length // len(digest) + 1))[:length]
    return b"k%09d" % seq, head + body


def key_seq(key: bytes | None) -> int | None:
    """The sequence number a record key names, or None."""
    if key is None or len(key) != 10 or not key.startswith(b"k") or not key[1:].isdigit():
        return None
    return int(key[1:])


# ------------------------------------------------------------------------------ results


@attrs.define
class CutSummary:
    """What one power cut threw away (from the fault filesystem's CutReport)."""

    cut: int
    mode: str
    #: The kill was timed (broker frozen) while the mount held un-synced data or entries.
    aimed: bool
    changed: bool
    bytes_dropped: int
    bytes_kept: int
    bytes_garbled: int
    files_rolled_back: int
    files_lost: int
    files_restored: int
    files_replaced: int
    dirs_lost: int
    dirs_restored: int
    seconds: float
    #: The files rolled back or lost (the first few), relative to the data dir.
    paths: list[str] = attrs.field(factory=list)

    @classmethod
    def of(cls, cut: int, report: CutReport, aimed: bool) -> CutSummary:
        return cls(
            cut=cut, mode=report.mode, aimed=aimed, changed=report.changed,
            bytes_dropped=report.bytes_dropped, bytes_kept=report.bytes_kept,
            bytes_garbled=report.bytes_garbled, files_rolled_back=len(report.files),
            files_lost=len(report.files_lost), files_restored=len(report.files_restored),
            files_replaced=len(report.files_replaced), dirs_lost=len(report.dirs_lost),
            dirs_restored=len(report.dirs_restored), seconds=report.seconds,
            paths=[p.removeprefix("/data/") for p in
                   [f.path for f in report.files] + report.files_lost][:6],
        )  # fmt: skip

    def line(self) -> str:
        if not self.changed:
            return f"{self.mode}{' aimed' if self.aimed else ''}: nothing lost"
        return (
            f"{self.mode}{' aimed' if self.aimed else ''}: {self.bytes_dropped} B dropped, "
            f"{self.bytes_kept} B kept torn, {self.bytes_garbled} B garbled in "
            f"{self.files_rolled_back} files; files lost {self.files_lost}, restored "
            f"{self.files_restored}, replaced {self.files_replaced}; dirs lost "
            f"{self.dirs_lost}, restored {self.dirs_restored} ({', '.join(self.paths)})"
        )


@attrs.define
class PowerCutResult:
    cycles: int = 0
    seconds: float = 0.0
    modes: dict[str, int] = attrs.field(factory=dict)
    stopped_early: str = ""
    records_sent: int = 0
    records_acked: int = 0
    records_failed: int = 0
    records_in_log: int = 0
    #: Distinct acknowledged records found missing / changed at some check.
    lost: int = 0
    changed: int = 0
    #: Distinct records (acknowledged or not) found more than once at some check.
    duplicated: int = 0
    #: Records served that the producer never wrote (bytes damaged), batches with a bad CRC.
    corrupt_records: int = 0
    corrupt_batches: int = 0
    offset_gaps: int = 0
    #: Every cluster id seen, in order (one expected).
    cluster_ids: list[str] = attrs.field(factory=list)
    #: Metadata changes per kind: acknowledged, and with no answer (either outcome allowed).
    metadata_acked: dict[str, int] = attrs.field(factory=dict)
    metadata_unknown: dict[str, int] = attrs.field(factory=dict)
    #: Changes never sent (the broker was down: connection refused).
    metadata_not_sent: dict[str, int] = attrs.field(factory=dict)
    metadata_checks: int = 0
    #: Every check's findings, and the number of distinct things (registers) concerned.
    metadata_lost: list[str] = attrs.field(factory=list)
    metadata_lost_items: int = 0
    topic_id_changes: list[str] = attrs.field(factory=list)
    fatal_errors: list[str] = attrs.field(factory=list)
    producer_errors: dict[str, int] = attrs.field(factory=dict)
    check_errors: list[str] = attrs.field(factory=list)
    start_failures: list[str] = attrs.field(factory=list)
    #: First problems found, with the check (cut number or "end") where they were seen.
    examples: list[str] = attrs.field(factory=list)
    cuts: list[CutSummary] = attrs.field(factory=list)

    def problems(self) -> list[str]:
        out = [
            f"{name}: {count}"
            for name, count in (
                ("lost", self.lost),
                ("changed", self.changed),
                ("duplicated", self.duplicated),
                ("corrupt records served", self.corrupt_records),
                ("batches with a bad CRC served", self.corrupt_batches),
                ("offset gaps", self.offset_gaps),
            )
            if count
        ]
        if len(self.cluster_ids) > 1:
            out.append(f"cluster id changed: {' -> '.join(self.cluster_ids)}")
        out += [f"metadata: {v}" for v in self.metadata_lost[:10]]
        if len(self.metadata_lost) > 10:
            out.append(f"metadata: ... {len(self.metadata_lost) - 10} more findings")
        out += [f"topic id changed: {v}" for v in self.topic_id_changes]
        out += [f"fatal producer error: {e}" for e in self.fatal_errors]
        out += [f"broker did not start: {e}" for e in self.start_failures]
        out += [f"check failed: {e}" for e in self.check_errors]
        return out

    def cut_numbers(self) -> str:
        dropped = [c.bytes_dropped for c in self.cuts]
        if not dropped:
            return "cuts: none"
        touched = sum(1 for c in self.cuts if c.changed)
        aimed = sum(1 for c in self.cuts if c.aimed)
        return (
            f"cuts: {len(self.cuts)} ({aimed} aimed at un-synced state, {touched} changed "
            f"the disk); bytes dropped per cut "
            f"min/median/max {min(dropped)}/{statistics.median(dropped):.0f}/{max(dropped)}, "
            f"total dropped {sum(dropped)} kept torn {sum(c.bytes_kept for c in self.cuts)} "
            f"garbled {sum(c.bytes_garbled for c in self.cuts)}; files rolled back "
            f"{sum(c.files_rolled_back for c in self.cuts)}, files lost "
            f"{sum(c.files_lost for c in self.cuts)}, restored "
            f"{sum(c.files_restored for c in self.cuts)}, replaced "
            f"{sum(c.files_replaced for c in self.cuts)}; dirs lost "
            f"{sum(c.dirs_lost for c in self.cuts)}, restored "
            f"{sum(c.dirs_restored for c in self.cuts)}"
        )

    def summary(self) -> str:
        lines = [
            f"cycles={self.cycles} modes={self.modes} seconds={self.seconds:.1f}"
            + (f" (stopped early: {self.stopped_early})" if self.stopped_early else ""),
            f"records: sent={self.records_sent} acknowledged={self.records_acked} "
            f"failed={self.records_failed} in log={self.records_in_log} lost={self.lost} "
            f"changed={self.changed} duplicated={self.duplicated} "
            f"corrupt={self.corrupt_records} bad-crc batches={self.corrupt_batches} "
            f"offset gaps={self.offset_gaps}",
            f"cluster ids seen: {len(self.cluster_ids)} {self.cluster_ids}",
            f"producer errors (not fatal unless listed below): {self.producer_errors}",
            f"metadata: acknowledged {self.metadata_acked}, unanswered {self.metadata_unknown}, "
            f"not sent {self.metadata_not_sent}, "
            f"checks={self.metadata_checks} lost/changed={self.metadata_lost_items}",
            self.cut_numbers(),
        ]
        if self.examples:
            lines.append("first findings: " + "; ".join(self.examples[:8]))
        problems = self.problems()
        lines.append("problems: " + ("; ".join(problems) if problems else "none"))
        return "\n".join(lines)


# ------------------------------------------------------------------------------ the broker


class PowerCutBroker(ConfiguredBroker):
    """The broker on the fault filesystem; its config file and log stay off the mount.

    ``launcher`` replaces the ``trio-broker`` executable (e.g. ``NOFSYNC_LAUNCHER``);
    ``pythonpath`` runs it with ``PYTHONPATH`` set, so that another tree's ``trio_broker``
    is imported (the venv's editable install comes after PYTHONPATH on sys.path).
    """

    def __init__(
        self,
        data_dir: Path,
        side_dir: Path,
        config: dict[str, Any],
        launcher: Sequence[str] | None = None,
        pythonpath: Path | None = None,
    ) -> None:
        super().__init__(data_dir, config=config, config_path=side_dir / "broker.toml")
        self.log_path = side_dir / "broker.log"
        self.launcher = list(launcher) if launcher else [str(BROKER_EXE)]
        self.pythonpath = pythonpath

    def command_line(self) -> list[str]:
        argv = [*self.launcher, *super().command_line()[1:]]
        if self.pythonpath is not None:
            env = shutil.which("env") or "/usr/bin/env"  # execs: the PID stays the broker's
            argv = [env, f"PYTHONPATH={self.pythonpath}", *argv]
        return argv


# ------------------------------------------------------------------------------ the load


class LoadProducer(threading.Thread):
    """An idempotent acks=all producer; records every acknowledged (partition, offset)."""

    def __init__(self, bootstrap: str, run: str, rate: float) -> None:
        super().__init__(name="power-cut-producer", daemon=True)
        self.bootstrap = bootstrap
        self.run_tag = run
        self.rate = rate
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.acked: dict[int, tuple[int, int]] = {}
        self.failed: dict[int, str] = {}
        self.fatal: list[str] = []
        #: Errors librdkafka reported (by name): transport errors while the broker is down.
        self.errors: Counter[str] = Counter()
        self.sent = 0
        self._fatal_seen = threading.Event()
        self.producer = self._new_producer()

    def _new_producer(self) -> Producer:
        return Producer(
            {
                **CLIENT_CONFIG,
                "bootstrap.servers": self.bootstrap,
                "client.id": "power-cut-producer",
                "acks": "all",
                "enable.idempotence": True,
                "max.in.flight.requests.per.connection": 5,
                "message.timeout.ms": 120_000,
                "linger.ms": 5,
                "retry.backoff.ms": 50,
                "error_cb": self._on_error,
            }
        )

    def _on_error(self, err: KafkaError) -> None:
        with self.lock:
            self.errors[err.name()] += 1
            if err.fatal():
                self.fatal.append(str(err))
                self._fatal_seen.set()

    def _on_delivery(self, err: KafkaError | None, msg: Any) -> None:
        seq = key_seq(msg.key())
        if seq is None:
            return
        with self.lock:
            if err is None:
                self.acked[seq] = (msg.partition(), msg.offset())
            else:
                self.failed[seq] = str(err)

    def run(self) -> None:
        """Bursts of 1-40 records back to back (so that batches of several records are
        written and torn), paced to ``rate`` records per second on average."""
        rng = random.Random(self.run_tag)
        seq = 0
        burst_end = 0
        while not self.stop.is_set():
            if seq >= burst_end:
                burst = rng.randint(1, 40)
                burst_end = seq + burst
                self.producer.poll(0)
                time.sleep(burst / self.rate)
            if self._fatal_seen.is_set():
                # A fatal idempotence error ends that producer (recorded as a problem); go on
                # with a new one (new producer id) so that the loop keeps its load.
                self._fatal_seen.clear()
                self.producer.purge()
                self.producer.poll(0)
                self.producer = self._new_producer()
            key, value = record_bytes(self.run_tag, seq)
            try:
                self.producer.produce(
                    TOPIC, value, key, partition=seq % PARTITIONS, on_delivery=self._on_delivery
                )
            except BufferError:
                self.producer.poll(0.1)
                continue
            except KafkaException as exc:
                with self.lock:
                    self.fatal.append(f"produce: {exc}")
                self._fatal_seen.set()
                continue
            seq += 1
            self.sent = seq

    def snapshot(self) -> dict[int, tuple[int, int]]:
        with self.lock:
            return dict(self.acked)

    def finish(self, timeout: float) -> None:
        """Stop producing and wait (bounded) for every answer."""
        self.stop.set()
        self.join(10)
        self.producer.flush(timeout)

    def abandon(self) -> None:
        """Stop producing; what has no answer yet fails (nothing waits for it)."""
        self.stop.set()
        self.join(10)
        self.producer.purge()
        self.producer.flush(5)


@attrs.define
class Register:
    """One piece of metadata: the value it must hold, and unanswered later changes."""

    last: Any = ABSENT
    pending: list[Any] = attrs.field(factory=list)


class Ledger:
    """Acknowledged and unanswered metadata changes, as registers keyed by what they set."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.registers: dict[Key, Register] = {}
        self.acked: Counter[str] = Counter()
        self.unknown: Counter[str] = Counter()
        self.refused: Counter[str] = Counter()

    def record(self, key: Key, value: Any, ok: bool) -> None:
        """A change to ``value``: acknowledged (``ok``) or sent without a success answer."""
        kind = str(key[0])
        with self.lock:
            reg = self.registers.setdefault(key, Register())
            if ok:
                reg.last, reg.pending = value, []
                self.acked[kind] += 1
            else:
                reg.pending.append(value)
                self.unknown[kind] += 1

    def not_sent(self, key: Key) -> None:
        """A change that never reached the broker (connection refused): nothing to keep."""
        with self.lock:
            self.refused[str(key[0])] += 1

    def keys(self, kind: str) -> list[Key]:
        with self.lock:
            return [k for k in self.registers if k[0] == kind]

    def check(self, kind: str, observed: Callable[[Key], Any]) -> list[tuple[Key, str]]:
        """Compare every register of ``kind`` with what the broker shows; then what it shows
        is the value to keep (a change with no answer is now settled one way or the other)."""
        problems = []
        with self.lock:
            for key, reg in self.registers.items():
                if key[0] != kind:
                    continue
                seen = observed(key)
                allowed = [reg.last, *reg.pending]
                if seen not in allowed:
                    later = f" (or an unanswered {reg.pending})" if reg.pending else ""
                    problems.append(
                        (key, f"{key}: found {seen!r}, acknowledged {reg.last!r}{later}")
                    )
                    continue
                reg.last, reg.pending = seen, []
        return problems


def _answered(future: Future[Any]) -> bool:
    """Whether an admin future (the checker's: never in flight across a kill) succeeded."""
    try:
        future.result(timeout=RESULT_TIMEOUT_S)
    except Exception:  # a KafkaException, the broker's refusal, or no answer in time
        return False
    return True


def _acl_key(binding: AclBinding) -> Key:
    """An ACL binding as a ledger key (confluent-kafka's enum names)."""
    fields = (binding.restype, binding.name, binding.resource_pattern_type, binding.principal,
              binding.host, binding.operation, binding.permission_type)  # fmt: skip
    return ("acl", *(getattr(f, "name", f) for f in fields))


#: The answer to a request that never left: the broker was down (connection refused).
NOT_SENT = object()


class MetadataWorker(threading.Thread):
    """Changes metadata in rounds (topic, configs, offsets, ACL, SCRAM), recording each
    change in the ledger as acknowledged or not; ``pause`` parks it between changes.

    The changes go over the wire with the admin CLI's client (``BlockingClient``, one
    connection per request), so that a kill -9 may land in the middle of any of them: a
    request sent without an answer is "unanswered" (either outcome allowed); a refused
    connection means it was never sent. (confluent-kafka's AdminClient aborts the process
    when a broker restarts under a request in flight: librdkafka issues #4605 and #3663,
    ``rd_kafka_enq_once_del_source_return: Assertion `eonce->refcnt > 0' failed``; it only
    reads, between cuts.) Offsets are committed by a confluent-kafka Consumer.
    """

    def __init__(self, bootstrap: str, ledger: Ledger, seed: int) -> None:
        super().__init__(name="power-cut-metadata", daemon=True)
        self.bootstrap = bootstrap
        self.ledger = ledger
        self.rng = random.Random(seed)
        self.consumer = Consumer(
            {
                **CLIENT_CONFIG,
                "bootstrap.servers": bootstrap,
                "group.id": GROUP,
                "client.id": "power-cut-committer",
                "enable.auto.commit": False,
            }
        )
        self.stop = threading.Event()
        #: Rounds in which every change was acknowledged.
        self.acked_rounds = 0
        self.errors: list[str] = []
        self._cond = threading.Condition()
        self._paused = False
        self._busy = False
        self._round_ok = True
        self._closed = False

    # -- pause / resume ---------------------------------------------------------------

    def pause(self, timeout: float = PAUSE_TIMEOUT_S) -> bool:
        """Stop before the next change; True once no change is in flight."""
        with self._cond:
            self._paused = True
            return self._cond.wait_for(lambda: not self._busy, timeout)

    def resume(self) -> None:
        with self._cond:
            self._paused = False
            self._cond.notify_all()

    def _step(self, op: Callable[[int], None], n: int) -> bool:
        with self._cond:
            while self._paused and not self.stop.is_set():
                self._cond.wait(0.2)
            if self.stop.is_set():
                return False
            self._busy = True
        try:
            op(n)
        except Exception as exc:  # a harness bug, not a broker answer: reported
            self.errors.append(f"{op.__name__}({n}): {exc!r}")
            self._round_ok = False
        finally:
            with self._cond:
                self._busy = False
                self._cond.notify_all()
        return True

    def run(self) -> None:
        ops = [self.create_topic, self.alter_configs, self.commit_offsets, self.add_acl,
               self.upsert_scram]  # fmt: skip
        n = 0
        while not self.stop.is_set():
            self._round_ok = True
            if not all(self._step(op, n) for op in ops):
                return
            if self._round_ok:
                self.acked_rounds += 1
            n += 1
            self.stop.wait(self.rng.uniform(0.05, 0.3))

    def finish(self) -> None:
        self.stop.set()
        self.resume()
        self.join(RESULT_TIMEOUT_S * 3)
        if not self._closed:
            self._closed = True
            self.consumer.close()

    # -- the changes ------------------------------------------------------------------

    def _call(self, api_key: int, version: int, body: Any) -> Any:
        """The response, None if there was none (sent, maybe applied), or NOT_SENT."""
        try:
            client = BlockingClient(self.bootstrap, timeout=REQUEST_TIMEOUT_S,
                                    client_id="power-cut-admin")  # fmt: skip
        except AdminError:
            return NOT_SENT
        try:
            return client.call(api_key, version, body)
        except (AdminError, OSError, ValueError, struct.error):
            return None
        finally:
            client.close()

    def _record(
        self, keys: dict[Key, Any], response: Any, error_code: Callable[[Any], int]
    ) -> None:
        if response is NOT_SENT:
            self._round_ok = False
            for key in keys:
                self.ledger.not_sent(key)
            return
        ok = response is not None and error_code(response) == 0
        self._round_ok = self._round_ok and ok
        for key, value in keys.items():
            self.ledger.record(key, value, ok)

    def create_topic(self, n: int) -> None:
        name = f"pc-topic-{n:05d}"
        retention = str(RETENTION_BASE_MS + n)
        Req = m.CreateTopicsRequest
        topic = Req.CreatableTopic(
            name=name, num_partitions=1 + n % 3, replication_factor=1, assignments=[],
            configs=[Req.CreatableTopic.CreatableTopicConfig(name="retention.ms",
                                                             value=retention)],
        )  # fmt: skip
        response = self._call(m.ApiKey.CREATE_TOPICS, 5, Req(topics=[topic], timeout_ms=10_000))
        keys = {("topic", name): 1 + n % 3, ("config", name, "retention.ms"): retention}
        self._record(keys, response, lambda r: r.topics[0].error_code)

    def alter_configs(self, n: int) -> None:
        """The main topic's retention.ms and segment.bytes; and an earlier topic's."""
        changes = {TOPIC: {"retention.ms": str(RETENTION_BASE_MS + n),
                           "segment.bytes": str(SEGMENT_BYTES + (n % 5) * 8192)}}  # fmt: skip
        if n:
            changes[f"pc-topic-{self.rng.randrange(n):05d}"] = {
                "retention.ms": str(2 * RETENTION_BASE_MS + n)
            }
        Resource = m.IncrementalAlterConfigsRequest.AlterConfigsResource
        for topic, configs in changes.items():
            resource = Resource(
                resource_type=TOPIC_RESOURCE, resource_name=topic,
                configs=[Resource.AlterableConfig(name=k, config_operation=0, value=v)
                         for k, v in configs.items()],
            )  # fmt: skip
            body = m.IncrementalAlterConfigsRequest(resources=[resource], validate_only=False)
            response = self._call(m.ApiKey.INCREMENTAL_ALTER_CONFIGS, 1, body)
            keys: dict[Key, Any] = {("config", topic, k): v for k, v in configs.items()}
            self._record(keys, response, lambda r: r.responses[0].error_code)

    def commit_offsets(self, n: int) -> None:
        """OffsetCommit through confluent-kafka: commit(asynchronous=False)."""
        wanted = {p: n * 10 + p for p in range(PARTITIONS)}
        offsets = [TopicPartition(TOPIC, p, o) for p, o in wanted.items()]
        try:
            answered = self.consumer.commit(offsets=offsets, asynchronous=False) or []
        except KafkaException:
            answered = []
        ok = {tp.partition for tp in answered if tp.error is None}
        self._round_ok = self._round_ok and len(ok) == PARTITIONS
        for p, o in wanted.items():
            self.ledger.record(("offset", TOPIC, p), o, p in ok)

    def add_acl(self, n: int) -> None:
        """CreateAcls, built as ``trio-broker acls add`` builds it."""
        name, principal = f"pc-acl-{n:05d}", f"User:pc-{n}"
        creation = m.CreateAclsRequest.AclCreation(
            resource_type=AclResource.TOPIC, resource_name=name,
            resource_pattern_type=AclPattern.LITERAL, principal=principal, host="*",
            operation=AclOp.READ, permission_type=AclPermission.ALLOW,
        )  # fmt: skip
        body = m.CreateAclsRequest(creations=[creation])
        response = self._call(m.ApiKey.CREATE_ACLS, ACL_API_VERSION, body)
        key = ("acl", "TOPIC", name, "LITERAL", principal, "*", "READ", "ALLOW")
        self._record({key: True}, response, lambda r: r.results[0].error_code)

    def upsert_scram(self, n: int) -> None:
        """AlterUserScramCredentials: a few users, each changed again and again (both
        mechanisms, new iteration counts), salted here as a client does (KIP-554)."""
        user = f"pc-user-{n % 12:02d}"
        mechanism, digest = SCRAM[n % 2]
        iterations = 4096 + n % 12_000
        salt = self.rng.randbytes(16)
        salted = hashlib.pbkdf2_hmac(digest, b"password-%d" % n, salt, iterations)
        Upsertion = m.AlterUserScramCredentialsRequest.ScramCredentialUpsertion
        upsertion = Upsertion(name=user, mechanism=MECHANISM_IDS[mechanism],
                              iterations=iterations, salt=salt, salted_password=salted)  # fmt: skip
        body = m.AlterUserScramCredentialsRequest(deletions=[], upsertions=[upsertion])
        response = self._call(m.ApiKey.ALTER_USER_SCRAM_CREDENTIALS, 0, body)
        key = ("scram", user, mechanism.replace("-", "_"))
        self._record({key: iterations}, response, lambda r: r.results[0].error_code)


# ------------------------------------------------------------------------------ the checks


@attrs.define
class LogRead:
    """One full read of the topic: record occurrences by sequence number, and damage."""

    exact: dict[int, list[tuple[int, int]]] = attrs.field(factory=lambda: defaultdict(list))
    #: (partition, offset) -> seq of records whose key names ``seq`` but bytes differ.
    damaged: dict[tuple[int, int], int] = attrs.field(factory=dict)
    records: int = 0
    corrupt_records: int = 0
    corrupt_batches: int = 0
    offset_gaps: int = 0
    errors: list[str] = attrs.field(factory=list)


def _batch_crc_ok(batch: Any) -> bool:
    """CRC-32C of a v2 batch (attributes to the end), computed here, not by the broker's codec."""
    buf = bytes(batch.buf)
    return len(buf) >= 61 and crc32c.crc32c(buf[21:]) == struct.unpack_from(">I", buf, 17)[0]


def read_topic(conn: RawConnection, run: str, partitions: int) -> LogRead:
    out = LogRead()
    for partition in range(partitions):
        try:
            batches = conn.fetch_batches(TOPIC, partition)
        except (AssertionError, OSError, ValueError, RawConnection.Closed) as exc:
            out.errors.append(f"fetch {TOPIC}-{partition}: {exc!r}"[:300])
            continue
        expected = 0
        for batch in batches:
            if batch.base_offset != expected:
                out.offset_gaps += 1
            expected = batch.next_offset
            if not _batch_crc_ok(batch):
                out.corrupt_batches += 1
                out.corrupt_records += max(batch.record_count, 1)
                continue
            for record in batch.records():
                out.records += 1
                where = (partition, batch.offset_of(record))
                seq = key_seq(record.key)
                if seq is not None and (record.key, record.value) == record_bytes(run, seq):
                    out.exact[seq].append(where)
                    continue
                out.corrupt_records += 1
                if seq is not None:
                    out.damaged[where] = seq
    return out


@attrs.define
class Auditor:
    """Runs the checks and accumulates what they find into a PowerCutResult."""

    run: str
    ledger: Ledger
    result: PowerCutResult
    lost: set[int] = attrs.field(factory=set)
    changed: set[int] = attrs.field(factory=set)
    duplicated: set[int] = attrs.field(factory=set)
    topic_ids: dict[str, Any] = attrs.field(factory=dict)
    lost_keys: set[str] = attrs.field(factory=set)

    def note(self, where: str, text: str) -> None:
        if len(self.result.examples) < 40:
            self.result.examples.append(f"[{where}] {text}")

    def check(self, broker: ConfiguredBroker, admin: AdminClient,
              acked: dict[int, tuple[int, int]], where: str) -> None:  # fmt: skip
        topics = self.check_cluster(broker, where)
        if topics is not None:
            self._check_records(broker, acked, topics.get(TOPIC, (0, None))[0], where)
            self._check_metadata(admin, topics, where)

    def check_cluster(self, broker: ConfiguredBroker, where: str) -> dict[str, Any] | None:
        """Cluster id (one, ever) and topic ids; returns name -> (partitions, topic id)."""
        try:
            with broker.connect() as conn:
                meta = conn.metadata(topics=None, version=12)
        except (AssertionError, OSError, ValueError, RawConnection.Closed) as exc:
            self.result.check_errors.append(f"[{where}] Metadata: {exc!r}"[:300])
            return None
        if meta.cluster_id not in self.result.cluster_ids:
            if self.result.cluster_ids:
                self.note(where, f"cluster id changed to {meta.cluster_id}")
            self.result.cluster_ids.append(meta.cluster_id)
        topics = {t.name: (len(t.partitions), t.topic_id) for t in meta.topics if t.error_code == 0}
        for name, (_, topic_id) in topics.items():
            first = self.topic_ids.setdefault(name, topic_id)
            if first != topic_id:
                self.result.topic_id_changes.append(f"[{where}] {name}: {first} -> {topic_id}")
                self.topic_ids[name] = topic_id
        return topics

    def _check_records(self, broker: ConfiguredBroker, acked: dict[int, tuple[int, int]],
                       partitions: int, where: str) -> None:  # fmt: skip
        with broker.connect(timeout=60.0) as conn:
            read = read_topic(conn, self.run, partitions)
        self.result.check_errors += [f"[{where}] {e}" for e in read.errors]
        self.result.records_in_log = read.records
        self.result.corrupt_records += read.corrupt_records
        self.result.corrupt_batches += read.corrupt_batches
        self.result.offset_gaps += read.offset_gaps
        if read.corrupt_records or read.corrupt_batches:
            self.note(where, f"{read.corrupt_records} corrupt records, "
                             f"{read.corrupt_batches} bad-CRC batches served")  # fmt: skip
        damaged = set(read.damaged.values())
        for seq, at in acked.items():
            places = read.exact.get(seq)
            if places and at in places:
                continue
            if places or seq in damaged:
                if seq not in self.changed:
                    self.note(where, f"record {seq} acknowledged at {at}, found at {places}")
                self.changed.add(seq)
            else:
                if not self.lost:
                    self.note(where, f"record {seq} acknowledged at {at} is gone")
                self.lost.add(seq)
        for seq, places in read.exact.items():
            if len(places) > 1:
                if seq not in self.duplicated:
                    self.note(where, f"record {seq} appears {len(places)} times: {places}")
                self.duplicated.add(seq)
        self.result.lost = len(self.lost)
        self.result.changed = len(self.changed)
        self.result.duplicated = len(self.duplicated)

    def _check_metadata(self, admin: AdminClient, topics: dict[str, Any], where: str) -> None:
        observers: dict[str, Callable[[], Callable[[Key], Any]]] = {
            "topic": lambda: lambda key: topics.get(key[1], (ABSENT,))[0],
            "config": lambda: self._configs(admin, topics),
            "offset": lambda: self._offsets(admin),
            "acl": lambda: self._acls(admin),
            "scram": lambda: self._scram(admin),
        }
        for kind, observe in observers.items():
            for attempt in range(3):
                try:
                    observed = observe()
                    break
                except Exception as exc:  # no answer (yet): retried, then reported
                    if attempt == 2:
                        self.result.check_errors.append(f"[{where}] reading {kind}: {exc!r}"[:300])
                    time.sleep(0.5)
            else:
                continue
            for key, problem in self.ledger.check(kind, observed):
                self.result.metadata_lost.append(f"[{where}] {problem}")
                if repr(key) not in self.lost_keys:
                    self.note(where, problem)
                self.lost_keys.add(repr(key))
        self.result.metadata_lost_items = len(self.lost_keys)
        self.result.metadata_checks += 1

    def _configs(self, admin: AdminClient, topics: dict[str, Any]) -> Callable[[Key], Any]:
        names = sorted({k[1] for k in self.ledger.keys("config")} & set(topics))
        dynamic: dict[str, dict[str, str]] = {}
        if names:
            resources = [ConfigResource(ResourceType.TOPIC, name) for name in names]
            futures = admin.describe_configs(resources, request_timeout=REQUEST_TIMEOUT_S)
            for resource, future in futures.items():
                entries = future.result(timeout=RESULT_TIMEOUT_S)
                dynamic[resource.name] = {
                    k: e.value for k, e in entries.items()
                    if getattr(e.source, "value", e.source) == DYNAMIC_TOPIC_CONFIG
                }  # fmt: skip
        return lambda key: dynamic.get(key[1], {}).get(key[2], ABSENT)

    def _offsets(self, admin: AdminClient) -> Callable[[Key], Any]:
        request = ConsumerGroupTopicPartitions(
            GROUP, [TopicPartition(TOPIC, p) for p in range(PARTITIONS)]
        )
        futures = admin.list_consumer_group_offsets([request], request_timeout=REQUEST_TIMEOUT_S)
        answer = futures[GROUP].result(timeout=RESULT_TIMEOUT_S)
        committed = {
            (tp.topic, tp.partition): tp.offset
            for tp in answer.topic_partitions or []
            if tp.error is None and tp.offset >= 0
        }
        return lambda key: committed.get((key[1], key[2]), ABSENT)

    def _acls(self, admin: AdminClient) -> Callable[[Key], Any]:
        anything: Any = None  # a filter's None matches every name, principal and host
        everything = AclBindingFilter(ResourceType.ANY, anything, ResourcePatternType.ANY,
                                      anything, anything, AclOperation.ANY,
                                      AclPermissionType.ANY)  # fmt: skip
        bindings = admin.describe_acls(everything, request_timeout=REQUEST_TIMEOUT_S)
        present = {_acl_key(b) for b in bindings.result(timeout=RESULT_TIMEOUT_S)}
        return lambda key: True if key in present else ABSENT

    def _scram(self, admin: AdminClient) -> Callable[[Key], Any]:
        future = admin.describe_user_scram_credentials(request_timeout=REQUEST_TIMEOUT_S)
        assert isinstance(future, Future)
        iterations: dict[tuple[str, str], int] = {}
        for user, description in future.result(timeout=RESULT_TIMEOUT_S).items():
            for info in description.scram_credential_infos:
                iterations[(user, info.mechanism.name)] = info.iterations
        return lambda key: iterations.get((key[1], key[2]), ABSENT)


# ------------------------------------------------------------------------------ the loop


def _create_main_topic(admin: AdminClient, ledger: Ledger, deadline: float) -> None:
    """The topic the producer writes: CreateTopics, retried until acknowledged."""
    config = {"segment.bytes": str(SEGMENT_BYTES)}
    while True:
        futures = admin.create_topics(
            [NewTopic(TOPIC, PARTITIONS, 1, config=config)], request_timeout=REQUEST_TIMEOUT_S
        )
        if _answered(futures[TOPIC]):
            ledger.record(("topic", TOPIC), PARTITIONS, True)
            ledger.record(("config", TOPIC, "segment.bytes"), str(SEGMENT_BYTES), True)
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"could not create {TOPIC}")
        time.sleep(0.2)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _unsynced(fs: FaultFS) -> bool:
    return bool(fs.status().get("unsynced_bytes"))


def _freeze_with_unsynced(fs: FaultFS, pid: int, timeout: float) -> bool:
    """Stop the broker (SIGSTOP) at a moment when the mount holds un-synced file data, so
    that the kill -9 that follows leaves the cut something to drop, tear or garble.
    Bounded: after ``timeout`` seconds it gives up (the broker keeps running)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _unsynced(fs):
            continue
        os.kill(pid, signal.SIGSTOP)
        time.sleep(0.002)  # let a FUSE request already under way finish
        if _unsynced(fs):
            return True
        os.kill(pid, signal.SIGCONT)
    return False


def _admin(broker: ConfiguredBroker) -> AdminClient:
    """A new AdminClient for one check (one never sees a restart under a request)."""
    return AdminClient({**CLIENT_CONFIG, "bootstrap.servers": broker.bootstrap})


@contextlib.contextmanager
def _mounted(work_dir: Path, mode: str, seed: int) -> Iterator[FaultFS]:
    ok, why = fuse_available()
    if not ok:
        raise FuseUnavailable(f"FUSE unavailable: {why}")
    backing = work_dir / "backing"
    backing.mkdir(parents=True, exist_ok=True)
    fs = FaultFS(backing, work_dir / "mnt", work_dir / "faultfs-state", mode=mode, seed=seed)
    fs.mount()
    try:
        yield fs
    finally:
        fs.unmount()


def run_power_cut(
    work_dir: Path,
    cuts: int = 200,
    seed: int = 0,
    modes: Sequence[str] = ("drop",),
    uptime: tuple[float, float] = (0.5, 2.5),
    rate: float = 200.0,
    aim: float = 0.75,
    time_budget: float | None = None,
    launcher: Sequence[str] | None = None,
    broker_pythonpath: Path | None = None,
    stop_on_problem: bool = False,
    existing_data_dir: bool = False,
    log: Callable[[str], None] = print,
) -> PowerCutResult:
    """Run ``cuts`` kill -9 + power-cut cycles (fewer if ``time_budget`` seconds run out),
    checking everything after each restart and at the end.

    ``modes`` are used in turn, one per cut. A fraction ``aim`` of the kills waits (up to
    3 s past the random moment) for the mount to hold un-synced data, and freezes the broker
    then (SIGSTOP, then the kill), so that the cut has something to throw away; the others
    are blind. ``launcher`` / ``broker_pythonpath``: see
    :class:`PowerCutBroker`. ``stop_on_problem`` ends the loop after the first check that
    finds anything. The broker makes its data dir itself (a fresh install), unless
    ``existing_data_dir``: then it is made, durably, before the first start. Raises
    :class:`FuseUnavailable` if FUSE cannot work here.
    """
    for mode in modes:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
    rng = random.Random(seed)
    run = f"{seed:x}{rng.randrange(16**6):06x}"
    result = PowerCutResult()
    ledger = Ledger()
    auditor = Auditor(run, ledger, result)
    started = time.monotonic()
    with _mounted(work_dir, modes[0], seed) as fs:
        broker = PowerCutBroker(
            fs.mountpoint / "data", work_dir, BROKER_CONFIG, launcher, broker_pythonpath
        )
        producer: LoadProducer | None = None
        worker: MetadataWorker | None = None
        if existing_data_dir:
            broker.data_dir.mkdir()
            _fsync_dir(fs.mountpoint)
        try:
            broker.start()
            _create_main_topic(_admin(broker), ledger, time.monotonic() + 30)
            auditor.check_cluster(broker, "start")  # the cluster id before any cut
            producer = LoadProducer(broker.bootstrap, run, rate)
            worker = MetadataWorker(broker.bootstrap, ledger, seed)
            producer.start()
            worker.start()
            for cut in range(1, cuts + 1):
                if time_budget is not None and time.monotonic() - started > time_budget:
                    result.stopped_early = f"time budget of {time_budget:.0f} s used"
                    break
                rounds, acks = worker.acked_rounds, len(producer.acked)
                time.sleep(rng.uniform(*uptime))
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline and (
                    worker.acked_rounds == rounds or len(producer.acked) == acks
                ):
                    time.sleep(0.02)  # each incarnation: some records and metadata acknowledged
                aimed = rng.random() < aim and broker.running
                aimed = aimed and _freeze_with_unsynced(fs, broker.pid, 3.0)
                if not broker.running:
                    result.start_failures.append(f"before cut {cut}: the broker died by itself")
                    break
                broker.kill9()
                mode = modes[(cut - 1) % len(modes)]
                report = fs.power_cut(mode=mode)
                summary = CutSummary.of(cut, report, aimed)
                result.cuts.append(summary)
                result.modes[mode] = result.modes.get(mode, 0) + 1
                try:
                    broker.start()
                except AssertionError as exc:
                    result.start_failures.append(f"after cut {cut}: {exc}"[-2000:])
                    result.cycles = cut
                    break
                paused = worker.pause()
                if not paused:
                    result.check_errors.append(f"[cut {cut}] metadata worker did not pause")
                before = len(result.problems())
                auditor.check(broker, _admin(broker), producer.snapshot(), f"cut {cut}")
                worker.resume()
                result.cycles = cut
                log(
                    f"cut {cut}/{cuts} {summary.line()}; acknowledged {len(producer.acked)} "
                    f"lost {result.lost} changed {result.changed} duplicated "
                    f"{result.duplicated} cluster ids {len(result.cluster_ids)} metadata "
                    f"lost/changed {result.metadata_lost_items}"
                )
                if stop_on_problem and len(result.problems()) > before:
                    result.stopped_early = f"problem found after cut {cut}"
                    break
            if broker.running and not result.stopped_early.startswith("problem"):
                producer.finish(timeout=60)
                worker.finish()
                auditor.check(broker, _admin(broker), producer.snapshot(), "end")
        finally:
            if worker is not None:
                worker.finish()
            if producer is not None:
                producer.abandon()
                with producer.lock:
                    result.records_sent = producer.sent
                    result.records_acked = len(producer.acked)
                    result.records_failed = len(producer.failed)
                    result.fatal_errors = list(producer.fatal)
                    result.producer_errors = dict(producer.errors)
            if worker is not None:
                result.check_errors += [f"metadata worker: {e}" for e in worker.errors]
            result.metadata_acked = dict(ledger.acked)
            result.metadata_unknown = dict(ledger.unknown)
            result.metadata_not_sent = dict(ledger.refused)
            _stop_broker(broker, result)
            result.seconds = time.monotonic() - started
    return result


def _stop_broker(broker: PowerCutBroker, result: PowerCutResult) -> None:
    """SIGTERM (exit code 0 expected); a broker that hangs or died is reported."""
    if broker.running:
        broker.down_on_purpose = True
        proc = broker.proc
        assert proc is not None
        proc.terminate()
        try:
            code = proc.wait(30)
        except Exception:
            broker.kill9()
            result.check_errors.append("broker ignored SIGTERM for 30 s; killed")
            return
        broker._join_drainer()
        if code != 0:
            result.check_errors.append(f"broker exited with {code} on SIGTERM")
    elif broker.proc is not None and not broker.down_on_purpose:
        result.start_failures.append(f"broker died by itself ({broker.proc.returncode})")


# ------------------------------------------------------------------------------ CLI


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--cuts", type=int, default=200)
    parser.add_argument(
        "--mode", default="drop", choices=[*MODES, "mixed"],
        help="what a cut does to un-synced data; mixed: drop, tear, garble in turn",
    )  # fmt: skip
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument("--rate", type=float, default=200.0, help="records/s (default 200)")
    parser.add_argument(
        "--uptime", type=float, nargs=2, default=(0.5, 2.5), metavar=("MIN", "MAX"),
        help="seconds between a restart and the next kill, drawn uniformly (default 0.5 2.5)",
    )  # fmt: skip
    parser.add_argument("--aim", type=float, default=0.75,
                        help="fraction of kills timed to hit un-synced data (default 0.75)")  # fmt: skip
    parser.add_argument("--time-budget", type=float, help="stop after this many seconds")
    parser.add_argument("--no-fsync", action="store_true",
                        help="the planted bug: the broker's fsync/fdatasync are no-ops")  # fmt: skip
    parser.add_argument("--broker-pythonpath", type=Path, metavar="DIR",
                        help="import trio_broker from DIR (another checkout) for the broker")  # fmt: skip
    parser.add_argument("--stop-on-problem", action="store_true")
    parser.add_argument("--existing-data-dir", action="store_true",
                        help="make the data dir (durably) before the first start")  # fmt: skip
    parser.add_argument("--json", type=Path, help="write the numbers here")
    parser.add_argument("--keep", type=Path, metavar="DIR",
                        help="work in DIR (backing dir, broker log, faultfs log) and keep it")  # fmt: skip
    args = parser.parse_args(argv)
    modes = ("drop", "tear", "garble") if args.mode == "mixed" else (args.mode,)
    print(f"power-cut loop: {args.cuts} cuts, mode {args.mode}, seed {args.seed}", flush=True)
    with tempfile.TemporaryDirectory(prefix="power-cut-") as tmp:
        work_dir = Path(tmp) if args.keep is None else args.keep
        work_dir.mkdir(parents=True, exist_ok=True)
        try:
            result = run_power_cut(
                work_dir, cuts=args.cuts, seed=args.seed, modes=modes, uptime=args.uptime,
                rate=args.rate, aim=args.aim, time_budget=args.time_budget,
                launcher=NOFSYNC_LAUNCHER if args.no_fsync else None,
                broker_pythonpath=args.broker_pythonpath,
                stop_on_problem=args.stop_on_problem, existing_data_dir=args.existing_data_dir,
                log=lambda s: print(s, flush=True),
            )  # fmt: skip
        except (FuseUnavailable, FaultFSError) as exc:
            print(exc, file=sys.stderr)
            return 2
    print(result.summary())
    if args.json:
        args.json.write_text(json.dumps(attrs.asdict(result), indent=2, default=str))
    return 1 if result.problems() else 0


if __name__ == "__main__":
    sys.exit(main())
