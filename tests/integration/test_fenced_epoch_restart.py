"""A producer fenced in a partition by a marker alone stays fenced there, across restarts.

When a new producer with the same transactional id takes over while the old one's
transaction is open, the coordinator aborts that transaction under the next epoch and
writes the abort marker to every partition of it, including partitions the old producer
never wrote to. In such a partition the marker is the producer's only entry; Kafka keeps
the epoch it carries (the marker updates the producer's entry, and its snapshot holds
the entry), so a write at the old epoch is refused with INVALID_PRODUCER_EPOCH. Here a
real ``trio-broker serve`` process is fenced that way through the coordinator (raw
requests), then restarted after a kill -9 (state rebuilt from the log), cleanly (state
from the snapshot), killed again with that snapshot on disk, and its log start moved by
DeleteRecords: at every step a produce and a marker at the old epoch are refused.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import BrokerProcess, RawConnection, running_broker
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.protocol.records import build_batch

pytestmark = pytest.mark.timeout(300)

TOPIC = "fenced"
TID = "fence-me"


@pytest.fixture
def process(tmp_path: Path) -> Iterator[BrokerProcess]:
    with running_broker(tmp_path / "data") as broker:
        yield broker


def create_topic(conn: RawConnection) -> None:
    conn.create_topic(TOPIC)


def init_producer_id(conn: RawConnection) -> tuple[int, int, int]:
    return conn.init_producer_id(TID)


def add_partition(conn: RawConnection, pid: int, epoch: int) -> int:
    return conn.add_partition_to_txn(TID, pid, epoch, TOPIC)


def produce(conn: RawConnection, batch: bytes) -> tuple[int, int]:
    part = conn.produce(TOPIC, batch)
    return part.error_code, part.base_offset


def write_abort_marker(conn: RawConnection, pid: int, epoch: int) -> int:
    Req = m.WriteTxnMarkersRequest
    Marker = Req.WritableTxnMarker
    body = Req(markers=[Marker(
        producer_id=pid, producer_epoch=epoch, transaction_result=False, coordinator_epoch=0,
        topics=[Marker.WritableTxnMarkerTopic(name=TOPIC, partition_indexes=[0])],
    )])  # fmt: skip
    response = conn.request(m.ApiKey.WRITE_TXN_MARKERS, 1, body)
    return int(response.markers[0].topics[0].partitions[0].error_code)


def delete_records(conn: RawConnection, before: int) -> None:
    Req = m.DeleteRecordsRequest
    Topic, Part = Req.DeleteRecordsTopic, Req.DeleteRecordsTopic.DeleteRecordsPartition
    body = Req(topics=[Topic(name=TOPIC, partitions=[Part(partition_index=0, offset=before)])],
               timeout_ms=10_000)  # fmt: skip
    part = conn.request(m.ApiKey.DELETE_RECORDS, 2, body).topics[0].partitions[0]
    assert (part.error_code, part.low_watermark) == (ErrorCode.NONE, before)


def plain(value: bytes) -> bytes:
    return bytes(build_batch([(None, value)]))


def fence(process: BrokerProcess) -> tuple[int, int]:
    """The old producer's transaction holds the partition but wrote nothing to it; a new
    producer's InitProducerId aborts it under the bumped epoch. (producer id, old epoch)."""
    with process.connect() as conn:
        error, pid, old_epoch = init_producer_id(conn)
        assert error == ErrorCode.NONE
        assert add_partition(conn, pid, old_epoch) == ErrorCode.NONE
        deadline = time.monotonic() + 30
        while (answer := init_producer_id(conn))[0] != ErrorCode.NONE:
            assert answer[0] == ErrorCode.CONCURRENT_TRANSACTIONS, answer
            assert time.monotonic() < deadline, "InitProducerId never completed"
        assert answer == (ErrorCode.NONE, pid, old_epoch + 2)
    return pid, old_epoch


def assert_still_fenced(process: BrokerProcess, pid: int, old_epoch: int) -> None:
    with process.connect() as conn:
        stale = bytes(build_batch([(None, b"zombie")], producer_id=pid,
                                  producer_epoch=old_epoch, base_sequence=0))  # fmt: skip
        assert produce(conn, stale)[0] == ErrorCode.INVALID_PRODUCER_EPOCH
        assert write_abort_marker(conn, pid, old_epoch) == ErrorCode.INVALID_PRODUCER_EPOCH


def test_an_epoch_carried_only_by_a_fencing_marker_survives_restarts(
    process: BrokerProcess,
) -> None:
    with process.connect() as conn:
        create_topic(conn)
        assert produce(conn, plain(b"a")) == (ErrorCode.NONE, 0)
        assert produce(conn, plain(b"b")) == (ErrorCode.NONE, 1)
    pid, old_epoch = fence(process)  # the abort marker is offset 2
    assert_still_fenced(process, pid, old_epoch)

    process.kill9()  # no snapshot yet: rebuilt from the log
    process.start()
    assert_still_fenced(process, pid, old_epoch)

    process.restart()  # a clean stop writes the snapshot, the start reads it
    assert_still_fenced(process, pid, old_epoch)

    with process.connect() as conn:
        assert produce(conn, plain(b"c")) == (ErrorCode.NONE, 3)
    process.kill9()  # the snapshot (up to offset 3) plus a replay of the rest
    process.start()
    assert_still_fenced(process, pid, old_epoch)

    with process.connect() as conn:
        delete_records(conn, 1)  # the log start moves, not past the marker
    assert_still_fenced(process, pid, old_epoch)
    with process.connect() as conn:
        delete_records(conn, 2)  # the marker is the first batch left
    assert_still_fenced(process, pid, old_epoch)
    process.restart()
    assert_still_fenced(process, pid, old_epoch)


def test_the_fencing_epoch_outlives_its_marker_below_the_log_start(
    process: BrokerProcess,
) -> None:
    """Kafka keeps the producer's entry (epoch, coordinator epoch, last timestamp) when
    the log start passes the marker that was all the partition had of it (KIP-360: only
    producer.id.expiration.ms forgets it): the old epoch stays fenced, restarts included."""
    with process.connect() as conn:
        create_topic(conn)
        assert produce(conn, plain(b"a")) == (ErrorCode.NONE, 0)
    pid, old_epoch = fence(process)  # the abort marker is offset 1
    with process.connect() as conn:
        assert produce(conn, plain(b"b")) == (ErrorCode.NONE, 2)
        delete_records(conn, 3)  # past the marker: the partition holds nothing of pid
    assert_still_fenced(process, pid, old_epoch)
    process.restart()  # the clean shutdown's snapshot carries the epoch
    assert_still_fenced(process, pid, old_epoch)
    process.kill9()  # that snapshot, and a replay of the log after it
    process.start()
    assert_still_fenced(process, pid, old_epoch)
