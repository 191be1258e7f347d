"""kill -9 during and after CreatePartitions: the partition count and acked data stay consistent.

Each round, a client grows a topic one partition per request and writes an
acks=all record to every new partition as soon as the growth is answered; the
broker is killed (SIGKILL, by PID) at a random moment of that stream, so some
kills land inside a growth (directories made, catalogue not yet written, or the
other way round). After each restart:

- the count is the last acknowledged one, or one more (the growth in flight
  when the broker died may or may not have been committed);
- every acknowledged record is at its offset with its value;
- every partition the broker lists takes a produce and gives it back.

A last round kills the broker straight after a growth's answer, with nothing
else in flight, and the count must be exactly that one.
"""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

import pytest

from tests.e2e.conftest import BrokerProcess, ConnectionClosed, RawConnection
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.protocol.records import build_batch

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

TOPIC = "growing"
ROUNDS = 6
#: Upper bounds per round, in requests and seconds.
MAX_GROWTHS_PER_ROUND = 60
ROUND_SECONDS = 5.0


def create_partitions(conn: RawConnection, count: int) -> tuple[int, str | None]:
    CP = m.CreatePartitionsRequest
    request = CP(
        topics=[CP.CreatePartitionsTopic(name=TOPIC, count=count, assignments=None)],
        timeout_ms=10_000, validate_only=False,
    )  # fmt: skip
    (result,) = conn.request(m.ApiKey.CREATE_PARTITIONS, 3, request).results
    return result.error_code, result.error_message


def produce(conn: RawConnection, partition: int, value: bytes) -> int:
    Topic = m.ProduceRequest.TopicProduceData
    data = Topic(
        name=TOPIC,
        partition_data=[
            Topic.PartitionProduceData(index=partition, records=bytes(build_batch([(None, value)])))
        ],
    )
    request = m.ProduceRequest(transactional_id=None, acks=-1, timeout_ms=10_000, topic_data=[data])
    (answer,) = conn.request(m.ApiKey.PRODUCE, 9, request).responses[0].partition_responses
    assert answer.error_code == ErrorCode.NONE, answer
    return int(answer.base_offset)


def partition_count(conn: RawConnection) -> int:
    (topic,) = conn.metadata([TOPIC]).topics
    assert topic.error_code == ErrorCode.NONE
    indexes = sorted(p.partition_index for p in topic.partitions)
    assert indexes == list(range(len(indexes))), indexes
    return len(indexes)


def values_of(conn: RawConnection, partition: int) -> list[bytes]:
    return [
        bytes(r.value)
        for batch in conn.fetch_batches(TOPIC, partition)
        for r in batch.records()
        if r.value is not None
    ]


class Grower:
    """Grows the topic and writes to each new partition until the connection dies."""

    def __init__(self, broker: BrokerProcess, count: int) -> None:
        self.broker = broker
        #: The last count the broker answered NONE for.
        self.acked_count = count
        #: (partition, offset, value) of every acknowledged record.
        self.acked: list[tuple[int, int, bytes]] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        deadline = time.monotonic() + ROUND_SECONDS
        try:
            with self.broker.connect() as conn:
                for _ in range(MAX_GROWTHS_PER_ROUND):
                    if time.monotonic() > deadline:
                        return
                    wanted = self.acked_count + 1
                    code, message = create_partitions(conn, wanted)
                    assert code == ErrorCode.NONE, (code, message)
                    self.acked_count = wanted
                    value = b"p%d" % (wanted - 1)
                    self.acked.append((wanted - 1, produce(conn, wanted - 1, value), value))
        except (ConnectionClosed, OSError):
            return  # the kill
        except BaseException as exc:  # a wrong answer: reported by the test
            self.error = exc


def check_after_restart(broker: BrokerProcess, grower: Grower, exact: bool) -> int:
    with broker.connect() as conn:
        count = partition_count(conn)
        allowed = {grower.acked_count} if exact else {grower.acked_count, grower.acked_count + 1}
        assert count in allowed, (count, grower.acked_count)
        for partition, offset, value in grower.acked:
            assert values_of(conn, partition)[offset] == value, (partition, offset)
        # Every listed partition works, the ones created just before the kill included.
        for partition in range(count):
            before = len(values_of(conn, partition))
            assert produce(conn, partition, b"check") == before
            assert values_of(conn, partition)[-1] == b"check"
    return count


def test_kill9_during_and_after_create_partitions(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "data", "pipelined", "file")
    broker.start()
    try:
        with broker.connect() as conn:
            body = m.CreateTopicsRequest(
                topics=[m.CreateTopicsRequest.CreatableTopic(
                    name=TOPIC, num_partitions=1, replication_factor=1, assignments=[],
                    configs=[],
                )],
                timeout_ms=10_000, validate_only=False,
            )  # fmt: skip
            assert conn.request(m.ApiKey.CREATE_TOPICS, 5, body).topics[0].error_code == 0
        count = 1
        rng = random.Random(20261125)
        grown_in_flight = 0
        for _ in range(ROUNDS):
            grower = Grower(broker, count)
            thread = threading.Thread(target=grower.run, name="grower")
            thread.start()
            time.sleep(rng.uniform(0.05, 0.6))
            broker.kill9()
            thread.join(ROUND_SECONDS + 20)
            assert not thread.is_alive()
            assert grower.error is None, grower.error
            broker.start()
            count = check_after_restart(broker, grower, exact=False)
            grown_in_flight += count - grower.acked_count
        # Killed right after an answer, with nothing in flight: exactly that count.
        grower = Grower(broker, count)
        with broker.connect() as conn:
            assert create_partitions(conn, count + 1) == (ErrorCode.NONE, None)
        grower.acked_count = count + 1
        broker.kill9()
        broker.start()
        final = check_after_restart(broker, grower, exact=True)
        assert final > 1 + ROUNDS  # every round grew the topic
        print(f"final count {final}; growths committed though unanswered: {grown_in_flight}")
    finally:
        if broker.running:
            assert broker.stop() == 0
