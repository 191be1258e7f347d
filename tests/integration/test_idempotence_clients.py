"""Idempotent producers end to end: real clients and our own codec over real sockets.

* confluent-kafka (enable.idempotence, 5 in flight) writes 20k records under both
  processing models; kafka-python and aiokafka idempotent producers write too; the
  log must then hold every record once, in order.
* The same confluent-kafka run through a proxy that drops connections just before
  a response reaches the client: the client resends batches the broker already
  appended, and the broker must answer them as duplicates.
* A raw client pipelines five Produce requests, resends one (duplicate: original
  offset, no error), leaves a gap (45) and sends an old epoch (47).
* A restart (clean, and with the snapshot gone) keeps duplicate detection.

Clients run in worker threads (trio.to_thread) so the in-process broker keeps serving.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from trio_broker.config import BrokerConfig
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.protocol.records import RecordBatchView, build_batch, iter_batches
from trio_broker.server.broker import Broker
from trio_broker.services.producers import (
    PRODUCER_ID_FILE,
    ProducerStateRegistry,
    latest_snapshot,
)

pytestmark = pytest.mark.timeout(300)

TOPIC = "idem"
_SIZE = struct.Struct(">i")
PRODUCE_V = 9  # flexible, as librdkafka and kafka-python send
INIT_V = 4  # flexible, carries the current producer id and epoch (KIP-360)


# ------------------------------------------------------------------------------ broker


@asynccontextmanager
async def running_broker(data_dir: Path, **settings: Any) -> AsyncIterator[Broker]:
    """A broker in its own nursery; leaving the block shuts it down cleanly."""
    config = BrokerConfig(port=0, data_dir=data_dir, **settings)
    async with trio.open_nursery() as nursery:
        broker: Broker = await nursery.start(Broker(config).run)
        if broker.topics.get(TOPIC) is None:
            broker.topics.create(TOPIC, 1)
        try:
            yield broker
        finally:
            await broker.shutdown()


def port_of(broker: Broker) -> int:
    return broker.bound[0][1]


def topic_log(broker: Broker) -> Any:
    log = broker.topics.log(TOPIC, 0)
    assert log is not None
    return log


def stored_batches(broker: Broker) -> list[tuple[RecordBatchView, list[bytes]]]:
    """Every batch of the topic's log, with its record values, read in-process."""
    log = topic_log(broker)
    out = []
    offset = log.log_start_offset
    while offset < log.log_end_offset:
        regions = log.read(offset, 1 << 20, log.log_end_offset)
        data = b"".join(region.read_bytes() for region in regions)
        for view in iter_batches(bytearray(data)):
            values = [bytes(r.value or b"") for r in view.records()]
            out.append((view, values))
            offset = view.next_offset
    return out


def stored_values(broker: Broker) -> list[bytes]:
    return [v for _, values in stored_batches(broker) for v in values]


def expected_values(n: int, tag: str) -> list[bytes]:
    return [b"%s-%06d" % (tag.encode(), i) for i in range(n)]


# -------------------------------------------------------------------------- raw client


class RawClient:
    """Our codec over a trio stream; ``send`` and ``receive`` apart, for pipelining."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.buffer = bytearray()
        self.correlation_id = 0

    @classmethod
    async def connect(cls, port: int) -> RawClient:
        return cls(await trio.open_tcp_stream("127.0.0.1", port))

    async def send(self, api_key: int, version: int, body: Any) -> None:
        self.correlation_id += 1
        frame = m.encode_request(api_key, version, self.correlation_id, "raw-idem", body)
        await self.stream.send_all(frame)

    async def receive(self, api_key: int, version: int) -> Any:
        while True:
            if len(self.buffer) >= 4:
                size = _SIZE.unpack_from(self.buffer)[0]
                if len(self.buffer) >= 4 + size:
                    frame = bytes(self.buffer[4 : 4 + size])
                    del self.buffer[: 4 + size]
                    return m.decode_response(api_key, version, frame)[1]
            chunk = await self.stream.receive_some(65536)
            assert chunk, "broker closed the connection"
            self.buffer += chunk

    async def request(self, api_key: int, version: int, body: Any) -> Any:
        await self.send(api_key, version, body)
        return await self.receive(api_key, version)

    async def init_producer_id(
        self, producer_id: int = -1, epoch: int = -1, transactional_id: str | None = None
    ) -> Any:
        body = m.InitProducerIdRequest(
            transactional_id=transactional_id,
            transaction_timeout_ms=60_000,
            producer_id=producer_id,
            producer_epoch=epoch,
        )
        return await self.request(m.ApiKey.INIT_PRODUCER_ID, INIT_V, body)

    async def send_produce(self, batch: bytes) -> None:
        Req = m.ProduceRequest
        body = Req(
            transactional_id=None,
            acks=-1,
            timeout_ms=10_000,
            topic_data=[
                Req.TopicProduceData(
                    name=TOPIC,
                    partition_data=[
                        Req.TopicProduceData.PartitionProduceData(index=0, records=batch)
                    ],
                )
            ],
        )
        await self.send(m.ApiKey.PRODUCE, PRODUCE_V, body)

    async def receive_produce(self) -> tuple[int, int]:
        """(error code, base offset) of the single partition answered."""
        response = await self.receive(m.ApiKey.PRODUCE, PRODUCE_V)
        part = response.responses[0].partition_responses[0]
        return part.error_code, part.base_offset

    async def produce(self, batch: bytes) -> tuple[int, int]:
        await self.send_produce(batch)
        return await self.receive_produce()


def batch_of(pid: int, epoch: int, seq: int, count: int = 2, tag: str = "raw") -> bytes:
    records = [(None, b"%s-%d" % (tag.encode(), seq + i)) for i in range(count)]
    return bytes(build_batch(records, producer_id=pid, producer_epoch=epoch, base_sequence=seq))


# ----------------------------------------------------------------------------- raw tests


async def test_pipelined_duplicate_gap_and_old_epoch(tmp_path: Path) -> None:
    async with running_broker(tmp_path, processing_model="pipelined") as broker:
        client = await RawClient.connect(port_of(broker))
        init = await client.init_producer_id()
        assert init.error_code == ErrorCode.NONE and init.producer_epoch == 0
        pid = init.producer_id

        # Five requests in flight at once, as a client with max.in.flight=5 sends them.
        batches = [batch_of(pid, 0, seq) for seq in range(0, 10, 2)]
        for batch in batches:
            await client.send_produce(batch)
        assert [await client.receive_produce() for _ in batches] == [
            (0, 0),
            (0, 2),
            (0, 4),
            (0, 6),
            (0, 8),
        ]
        # A retry of the third: its original offset and no error, nothing appended.
        assert await client.produce(batches[2]) == (0, 4)
        # A gap: sequence 12 where 10 is expected.
        assert await client.produce(batch_of(pid, 0, 12)) == (
            ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
            -1,
        )
        # The client bumps its epoch (KIP-360) and starts again at sequence 0...
        bumped = await client.init_producer_id(pid, 0)
        assert (bumped.error_code, bumped.producer_id, bumped.producer_epoch) == (0, pid, 1)
        assert await client.produce(batch_of(pid, 1, 0)) == (0, 10)
        # ... after which the old epoch is fenced.
        assert await client.produce(batch_of(pid, 0, 10)) == (ErrorCode.INVALID_PRODUCER_EPOCH, -1)
        # A new epoch must start at 0.
        assert await client.produce(batch_of(pid, 2, 5)) == (
            ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
            -1,
        )
        assert topic_log(broker).log_end_offset == 12
        await client.stream.aclose()


async def test_a_rejected_batch_fails_the_rest_of_the_pipeline(tmp_path: Path) -> None:
    async with running_broker(tmp_path, processing_model="pipelined") as broker:
        client = await RawClient.connect(port_of(broker))
        pid = (await client.init_producer_id()).producer_id
        assert await client.produce(batch_of(pid, 0, 0)) == (0, 0)
        # Batch seq 2 is lost on the way (never arrives); 4 and 6 are pipelined behind it.
        for seq in (4, 6):
            await client.send_produce(batch_of(pid, 0, seq))
        assert [await client.receive_produce() for _ in range(2)] == [
            (ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, -1)
        ] * 2
        # The client resends all three in order: accepted, nothing lost or doubled.
        for seq in (2, 4, 6):
            await client.send_produce(batch_of(pid, 0, seq))
        assert [await client.receive_produce() for _ in range(3)] == [(0, 2), (0, 4), (0, 6)]
        values = stored_values(broker)
        assert values == [b"raw-%d" % i for i in range(8)]
        await client.stream.aclose()


async def test_init_producer_id_every_version_and_transactional(tmp_path: Path) -> None:
    async with running_broker(tmp_path) as broker:
        client = await RawClient.connect(port_of(broker))
        ids = []
        for version in range(0, 7):
            body = m.InitProducerIdRequest(transactional_id=None, transaction_timeout_ms=1000)
            answer = await client.request(m.ApiKey.INIT_PRODUCER_ID, version, body)
            assert (answer.error_code, answer.producer_epoch) == (0, 0)
            ids.append(answer.producer_id)
        assert len(set(ids)) == len(ids)
        # A transactional id: the transaction coordinator's fresh id (docs/transactions.md).
        transactional = await client.init_producer_id(transactional_id="txn-1")
        assert (transactional.error_code, transactional.producer_epoch) == (0, 0)
        assert transactional.producer_id not in ids
        half = await client.init_producer_id(producer_id=ids[0], epoch=-1)
        assert half.error_code == ErrorCode.INVALID_REQUEST
        top = await client.init_producer_id(ids[0], 32767)  # epoch exhausted: a new id
        assert top.error_code == 0 and top.producer_id not in ids and top.producer_epoch == 0
        await client.stream.aclose()


async def test_unreadable_id_block_fails_init_but_not_produce(tmp_path: Path) -> None:
    (tmp_path / PRODUCER_ID_FILE).write_text("not json")
    async with running_broker(tmp_path) as broker:
        client = await RawClient.connect(port_of(broker))
        # Guessing could reissue ids: refuse (retriable) until an operator fixes the file.
        answer = await client.init_producer_id()
        assert answer.error_code == ErrorCode.COORDINATOR_NOT_AVAILABLE
        assert await client.produce(batch_of(3, 0, 0)) == (0, 0)
        await client.stream.aclose()


async def test_no_producer_id_is_never_checked(tmp_path: Path) -> None:
    async with running_broker(tmp_path) as broker:
        client = await RawClient.connect(port_of(broker))
        # aiokafka's non-idempotent shape: producer id -1 with sequence 0, every time.
        same = bytes(
            build_batch([(None, b"a")], producer_id=-1, producer_epoch=-1, base_sequence=0)
        )
        assert [await client.produce(same) for _ in range(3)] == [(0, 0), (0, 1), (0, 2)]
        await client.stream.aclose()


@pytest.mark.parametrize("lose_snapshot", [False, True], ids=["clean", "no-snapshot"])
async def test_duplicate_detected_after_restart(tmp_path: Path, lose_snapshot: bool) -> None:
    async with running_broker(tmp_path) as broker:
        client = await RawClient.connect(port_of(broker))
        pid = (await client.init_producer_id()).producer_id
        sent = [batch_of(pid, 0, seq, count=3) for seq in (0, 3, 6)]
        assert [await client.produce(b) for b in sent] == [(0, 0), (0, 3), (0, 6)]
        await client.stream.aclose()
    snapshot = latest_snapshot(tmp_path / f"{TOPIC}-0")
    assert snapshot is not None
    if lose_snapshot:  # as after a crash: rebuilt from the log's batch headers
        snapshot.unlink()

    async with running_broker(tmp_path) as broker:
        client = await RawClient.connect(port_of(broker))
        # The client never saw the last ack and retries it against the new broker.
        assert await client.produce(sent[-1]) == (0, 6)
        assert await client.produce(batch_of(pid, 0, 9)) == (0, 9)
        assert await client.produce(batch_of(pid, 0, 20)) == (
            ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
            -1,
        )
        # Producer ids are never handed out twice, across restarts.
        assert (await client.init_producer_id()).producer_id > pid
        assert topic_log(broker).log_end_offset == 11
        await client.stream.aclose()


async def delete_records(client: RawClient, before: int) -> None:
    Req = m.DeleteRecordsRequest
    Topic, Part = Req.DeleteRecordsTopic, Req.DeleteRecordsTopic.DeleteRecordsPartition
    body = Req(topics=[Topic(name=TOPIC, partitions=[Part(partition_index=0, offset=before)])],
               timeout_ms=10_000)  # fmt: skip
    response = await client.request(m.ApiKey.DELETE_RECORDS, 2, body)
    part = response.topics[0].partitions[0]
    assert (part.error_code, part.low_watermark) == (ErrorCode.NONE, before)


async def test_state_outlives_the_batches_deleted_below_the_log_start(tmp_path: Path) -> None:
    """Kafka 2.5+ (KAFKA-7190, KIP-360) keeps a producer's entry when the log start passes
    all its batches; only producer.id.expiration.ms removes it. So a retry is still a
    duplicate, a gap still out of order and an old epoch still fenced, restart included."""
    async with running_broker(tmp_path) as broker:
        client = await RawClient.connect(port_of(broker))
        pid = (await client.init_producer_id()).producer_id
        sent = [batch_of(pid, 0, seq) for seq in (0, 2)]
        assert [await client.produce(b) for b in sent] == [(0, 0), (0, 2)]
        await delete_records(client, 4)  # past the producer's last batch (offsets 2-3)
        # The lost ack's retry: Kafka still knows the batch (its original offset, no append).
        assert await client.produce(sent[-1]) == (0, 2)
        assert await client.produce(batch_of(pid, 0, 10)) == (
            ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
            -1,
        )
        assert await client.produce(batch_of(pid, 0, 4)) == (0, 4)
        assert topic_log(broker).log_end_offset == 6

        # A bumped epoch, then everything of the producer deleted: the old epoch stays fenced.
        bumped = await client.init_producer_id(pid, 0)
        assert await client.produce(batch_of(pid, bumped.producer_epoch, 0)) == (0, 6)
        await delete_records(client, 8)
        assert await client.produce(batch_of(pid, 0, 6)) == (ErrorCode.INVALID_PRODUCER_EPOCH, -1)
        await client.stream.aclose()

    # A clean shutdown snapshots the entry (Kafka's snapshot holds the map, not the log).
    async with running_broker(tmp_path) as broker:
        client = await RawClient.connect(port_of(broker))
        assert await client.produce(batch_of(pid, 0, 6)) == (ErrorCode.INVALID_PRODUCER_EPOCH, -1)
        assert await client.produce(batch_of(pid, 1, 5)) == (
            ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
            -1,
        )
        assert await client.produce(batch_of(pid, 1, 0)) == (0, 6)
        assert await client.produce(batch_of(pid, 1, 2)) == (0, 8)
        assert topic_log(broker).log_end_offset == 10
        await client.stream.aclose()


# -------------------------------------------------------------------------- real clients

COUNT = 20_000


def confluent_produce(bootstrap: str, n: int, tag: str, batch: int = 500) -> dict[str, Any]:
    from confluent_kafka import Producer

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "max.in.flight.requests.per.connection": 5,
            "acks": "all",
            "linger.ms": 2,
            "batch.num.messages": batch,
            "message.timeout.ms": 60_000,
            "reconnect.backoff.ms": 10,
            "retry.backoff.ms": 10,
        }
    )
    errors: list[str] = []
    offsets: list[int] = []

    def on_delivery(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(str(err))
        else:
            offsets.append(msg.offset())

    for value in expected_values(n, tag):
        while True:
            try:
                producer.produce(TOPIC, value=value, partition=0, on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    remaining = producer.flush(60)
    return {"errors": errors, "offsets": offsets, "unflushed": remaining}


@pytest.mark.parametrize("model", ["pipelined", "serial"])
async def test_confluent_idempotent_20k(tmp_path: Path, model: str) -> None:
    async with running_broker(tmp_path, processing_model=model) as broker:
        result = await trio.to_thread.run_sync(
            confluent_produce, f"127.0.0.1:{port_of(broker)}", COUNT, model
        )
        assert result["errors"] == [] and result["unflushed"] == 0
        assert sorted(result["offsets"]) == list(range(COUNT))
        assert stored_values(broker) == expected_values(COUNT, model)
        views = [view for view, _ in stored_batches(broker)]
        assert {v.producer_id for v in views} == {views[0].producer_id} != {-1}
        assert views[0].base_sequence == 0


def kafka_python_produce(bootstrap: str, n: int, tag: str, batch_bytes: int = 16384) -> list[int]:
    from kafka import KafkaProducer

    producer = KafkaProducer(
        bootstrap_servers=bootstrap,
        enable_idempotence=True,
        acks="all",
        max_in_flight_requests_per_connection=5,
        linger_ms=2,
        batch_size=batch_bytes,
        retry_backoff_ms=10,
        reconnect_backoff_ms=10,
    )
    try:
        futures = [producer.send(TOPIC, value=v, partition=0) for v in expected_values(n, tag)]
        producer.flush(60)
        return [f.get(timeout=60).offset for f in futures]
    finally:
        producer.close(10)


def aiokafka_produce(bootstrap: str, n: int, tag: str, batch_bytes: int = 16384) -> list[int]:
    from aiokafka import AIOKafkaProducer

    async def run() -> list[int]:
        producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap,
            enable_idempotence=True,
            linger_ms=2,
            max_batch_size=batch_bytes,
            retry_backoff_ms=10,
        )
        await producer.start()
        try:
            futures = [
                await producer.send(TOPIC, value=v, partition=0) for v in expected_values(n, tag)
            ]
            return [(await f).offset for f in futures]
        finally:
            await producer.stop()

    return asyncio.run(run())


@pytest.mark.parametrize(
    "produce", [kafka_python_produce, aiokafka_produce], ids=["kafka-python", "aiokafka"]
)
async def test_python_clients_idempotent(
    tmp_path: Path, produce: Callable[[str, int, str], list[int]]
) -> None:
    n = 3_000
    async with running_broker(tmp_path) as broker:
        offsets = await trio.to_thread.run_sync(produce, f"127.0.0.1:{port_of(broker)}", n, "py")
        assert offsets == list(range(n))
        assert stored_values(broker) == expected_values(n, "py")
        views = [view for view, _ in stored_batches(broker)]
        pids = {v.producer_id for v in views}
        assert len(pids) == 1 and -1 not in pids
        # The stored sequences are gap-free: each batch continues the previous one.
        for before, after in itertools.pairwise(views):
            assert after.base_sequence == before.last_sequence + 1


# ------------------------------------------------------------------- lost responses


class DroppingProxy:
    """Forwards Kafka frames both ways; now and then closes a connection instead of
    delivering a Produce response, so the client resends a batch the broker appended."""

    def __init__(self, target_port: int, drops: int, seed: int = 7) -> None:
        self.target_port = target_port
        self.drops_left = drops
        self.dropped = 0
        self.random = random.Random(seed)

    async def serve(self, task_status: trio.TaskStatus[int]) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        task_status.started(listeners[0].socket.getsockname()[1])
        await trio.serve_listeners(self.handle, listeners)

    @staticmethod
    async def frames(src: trio.SocketStream) -> AsyncIterator[bytes]:
        """Whole frames (size prefix included) as they arrive."""
        buffer = bytearray()
        while chunk := await src.receive_some(65536):
            buffer += chunk
            while len(buffer) >= 4 and len(buffer) >= 4 + _SIZE.unpack_from(buffer)[0]:
                end = 4 + _SIZE.unpack_from(buffer)[0]
                yield bytes(buffer[:end])
                del buffer[:end]

    async def open_upstream(self, client: trio.SocketStream) -> trio.SocketStream | None:
        """A connection to the broker for ``client``'s; None (``client`` closed) if refused."""
        try:
            return await trio.open_tcp_stream("127.0.0.1", self.target_port)
        except OSError:
            await client.aclose()
            return None

    @staticmethod
    async def relay(
        client: trio.SocketStream,
        upstream: trio.SocketStream,
        *pumps: Callable[[], Awaitable[None]],
    ) -> None:
        """Run ``pumps`` (the requests' and the responses' way) until either ends, then
        close both connections: either side ending ends the connection."""
        async with trio.open_nursery() as nursery:

            async def run(pump: Callable[[], Awaitable[None]]) -> None:
                # except*: a pump with a nursery of its own (ReorderingProxy's) raises
                # a reset connection inside an ExceptionGroup.
                try:
                    await pump()
                except* (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass
                nursery.cancel_scope.cancel()

            for pump in pumps:
                nursery.start_soon(run, pump)
        for stream in (client, upstream):
            with trio.CancelScope(shield=True):
                await stream.aclose()

    async def handle(self, client: trio.SocketStream) -> None:
        upstream = await self.open_upstream(client)
        if upstream is None:
            return
        produce_ids: set[int] = set()  # correlation ids of Produce requests in flight

        async def requests() -> None:
            async for frame in self.frames(client):
                api_key, _, correlation_id = struct.unpack_from(">hhi", frame, 4)
                if api_key == m.ApiKey.PRODUCE:
                    produce_ids.add(correlation_id)
                await upstream.send_all(frame)

        async def responses() -> None:
            async for frame in self.frames(upstream):
                correlation_id = _SIZE.unpack_from(frame, 4)[0]
                if correlation_id in produce_ids:
                    produce_ids.discard(correlation_id)
                    if self.drops_left and self.random.random() < 0.1:
                        self.drops_left -= 1
                        self.dropped += 1
                        return
                await client.send_all(frame)

        await self.relay(client, upstream, requests, responses)


def confluent_lossy(bootstrap: str, tag: str) -> int:
    result = confluent_produce(bootstrap, COUNT, tag, batch=100)
    assert result["errors"] == [] and result["unflushed"] == 0
    assert sorted(result["offsets"]) == list(range(COUNT))
    return COUNT


def kafka_python_lossy(bootstrap: str, tag: str) -> int:
    n = 3_000
    assert sorted(kafka_python_produce(bootstrap, n, tag, batch_bytes=1024)) == list(range(n))
    return n


def aiokafka_lossy(bootstrap: str, tag: str) -> int:
    n = 3_000
    assert sorted(aiokafka_produce(bootstrap, n, tag, batch_bytes=1024)) == list(range(n))
    return n


@pytest.mark.parametrize(
    "produce",
    [confluent_lossy, kafka_python_lossy, aiokafka_lossy],
    ids=["confluent-kafka", "kafka-python", "aiokafka"],
)
async def test_resends_after_lost_responses(
    tmp_path: Path, produce: Callable[[str, str], int]
) -> None:
    async with trio.open_nursery() as nursery:
        # The proxy's port must be known before the broker starts, to advertise it.
        proxy = DroppingProxy(target_port=0, drops=6)
        proxy_port: int = await nursery.start(proxy.serve)
        async with running_broker(
            tmp_path, advertised_host="127.0.0.1", advertised_port=proxy_port
        ) as broker:
            proxy.target_port = port_of(broker)
            n = await trio.to_thread.run_sync(produce, f"127.0.0.1:{proxy_port}", "lossy")
            assert proxy.dropped > 0
            assert stored_values(broker) == expected_values(n, "lossy")
            stats = ProducerStateRegistry.attached_to(broker).statistics()
            # Resent batches the broker had appended were recognised, not appended again.
            assert stats.duplicates > 0, stats
        nursery.cancel_scope.cancel()
