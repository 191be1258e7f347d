"""Log compaction end to end: confluent-kafka writes, the broker's cleaner compacts, a
consumer from offset 0 reads back the latest value of every key at its original offset.

Issue #20's "done when": 1,000 updates of 50 keys read back, after cleaning, as the 50
latest values (tombstoned keys gone after delete.retention.ms) with their offsets.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka import TopicPartition as CTopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.e2e.conftest import BrokerProcess, running_broker
from trio_broker.protocol.errors import TruncatedError
from trio_broker.protocol.records import iter_batches

KEYS = 50
UPDATES = 1000
TOMBSTONED = {3, 17, 29, 41, 48}
DELETE_RETENTION_MS = 3000
#: Bounds every wait of the test.
DEADLINE_S = 60.0


#: The cleaner looks for work every 100 ms.
CLEANER_EVERY_100_MS = "log.cleaner.backoff.ms=100\n"


@pytest.fixture
def cleaner_broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    with running_broker(tmp_path / "data", properties=CLEANER_EVERY_100_MS) as broker:
        yield broker


def read_from_start(bootstrap: str, topic: str) -> list[tuple[int, bytes, bytes | None, int]]:
    """(offset, key, value, timestamp) of every record a consumer from offset 0 gets."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{random.random()}",
            "enable.auto.commit": False,
            "enable.partition.eof": False,
        }
    )
    try:
        consumer.assign([CTopicPartition(topic, 0, 0)])
        rows: list[tuple[int, bytes, bytes | None, int]] = []
        empty_polls = 0
        deadline = time.monotonic() + 60
        while empty_polls < 3 and time.monotonic() < deadline:
            messages = consumer.consume(500, timeout=0.5)
            if not messages:
                empty_polls += 1
                continue
            empty_polls = 0
            for msg in messages:
                assert msg.error() is None, msg.error()
                rows.append((msg.offset(), msg.key(), msg.value(), msg.timestamp()[1]))
        return rows
    finally:
        consumer.close()


def read_with_kafka_python(
    bootstrap: str, topic: str
) -> list[tuple[int, bytes, bytes | None, int]]:
    """The same read with kafka-python (its own record-batch decoder)."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, consumer_timeout_ms=2000
    )
    try:
        partition = TopicPartition(topic, 0)
        consumer.assign([partition])
        consumer.seek(partition, 0)
        return [(m.offset, m.key, m.value, m.timestamp) for m in consumer]
    finally:
        consumer.close()


def test_compacted_topic_reads_back_latest_values_at_their_offsets(
    cleaner_broker: BrokerProcess,
) -> None:
    bootstrap = cleaner_broker.bootstrap
    topic = "compacted"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    configs = {
        "cleanup.policy": "compact",
        "segment.bytes": "8192",  # many segments
        "segment.ms": "1500",  # the cleaner rolls the idle active segment after this
        "delete.retention.ms": str(DELETE_RETENTION_MS),
        "min.cleanable.dirty.ratio": "0.01",
    }
    for future in admin.create_topics([NewTopic(topic, 1, 1, config=configs)]).values():
        future.result(timeout=60)

    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 2, "batch.num.messages": 20, "acks": "all"}
    )
    rng = random.Random(20)
    written: dict[bytes, tuple[int, bytes | None, int]] = {}  # key -> latest (offset, value, ts)
    base_ts = int(time.time() * 1000) - 60_000
    order = [i % KEYS for i in range(UPDATES)]
    rng.shuffle(order)
    # Every key gets updated at least once; the tombstoned keys end with a tombstone.
    last_index = {k: max(i for i, kk in enumerate(order) if kk == k) for k in range(KEYS)}

    def delivered(err: Any, msg: Any) -> None:
        assert err is None, err
        written[msg.key()] = (msg.offset(), msg.value(), msg.timestamp()[1])

    for i, k in enumerate(order):
        value = None if (k in TOMBSTONED and last_index[k] == i) else b"key%d-update%d" % (k, i)
        producer.produce(
            topic, key=b"key%d" % k, value=value, timestamp=base_ts + i, on_delivery=delivered
        )
        if i % 100 == 0:
            producer.poll(0)
    assert producer.flush(30) == 0
    assert len(written) == KEYS

    live = {key: row for key, row in written.items() if row[1] is not None}
    expected_live = sorted((off, key, value, ts) for key, (off, value, ts) in live.items())
    expected_all = sorted((off, key, value, ts) for key, (off, value, ts) in written.items())

    # First: the cleaner keeps one record per key, tombstones included (within their grace).
    deadline = time.monotonic() + DEADLINE_S
    rows = read_from_start(bootstrap, topic)
    while sorted(rows) != expected_all and time.monotonic() < deadline:
        if sorted(rows) == expected_live:
            break  # the tombstones' grace period already ended (a slow machine)
        time.sleep(0.5)
        rows = read_from_start(bootstrap, topic)
    assert sorted(rows) in (expected_all, expected_live), (len(rows), rows[:5])
    # Tombstones' batches now carry the delete horizon (attribute bit 6, KIP-534);
    # another client's decoder reads them the same: every live record at its offset, and
    # the tombstones whose grace has not ended (the cleaner may remove some of them
    # between the two reads: a pass drops a segment's tombstones once its horizon passed).
    python_rows = sorted(read_with_kafka_python(bootstrap, topic))
    assert [row for row in python_rows if row[2] is not None] == expected_live
    assert set(python_rows) <= set(expected_all), python_rows[:5]
    offsets = [row[0] for row in rows]
    assert offsets == sorted(offsets)

    # ListOffsets by time on the cleaned segments: the first surviving record at or after.
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "times"})
    try:
        probe_offset, _, _, probe_ts = expected_live[len(expected_live) // 2]
        [found] = consumer.offsets_for_times([CTopicPartition(topic, 0, probe_ts)], timeout=10)
        first_at_or_after = min(o for o, *_rest, ts in rows if ts >= probe_ts)
        assert found.offset <= probe_offset
        assert found.offset >= max([o for o, *_rest in rows if o < first_at_or_after], default=0)
    finally:
        consumer.close()

    # Then: after delete.retention.ms the tombstoned keys are gone altogether.
    rows = read_from_start(bootstrap, topic)
    while sorted(rows) != expected_live and time.monotonic() < deadline:
        time.sleep(0.5)
        rows = read_from_start(bootstrap, topic)
    assert sorted(rows) == expected_live
    assert len(rows) == KEYS - len(TOMBSTONED)

    # The cleaned log survives a restart (recovery reads the cleaned segments back).
    cleaner_broker.stop()
    cleaner_broker.start()
    assert sorted(read_from_start(cleaner_broker.bootstrap, topic)) == expected_live


def read_values(bootstrap: str, topic: str, isolation: str) -> dict[bytes, list[bytes | None]]:
    """key -> every value a consumer from offset 0 gets, in order."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"txn-{random.random()}",
                         "enable.auto.commit": False, "isolation.level": isolation})  # fmt: skip
    try:
        consumer.assign([CTopicPartition(topic, 0, 0)])
        seen: dict[bytes, list[bytes | None]] = {}
        empty_polls = 0
        deadline = time.monotonic() + 60
        while empty_polls < 3 and time.monotonic() < deadline:
            messages = consumer.consume(500, timeout=0.5)
            empty_polls = 0 if messages else empty_polls + 1
            for msg in messages:
                assert msg.error() is None, msg.error()
                seen.setdefault(msg.key(), []).append(msg.value())
        return seen
    finally:
        consumer.close()


def test_transactional_writes_to_a_compacted_topic_clean_by_kafkas_rules(
    cleaner_broker: BrokerProcess,
) -> None:
    """Committed transactions compact like plain writes; aborted ones are removed; the
    markers of transactions with no data left go after delete.retention.ms."""
    bootstrap = cleaner_broker.bootstrap
    topic = "compacted-txn"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    configs = {"cleanup.policy": "compact", "segment.bytes": "4096", "segment.ms": "1500",
               "min.cleanable.dirty.ratio": "0.01", "delete.retention.ms": "1000"}  # fmt: skip
    for future in admin.create_topics([NewTopic(topic, 1, 1, config=configs)]).values():
        future.result(timeout=60)
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": "compacting"})
    producer.init_transactions(30)
    latest: dict[bytes, bytes] = {}
    for txn in range(30):
        committed = txn % 3 != 1  # every third transaction aborts
        producer.begin_transaction()
        for k in range(10):
            producer.produce(topic, key=b"k%d" % k, value=b"t%d-k%d" % (txn, k))
        assert producer.flush(30) == 0  # in the log before the end, so aborts leave data
        if committed:
            producer.commit_transaction(30)
            latest.update({b"k%d" % k: b"t%d-k%d" % (txn, k) for k in range(10)})
        else:
            producer.abort_transaction(30)
    expected = {key: [value] for key, value in latest.items()}
    deadline = time.monotonic() + DEADLINE_S
    # Cleaned: even a read_uncommitted consumer sees one committed value per key, since
    # the aborted transactions' batches are gone.
    seen = read_values(bootstrap, topic, "read_uncommitted")
    while seen != expected and time.monotonic() < deadline:
        time.sleep(0.5)
        seen = read_values(bootstrap, topic, "read_uncommitted")
    assert seen == expected, {k: v[-3:] for k, v in seen.items()}
    assert read_values(bootstrap, topic, "read_committed") == expected
    # Then the markers go: every transaction but the last has no data left (the last one
    # rewrote every key), so each marker gets a delete horizon in the pass after the one
    # that removed its data, and a pass after the horizon removes it. The last marker is
    # the producer's last batch and stays (its producer state).
    partition_dir = cleaner_broker.data_dir / f"{topic}-0"
    markers = count_markers(partition_dir)
    while markers != 1 and time.monotonic() < deadline:
        time.sleep(0.5)
        markers = count_markers(partition_dir)
    assert markers == 1
    assert read_values(bootstrap, topic, "read_committed") == expected
    assert read_values(bootstrap, topic, "read_uncommitted") == expected
    cleaner_broker.stop()
    cleaner_broker.start()  # the producer state and LSO are rebuilt from what is left
    assert read_values(cleaner_broker.bootstrap, topic, "read_committed") == expected


def count_markers(partition_dir: Path) -> int:
    """Control batches in the partition's segment files (read beside the running broker:
    a file the cleaner swaps away meanwhile is read again)."""
    for _ in range(10):
        try:
            return sum(
                1
                for path in sorted(partition_dir.glob("*.log"))
                for batch in iter_batches(path.read_bytes())
                if batch.is_control
            )
        except (FileNotFoundError, TruncatedError):
            time.sleep(0.1)
    raise AssertionError(f"no stable read of {partition_dir}")
