"""Compaction keeps what a producer state rebuilt from the log needs (Kafka's LogCleaner).

Kafka's cleaner retains, for every active producer, the batch holding its last data
offset (its last sequence), and for a producer with only markers in the partition its
markers of the current epoch (their epoch fences the old one); other markers go
``delete.retention.ms`` after their transaction's data is gone. A real ``trio-broker
serve`` process compacts a topic whose keys a committed transaction and a fencing
abort touched; after a kill -9 with the producer snapshots removed (the state rebuilt
from the log alone) the transactional producer's next sequence is still checked and
the fenced epoch still refused. Only active producers' batches are kept so: one whose
last write is older than ``producer.id.expiration.ms`` (1 day) loses its superseded
records at the next clean, as in Kafka (``lastRecordsOfActiveProducers``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import BrokerProcess, RawConnection, running_broker
from tests.e2e.test_compaction import CLEANER_EVERY_100_MS
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.protocol.records import build_batch

pytestmark = pytest.mark.timeout(300)

TOPIC = "compacted"
DEADLINE_S = 60.0
TOPIC_CONFIGS = {
    "cleanup.policy": "compact",
    "segment.bytes": "1024",
    "min.cleanable.dirty.ratio": "0",
    "delete.retention.ms": "100",
}


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    """A broker whose cleaner looks for work every 100 ms."""
    with running_broker(tmp_path / "data", properties=CLEANER_EVERY_100_MS) as process:
        yield process


def create_topic(conn: RawConnection) -> None:
    conn.create_topic(TOPIC, TOPIC_CONFIGS)


def until_none(call: object, *args: object) -> object:
    """Retry while the coordinator answers CONCURRENT_TRANSACTIONS (a transaction ending)."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        answer = call(*args)  # type: ignore[operator]
        code = answer[0] if isinstance(answer, tuple) else answer
        if code != ErrorCode.CONCURRENT_TRANSACTIONS:
            return answer
        assert time.monotonic() < deadline, "the coordinator stayed busy"


def init_producer_id(conn: RawConnection, tid: str) -> tuple[int, int, int]:
    return conn.init_producer_id(tid)


def add_partition(conn: RawConnection, tid: str, pid: int, epoch: int) -> int:
    return conn.add_partition_to_txn(tid, pid, epoch, TOPIC)


def end_txn(conn: RawConnection, tid: str, pid: int, epoch: int, commit: bool) -> int:
    body = m.EndTxnRequest(transactional_id=tid, producer_id=pid, producer_epoch=epoch,
                           committed=commit)  # fmt: skip
    return int(conn.request(m.ApiKey.END_TXN, 3, body).error_code)


def produce(conn: RawConnection, raw: bytes, tid: str | None = None) -> tuple[int, int]:
    part = conn.produce(TOPIC, raw, transactional_id=tid)
    return int(part.error_code), int(part.base_offset)


def txn_batch(pid: int, epoch: int, seq: int, key: bytes) -> bytes:
    return bytes(build_batch([(key, b"in-txn-%d" % seq)], producer_id=pid,
                             producer_epoch=epoch, base_sequence=seq,
                             is_transactional=True))  # fmt: skip


def plain(key: bytes, value: bytes) -> bytes:
    return bytes(build_batch([(key, value)]))


def compact(conn: RawConnection) -> None:
    """Keyed writes that roll segments until the cleaner has made a pass (the filler
    key's older values go); a pass starts at the log's first segment."""
    deadline = time.monotonic() + DEADLINE_S
    written = 0
    while True:
        for _ in range(8):
            assert produce(conn, plain(b"filler", b"f" * 200))[0] == ErrorCode.NONE
            written += 1
        fillers = [b for b in conn.fetch_batches(TOPIC) if b.producer_id < 0]
        if len(fillers) < written:
            return
        assert time.monotonic() < deadline, "the cleaner never compacted the topic"


def crash_without_snapshots(broker: BrokerProcess) -> None:
    """kill -9, and the producer state snapshots gone: rebuilt from the log alone."""
    broker.kill9()
    for path in (broker.data_dir / f"{TOPIC}-0").iterdir():
        if path.suffix == ".snapshot" or path.name == "producer_state.json":
            path.unlink()
    broker.start()


def test_a_committed_producers_last_sequence_outlives_compaction(broker: BrokerProcess) -> None:
    tid = "compacted-txn"
    with broker.connect() as conn:
        create_topic(conn)
        code, pid, epoch = init_producer_id(conn, tid)
        assert code == ErrorCode.NONE
        assert add_partition(conn, tid, pid, epoch) == ErrorCode.NONE
        assert produce(conn, txn_batch(pid, epoch, 0, b"k"), tid) == (ErrorCode.NONE, 0)
        assert until_none(end_txn, conn, tid, pid, epoch, True) == ErrorCode.NONE
        assert produce(conn, plain(b"k", b"newer"))[0] == ErrorCode.NONE  # supersedes it
        compact(conn)

    crash_without_snapshots(broker)

    with broker.connect() as conn:
        assert until_none(add_partition, conn, tid, pid, epoch) == ErrorCode.NONE
        # The batch with its last sequence (0) is still in the log: a gap is refused.
        code, _ = produce(conn, txn_batch(pid, epoch, 5, b"k"), tid)
        assert code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
        assert produce(conn, txn_batch(pid, epoch, 1, b"k"), tid)[0] == ErrorCode.NONE
        assert until_none(end_txn, conn, tid, pid, epoch, False) == ErrorCode.NONE


def test_a_fencing_marker_outlives_compaction(broker: BrokerProcess) -> None:
    tid = "fenced-in-compacted"
    with broker.connect() as conn:
        create_topic(conn)
        code, pid, old_epoch = init_producer_id(conn, tid)
        assert code == ErrorCode.NONE
        assert add_partition(conn, tid, pid, old_epoch) == ErrorCode.NONE
        # A new instance fences the old one: an abort marker at old_epoch + 1 is all the
        # partition ever has of this producer.
        assert until_none(init_producer_id, conn, tid) == (ErrorCode.NONE, pid, old_epoch + 2)
        compact(conn)

    crash_without_snapshots(broker)

    with broker.connect() as conn:
        stale = bytes(build_batch([(b"k", b"zombie")], producer_id=pid,
                                  producer_epoch=old_epoch, base_sequence=0))  # fmt: skip
        assert produce(conn, stale)[0] == ErrorCode.INVALID_PRODUCER_EPOCH


def idempotent_batch(pid: int, key: bytes, timestamp_ms: int) -> bytes:
    return bytes(build_batch([(key, b"idempotent")], producer_id=pid, producer_epoch=0,
                             base_sequence=0, base_timestamp=timestamp_ms))  # fmt: skip


def test_only_active_producers_keep_their_last_batch(broker: BrokerProcess) -> None:
    now = int(time.time() * 1000)
    with broker.connect() as conn:
        create_topic(conn)
        pids = []
        for _ in range(2):
            body = m.InitProducerIdRequest(transactional_id=None, transaction_timeout_ms=60_000,
                                           producer_id=-1, producer_epoch=-1)  # fmt: skip
            answer = conn.request(m.ApiKey.INIT_PRODUCER_ID, 4, body)
            assert answer.error_code == ErrorCode.NONE
            pids.append(answer.producer_id)
        active, expired = pids
        # Its only write is two days old: past producer.id.expiration.ms (1 day).
        assert produce(conn, idempotent_batch(expired, b"e", now - 2 * 86_400_000))[0] == 0
        assert produce(conn, idempotent_batch(active, b"a", now))[0] == 0
        for key in (b"e", b"a"):  # both records superseded
            assert produce(conn, plain(key, b"newer"))[0] == ErrorCode.NONE
        compact(conn)
        kept = {b.producer_id for b in conn.fetch_batches(TOPIC)}
    # The active producer's last batch holds its last sequence: it stays. The expired
    # one's state is gone, and so is its record.
    assert active in kept
    assert expired not in kept
