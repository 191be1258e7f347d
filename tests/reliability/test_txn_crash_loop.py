"""Transactions under kill -9: a crash loop with transactional producers, then an audit.

Two confluent-kafka transactional producers (each its own ``transactional.id``) write
transactions of ``RECORDS_PER_TXN`` records over the 3 partitions of one topic,
committing some and aborting others (a seeded choice), while the broker subprocess
is killed with SIGKILL at seeded random moments and restarted on the same port and
data dir. The producers handle errors as librdkafka's documentation says: a retriable
error repeats the call, an abortable one (``txn_requires_abort``) aborts the
transaction, a fatal one replaces the producer by a new instance with the same
``transactional.id`` (whose ``init_transactions`` fences the old epoch and ends its
open transaction).

Every transaction is recorded with its outcome as the application saw it:

- ``committed``: ``commit_transaction()`` returned;
- ``aborted``: ``commit_transaction()`` was never called (whether
  ``abort_transaction()`` returned or not, nothing can commit it);
- ``unknown``: ``commit_transaction()`` was called and raised; the broker may have
  committed it or not.

At the end a fresh instance per id runs ``init_transactions`` (ending anything left
open), then a read_committed consumer reads every partition from the beginning. The
audit: every committed transaction is visible completely, no record of an aborted one
is visible, an unknown one is all or nothing, no record twice, and within a
transaction each partition's records are in produce order. A read_uncommitted read
must contain every record that read_committed returned.

No timing is asserted; every wait is bounded. For longer runs set
``TXN_CRASH_KILLS`` and ``TXN_CRASH_SEED`` (defaults 6 and 20), e.g.
``TXN_CRASH_KILLS=20 TXN_CRASH_SEED=7 pytest -s tests/reliability/test_txn_crash_loop.py``.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import attrs
import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from tests.reliability.conftest import BrokerFactory, ConfiguredBroker

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(420)]

TOPIC = "txn-crash-loop"
PARTITIONS = 3
RECORDS_PER_TXN = 20
TRANSACTIONAL_IDS = ("txn-crash-a", "txn-crash-b")
KILLS = int(os.environ.get("TXN_CRASH_KILLS", "6"))
SEED = int(os.environ.get("TXN_CRASH_SEED", "20"))
#: Seconds the broker stays up between kills, and down after one.
UPTIME_S = (2.0, 5.0)
DOWNTIME_S = (0.0, 0.5)
#: Some kills keep the broker down longer than the producers' message timeout, so
#: that deliveries fail and the abort / new-instance paths run, not only retries.
LONG_DOWNTIME_S = (4.0, 6.0)
LONG_DOWNTIME_SHARE = 0.35
#: Share of transactions the application means to commit.
COMMIT_SHARE = 0.6
#: Bounds on each client call (seconds) and on repeats of retriable errors.
CALL_TIMEOUT_S = 30.0
RETRIES = 6

BROKER_CONFIG = {
    "num.partitions": PARTITIONS,
    # Transactions left open by a replaced producer end within seconds, not minutes.
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": 1000,
}


def producer_settings(bootstrap: str, transactional_id: str) -> dict[str, Any]:
    return {
        "bootstrap.servers": bootstrap,
        "transactional.id": transactional_id,
        "transaction.timeout.ms": 20_000,
        "message.timeout.ms": 3_000,
        "socket.timeout.ms": 3_000,
        "retry.backoff.ms": 50,
        "reconnect.backoff.ms": 50,
        "reconnect.backoff.max.ms": 500,
        "linger.ms": 5,
        "log_level": 2,  # connection-refused noise during the kills
    }


@attrs.define
class Txn:
    """One transaction as the application saw it."""

    transactional_id: str
    number: int
    meant_to_commit: bool
    #: "committed", "aborted" or "unknown" (see the module docstring).
    outcome: str = "aborted"
    #: Whether abort_transaction() returned (for the report only).
    abort_returned: bool = False

    def value(self, index: int) -> bytes:
        return f"{self.transactional_id}:{self.number}:{index}".encode()


def _error(exc: KafkaException) -> KafkaError:
    error = exc.args[0]
    assert isinstance(error, KafkaError), exc
    return error


class TxnProducerThread(threading.Thread):
    """Runs transactions for one transactional.id until told to stop."""

    def __init__(self, bootstrap: str, transactional_id: str, seed: int) -> None:
        super().__init__(name=f"producer-{transactional_id}", daemon=True)
        self.bootstrap = bootstrap
        self.transactional_id = transactional_id
        self.rng = random.Random(seed)
        self.stop = threading.Event()
        self.txns: list[Txn] = []
        self.instances = 0
        self.errors: Counter[str] = Counter()
        #: Set when the thread could not go on (no producer would initialise).
        self.gave_up: str | None = None
        self.producer: Producer | None = None

    def finished(self) -> int:
        """Transactions that ended: committed, or their abort returned."""
        return sum(1 for txn in list(self.txns) if txn.outcome == "committed" or txn.abort_returned)

    # -- librdkafka's error handling -------------------------------------------

    def _note(self, where: str, exc: KafkaException) -> KafkaError:
        error = _error(exc)
        kind = (
            "fatal"
            if error.fatal()
            else "abortable"
            if error.txn_requires_abort()
            else "retriable"
            if error.retriable()
            else "other"
        )
        self.errors[f"{where}:{kind}"] += 1
        return error

    def _new_producer(self) -> Producer:
        """A new instance with the same transactional.id, initialised (retries bounded)."""
        for _ in range(RETRIES):
            producer = Producer(producer_settings(self.bootstrap, self.transactional_id))
            self.instances += 1
            for _ in range(RETRIES):
                try:
                    producer.init_transactions(CALL_TIMEOUT_S)
                    return producer
                except KafkaException as exc:
                    error = self._note("init", exc)
                    if error.fatal():
                        break  # this instance is done; make another
                    time.sleep(0.2)
        raise RuntimeError(f"{self.transactional_id}: no producer would initialise")

    def _retry(self, where: str, call: Any) -> None:
        """``call(timeout)``, repeated while it raises a retriable error."""
        for attempt in range(RETRIES):
            try:
                call(CALL_TIMEOUT_S)
                return
            except KafkaException as exc:
                error = self._note(where, exc)
                if not error.retriable() or error.fatal() or error.txn_requires_abort():
                    raise
                if attempt == RETRIES - 1:
                    raise
                time.sleep(0.2)

    def _produce(self, producer: Producer, value: bytes, partition: int) -> None:
        for _ in range(1000):
            try:
                producer.produce(TOPIC, value, partition=partition)
                producer.poll(0)
                return
            except BufferError:
                producer.poll(0.1)
        raise AssertionError("librdkafka's queue stayed full")

    def _one_transaction(self, producer: Producer, txn: Txn) -> None:
        producer.begin_transaction()
        for index in range(RECORDS_PER_TXN):
            self._produce(producer, txn.value(index), index % PARTITIONS)
        if txn.meant_to_commit:
            txn.outcome = "unknown"  # from the first EndTxn on, the broker may commit it
            self._retry("commit", producer.commit_transaction)
            txn.outcome = "committed"
        else:
            # Deliver first, so that the aborted records are in the log (abort_transaction
            # alone would drop the unsent ones in the client) and the filter is tested.
            producer.flush(CALL_TIMEOUT_S)
            self._retry("abort", producer.abort_transaction)
            txn.abort_returned = True

    def run(self) -> None:
        try:
            self.producer = self._new_producer()
            number = 0
            while not self.stop.is_set():
                txn = Txn(self.transactional_id, number, self.rng.random() < COMMIT_SHARE)
                number += 1
                self.txns.append(txn)
                try:
                    self._one_transaction(self.producer, txn)
                except KafkaException as exc:
                    error = _error(exc)
                    if not error.fatal():
                        try:  # abortable, or retriable but retried out: abort
                            self._retry("abort-after-error", self.producer.abort_transaction)
                            txn.abort_returned = True
                            continue
                        except KafkaException as abort_exc:
                            if not _error(abort_exc).fatal():
                                self.errors["abort-after-error:gave-up"] += 1
                    # Fatal (or the abort would not go through): a new instance
                    # fences this one and ends its open transaction.
                    self.producer = self._new_producer()
        except Exception as exc:  # reported by the test, never swallowed
            self.gave_up = f"{type(exc).__name__}: {exc}"


def fence_and_close(bootstrap: str, transactional_id: str) -> None:
    """A new instance's init_transactions ends whatever the id left open."""
    producer = Producer(producer_settings(bootstrap, transactional_id))
    for attempt in range(RETRIES):
        try:
            producer.init_transactions(CALL_TIMEOUT_S)
            break
        except KafkaException:
            if attempt == RETRIES - 1:
                raise
            time.sleep(0.5)
    producer.flush(CALL_TIMEOUT_S)


@attrs.frozen
class Seen:
    """One record as read back."""

    transactional_id: str
    number: int
    index: int
    partition: int
    offset: int


def read_all(bootstrap: str, isolation: str, deadline_s: float = 120.0) -> list[Seen]:
    """Every record of the topic, from the beginning to the end of each partition."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"audit-{isolation}",
            "isolation.level": isolation,
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
            "log_level": 2,
        }
    )
    seen: list[Seen] = []
    try:
        consumer.assign([TopicPartition(TOPIC, p, 0) for p in range(PARTITIONS)])
        at_end: set[int] = set()
        deadline = time.monotonic() + deadline_s
        while len(at_end) < PARTITIONS:
            assert time.monotonic() < deadline, f"{isolation} read did not reach the end"
            message = consumer.poll(1.0)
            if message is None:
                continue
            error = message.error()
            if error is not None:
                assert error.code() == KafkaError._PARTITION_EOF, error
                at_end.add(message.partition())
                continue
            at_end.discard(message.partition())
            name, number, index = message.value().decode().split(":")
            seen.append(Seen(name, int(number), int(index), message.partition(), message.offset()))
    finally:
        consumer.close()
    return seen


def audit(txns: list[Txn], committed_view: list[Seen], uncommitted_view: list[Seen]) -> list[str]:
    """Every violation of the transactional guarantees, as readable lines."""
    problems: list[str] = []
    by_key = {(t.transactional_id, t.number): t for t in txns}
    copies = Counter((s.transactional_id, s.number, s.index) for s in committed_view)
    problems += [f"record {key} read {n} times" for key, n in copies.items() if n > 1]
    visible: dict[tuple[str, int], list[Seen]] = defaultdict(list)
    for record in committed_view:
        visible[(record.transactional_id, record.number)].append(record)
    for key, records in visible.items():
        txn = by_key.get(key)
        if txn is None:
            problems.append(f"transaction {key} was never run, yet visible")
            continue
        indexes = {r.index for r in records}
        if txn.outcome == "aborted":
            problems.append(f"aborted transaction {key}: {len(indexes)} records visible")
        elif len(indexes) != RECORDS_PER_TXN:
            problems.append(
                f"{txn.outcome} transaction {key} visible partially: "
                f"{len(indexes)}/{RECORDS_PER_TXN} records"
            )
        for partition in range(PARTITIONS):
            in_offset_order = [
                r.index for r in sorted(records, key=lambda r: r.offset) if r.partition == partition
            ]
            if in_offset_order != sorted(in_offset_order):
                problems.append(f"{key} partition {partition} out of order: {in_offset_order}")
            wrong = [i for i in in_offset_order if i % PARTITIONS != partition]
            if wrong:
                problems.append(f"{key}: records {wrong} in partition {partition}")
    for txn in txns:
        if txn.outcome == "committed" and (txn.transactional_id, txn.number) not in visible:
            problems.append(f"committed transaction {txn.transactional_id}:{txn.number} lost")
    uncommitted = {(s.transactional_id, s.number, s.index) for s in uncommitted_view}
    missing = [key for key in copies if key not in uncommitted]
    if missing:
        problems.append(f"{len(missing)} committed records missing from read_uncommitted")
    return problems


def test_transactions_survive_kill_9_loop(make_broker: BrokerFactory, tmp_path: Path) -> None:
    rng = random.Random(SEED)
    broker: ConfiguredBroker = make_broker(config=BROKER_CONFIG)
    with broker.connect() as conn:
        conn.metadata([TOPIC])  # auto-created with PARTITIONS partitions
    producers = [
        TxnProducerThread(broker.bootstrap, tid, SEED * 100 + n)
        for n, tid in enumerate(TRANSACTIONAL_IDS)
    ]
    for thread in producers:
        thread.start()
    started = time.monotonic()
    for _ in range(KILLS):
        time.sleep(rng.uniform(*UPTIME_S))
        broker.kill9()
        long_down = rng.random() < LONG_DOWNTIME_SHARE
        time.sleep(rng.uniform(*(LONG_DOWNTIME_S if long_down else DOWNTIME_S)))
        broker.start()
    # Transactions after the last restart: every producer finishes a few more.
    after_restart = [thread.finished() for thread in producers]
    deadline = time.monotonic() + 120
    while not all(
        t.finished() >= n + 3 or t.gave_up or not t.is_alive()
        for t, n in zip(producers, after_restart, strict=True)
    ):
        assert time.monotonic() < deadline, "no transactions after the last restart"
        time.sleep(0.1)  # polling the producer threads, bounded by the deadline
    for thread in producers:
        thread.stop.set()
    for thread in producers:
        thread.join(4 * CALL_TIMEOUT_S)
        assert not thread.is_alive(), f"{thread.name} did not stop"
    loop_seconds = time.monotonic() - started
    for tid in TRANSACTIONAL_IDS:
        fence_and_close(broker.bootstrap, tid)

    committed_view = read_all(broker.bootstrap, "read_committed")
    uncommitted_view = read_all(broker.bootstrap, "read_uncommitted")
    txns = [txn for thread in producers for txn in thread.txns]
    outcomes = Counter(txn.outcome for txn in txns)
    visible_unknown = {(s.transactional_id, s.number) for s in committed_view} & {
        (t.transactional_id, t.number) for t in txns if t.outcome == "unknown"
    }
    print(
        f"{KILLS} kills in {loop_seconds:.1f}s; transactions {dict(outcomes)}; "
        f"unknown ones visible: {len(visible_unknown)}; "
        f"records read_committed {len(committed_view)}, read_uncommitted "
        f"{len(uncommitted_view)}; producer instances "
        f"{[t.instances for t in producers]}; errors "
        f"{[dict(t.errors) for t in producers]}"
    )
    for thread in producers:
        assert thread.gave_up is None, f"{thread.name}: {thread.gave_up}"
    problems = audit(txns, committed_view, uncommitted_view)
    assert not problems, "\n".join(problems[:50])
    # The run must have exercised both outcomes, across the kills, and aborted
    # records must have reached the log (read_uncommitted sees them).
    assert outcomes["committed"] >= 20, outcomes
    assert outcomes["aborted"] >= 10, outcomes
    assert len(uncommitted_view) > len(committed_view), "no aborted record reached the log"
    assert broker.starts == KILLS + 1
    assert "Traceback" not in broker.log_text(), broker.log_tail()


# -------------------------------------------------------------- the audit itself


def _view(txn: Txn, indexes: range, first_offset: int = 0) -> list[Seen]:
    return [
        Seen(txn.transactional_id, txn.number, i, i % PARTITIONS, first_offset + i) for i in indexes
    ]


def test_audit_accepts_a_clean_run() -> None:
    committed = Txn("a", 0, True, "committed")
    aborted = Txn("a", 1, False, "aborted")
    unknown_in = Txn("a", 2, True, "unknown")
    unknown_out = Txn("a", 3, True, "unknown")
    view = _view(committed, range(RECORDS_PER_TXN)) + _view(unknown_in, range(RECORDS_PER_TXN), 100)
    everything = view + _view(aborted, range(RECORDS_PER_TXN), 200)
    assert audit([committed, aborted, unknown_in, unknown_out], view, everything) == []


def test_audit_reports_each_kind_of_violation() -> None:
    lost = Txn("a", 0, True, "committed")
    aborted = Txn("a", 1, False, "aborted")
    partial = Txn("a", 2, True, "unknown")
    twice = Txn("a", 3, True, "committed")
    reordered = Txn("a", 4, True, "committed")
    swapped = _view(reordered, range(RECORDS_PER_TXN), 400)
    swapped[0], swapped[3] = (
        attrs.evolve(swapped[0], offset=swapped[3].offset),
        attrs.evolve(swapped[3], offset=swapped[0].offset),
    )
    view = (
        _view(aborted, range(1), 100)
        + _view(partial, range(RECORDS_PER_TXN - 1), 200)
        + _view(twice, range(RECORDS_PER_TXN), 300)
        + _view(twice, range(1), 350)
        + swapped
    )
    problems = audit([lost, aborted, partial, twice, reordered], view, [])
    text = "\n".join(problems)
    assert "committed transaction a:0 lost" in text
    assert "aborted transaction ('a', 1)" in text
    assert "unknown transaction ('a', 2) visible partially" in text
    assert "record ('a', 3, 0) read 2 times" in text
    assert "('a', 4) partition 0 out of order" in text
    assert "committed records missing from read_uncommitted" in text
