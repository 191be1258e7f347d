"""Producers whose batches retention deleted survive a kill -9 (Kafka's per-roll snapshots).

Kafka 2.5+ keeps a producer's entry when the log start passes its batches (KIP-360), and
writes the producer state to a snapshot at every segment roll (UnifiedLog.roll), so a
broker that crashes recovers those producers from the latest snapshot plus the log after
it. A real ``trio-broker serve`` process with small segments and size retention gets an
idempotent producer's batches, then plain records that roll segments until retention
deletes the producer's; after a SIGKILL the retried last batch must still be a duplicate
(its original offset, nothing appended) and an older epoch still fenced.
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

TOPIC = "retained"
DEADLINE_S = 60.0


#: Segments of 1 KiB, at most 2 KiB kept, retention checked every 100 ms.
SMALL_SEGMENTS = (
    "log.segment.bytes=1024\nlog.retention.bytes=2048\nlog.retention.check.interval.ms=100\n"
)


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    with running_broker(tmp_path / "data", properties=SMALL_SEGMENTS) as process:
        yield process


def init_producer_id(conn: RawConnection, pid: int = -1, epoch: int = -1) -> tuple[int, int]:
    body = m.InitProducerIdRequest(transactional_id=None, transaction_timeout_ms=60_000,
                                   producer_id=pid, producer_epoch=epoch)  # fmt: skip
    response = conn.request(m.ApiKey.INIT_PRODUCER_ID, 4, body)
    assert response.error_code == ErrorCode.NONE
    return response.producer_id, response.producer_epoch


def batch(pid: int, epoch: int, seq: int) -> bytes:
    return bytes(build_batch([(None, b"p%d-%d" % (epoch, seq))], producer_id=pid,
                             producer_epoch=epoch, base_sequence=seq))  # fmt: skip


def produce(conn: RawConnection, raw: bytes) -> tuple[int, int]:
    part = conn.produce(TOPIC, raw)  # acks=-1: answered once fsynced
    return int(part.error_code), int(part.base_offset)


def log_start(conn: RawConnection) -> int:
    Req = m.ListOffsetsRequest
    Part = Req.ListOffsetsTopic.ListOffsetsPartition
    body = Req(replica_id=-1, topics=[Req.ListOffsetsTopic(
        name=TOPIC, partitions=[Part(partition_index=0, timestamp=-2)])])  # fmt: skip
    part = conn.request(m.ApiKey.LIST_OFFSETS, 1, body).topics[0].partitions[0]
    assert part.error_code == ErrorCode.NONE
    return int(part.offset)


def fill_until_retention_passes(conn: RawConnection, offset: int) -> None:
    """Plain 300-byte records (segments roll every few) until the log start is past
    ``offset``: retention deleted the segments up to there."""
    deadline = time.monotonic() + DEADLINE_S
    while log_start(conn) <= offset:
        assert time.monotonic() < deadline, "retention never passed the producer's batches"
        code, _ = produce(conn, bytes(build_batch([(None, b"x" * 300)])))
        assert code == ErrorCode.NONE


def test_producers_deleted_by_retention_survive_a_kill9(broker: BrokerProcess) -> None:
    with broker.connect() as conn:
        conn.create_topic(TOPIC)
        pid, _ = init_producer_id(conn)
        assert [produce(conn, batch(pid, 0, s)) for s in (0, 1, 2)] == [(0, 0), (0, 1), (0, 2)]
        # A second producer moves to epoch 1: epoch 0 is fenced from then on.
        fenced, _ = init_producer_id(conn)
        assert produce(conn, batch(fenced, 0, 0)) == (0, 3)
        assert init_producer_id(conn, fenced, 0) == (fenced, 1)
        assert produce(conn, batch(fenced, 1, 0)) == (0, 4)
        fill_until_retention_passes(conn, 4)
        end = conn.end_offset(TOPIC)
        # Still known before the crash (KIP-360: the log start forgets no producer).
        assert produce(conn, batch(pid, 0, 2)) == (0, 2)

    broker.kill9()
    broker.start()

    with broker.connect() as conn:
        # The retry of the last batch whose ack was lost: its original offset, no append.
        assert produce(conn, batch(pid, 0, 2)) == (0, 2)
        assert produce(conn, batch(pid, 0, 9))[0] == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
        assert produce(conn, batch(fenced, 0, 1))[0] == ErrorCode.INVALID_PRODUCER_EPOCH
        assert conn.end_offset(TOPIC) == end
        assert produce(conn, batch(pid, 0, 3)) == (0, end)
