"""fsync faults, injected into the flusher of a real in-process broker.

``Flusher.sync`` is how the flusher makes a log durable (``log.flush()`` in a
worker thread); these tests replace it for one partition's directory:

- a **slow** fsync: produce with acks=all answers REQUEST_TIMED_OUT (7) once the
  request's ``timeout_ms`` passes, and the data stays in the log (as Kafka);
- an fsync that fails with **EIO**: the produce gets KAFKA_STORAGE_ERROR (56), the
  partition's log dir goes offline (its reads answer 56 too, as Kafka's), a partition
  in the broker's other log dir keeps working, nothing acknowledged is lost (read back
  after a restart), and once fsync works again the dir comes back without a restart
  (probed on produce, 1 s back-off). tests/integration/test_log_dir_failure.py has the
  rest of the per-dir rule.
"""

from __future__ import annotations

import errno
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.integration.raw_client import RawClient
from tests.waits import eventually
from trio_broker.config import BrokerConfig
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.protocol.records import build_batch, iter_batches
from trio_broker.server.broker import Broker
from trio_broker.server.flusher import flush_log

pytestmark = pytest.mark.timeout(300)


def produce_body(topic: str, value: bytes, timeout_ms: int = 10_000) -> Any:
    part = m.ProduceRequest.TopicProduceData.PartitionProduceData(
        index=0, records=bytes(build_batch([(b"k", value)]))
    )
    return m.ProduceRequest(
        acks=-1,
        timeout_ms=timeout_ms,
        topic_data=[m.ProduceRequest.TopicProduceData(name=topic, partition_data=[part])],
    )


async def produce(client: RawClient, topic: str, value: bytes, timeout_ms: int = 10_000) -> Any:
    response = await client.call(m.ApiKey.PRODUCE, 9, produce_body(topic, value, timeout_ms))
    return response.responses[0].partition_responses[0]


async def fetch(client: RawClient, topic: str) -> Any:
    F = m.FetchRequest
    body = F(
        replica_id=-1, max_wait_ms=0, min_bytes=0, max_bytes=64 << 20, isolation_level=0,
        topics=[F.FetchTopic(topic=topic, partitions=[
            F.FetchTopic.FetchPartition(partition=0, fetch_offset=0,
                                        partition_max_bytes=64 << 20)])],
    )  # fmt: skip
    response = await client.call(m.ApiKey.FETCH, 11, body)
    return response.responses[0].partitions[0]


async def read_all(client: RawClient, topic: str) -> dict[int, bytes]:
    part = await fetch(client, topic)
    assert part.error_code == 0, part.error_code
    return {
        batch.offset_of(record): bytes(record.value or b"")
        for batch in iter_batches(bytes(part.records or b""))
        for record in batch.records()
    }


async def start(
    nursery: trio.Nursery, data_dir: Path, *extra_log_dirs: Path
) -> tuple[Broker, RawClient]:
    config = BrokerConfig(port=0, data_dir=data_dir, extra_log_dirs=extra_log_dirs, storage="file")
    broker: Broker = await nursery.start(Broker(config).run)
    host, port = broker.bound[0]
    return broker, RawClient(await trio.open_tcp_stream(host, port), "faults")


def inject(broker: Broker, directory: Path, fault: Callable[[], None]) -> None:
    """Run ``fault`` before every fsync of the log in ``directory`` (others untouched)."""

    def sync(log: Any) -> int:
        if getattr(log, "directory", None) == directory:
            fault()
        return flush_log(log)

    broker.flusher.sync = sync


async def test_slow_fsync_times_out_acks_all_produce(nursery: trio.Nursery, tmp_path: Path) -> None:
    broker, client = await start(nursery, tmp_path / "data")
    broker.topics.create("slow", 1)
    broker.topics.create("fast", 1)
    with trio.fail_after(60):
        assert (await produce(client, "slow", b"before")).error_code == 0
        inject(broker, tmp_path / "data" / "slow-0", lambda: time.sleep(1.5))
        part = await produce(client, "slow", b"late", timeout_ms=300)
        assert part.error_code == ErrorCode.REQUEST_TIMED_OUT
        # Other partitions are not held up by the timeout itself.
        assert (await produce(client, "fast", b"x", timeout_ms=5_000)).error_code == 0
        broker.flusher.sync = flush_log
        # The timed-out record stays in the log (as Kafka): it was appended, just not
        # confirmed durable in time. A consumer reads it once the slow sync is done
        # (a node alone's high watermark is its durable end).
        slow = broker.topics.log("slow", 0)
        assert slow is not None
        await eventually(lambda: slow.durable_end_offset >= 2, "the late record's sync")
        assert list((await read_all(client, "slow")).values()) == [b"before", b"late"]
        assert (await produce(client, "slow", b"after")).error_code == 0


async def test_fsync_eio_is_a_storage_error_and_loses_nothing(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    # Two log dirs: the failing fsync takes the victim's whole dir offline (Kafka's
    # rule), the other dir's partition keeps serving.
    data_dir, other_dir = tmp_path / "data", tmp_path / "other"
    broker, client = await start(nursery, data_dir, other_dir)
    broker.topics.create("victim", 1)  # the first dir
    broker.topics.create("other", 1)  # the dir with fewer partitions
    other_log = broker.topics.log("other", 0)
    assert other_log is not None and broker.topics.log_dir_of(other_log) == other_dir
    failing = [True]
    failed_at: list[float] = []  # when each fsync was refused (in a worker thread)

    def eio() -> None:
        if failing[0]:
            failed_at.append(time.monotonic())
            raise OSError(errno.EIO, "injected EIO")

    with trio.fail_after(60):
        acked = {}
        for i in range(20):
            part = await produce(client, "victim", b"acked-%d" % i)
            assert part.error_code == 0
            acked[part.base_offset] = b"acked-%d" % i
        inject(broker, data_dir / "victim-0", eio)
        errors = [(await produce(client, "victim", b"doomed-%d" % i)).error_code for i in range(3)]
        assert errors == [ErrorCode.KAFKA_STORAGE_ERROR] * 3
        # Its dir is offline: reads answer 56 too (as Kafka's; before the per-dir rule
        # they went on), the other dir's partition keeps working.
        assert (await fetch(client, "victim")).error_code == ErrorCode.KAFKA_STORAGE_ERROR
        assert (await produce(client, "other", b"fine")).error_code == 0
        # Still failing: the recovery probe (after the 1 s back-off) fails too. The
        # back-off is the broker's clock, so a fixed 1.2 s passes it on any machine; the
        # probe runs in the background, so wait for its refused fsync.
        await trio.sleep(1.2)
        probe_from = time.monotonic()
        assert (await produce(client, "victim", b"still")).error_code == 56
        await eventually(lambda: any(t >= probe_from for t in failed_at), "the recovery probe")
        # fsync works again: the partition comes back without a restart.
        failing[0] = False
        recovered = None
        for _ in range(40):
            await trio.sleep(0.25)
            part = await produce(client, "victim", b"recovered")
            if part.error_code == 0:
                recovered = part.base_offset
                break
            assert part.error_code == ErrorCode.KAFKA_STORAGE_ERROR
        assert recovered is not None, "the partition did not come back online"
        stored = await read_all(client, "victim")
        assert {o: stored.get(o) for o in acked} == acked
        assert stored[recovered] == b"recovered"
        await broker.shutdown()
    # After a restart every acknowledged record is still there.
    broker, client = await start(nursery, data_dir, other_dir)
    with trio.fail_after(60):
        stored = await read_all(client, "victim")
        assert {o: stored.get(o) for o in acked} == acked
        assert stored[recovered] == b"recovered"
        assert list((await read_all(client, "other")).values()) == [b"fine"]
        assert (await produce(client, "victim", b"after restart")).error_code == 0
    await broker.shutdown()
