"""The simulated clients, over the Kafka wire protocol, our codec both ways.

The producer: acks=all Produce. It finds leaders with Metadata, sends one batch at a
time per partition with values unique in the run, and records what the broker
acknowledged. A timed-out or refused send is retried later with new values (a plain,
non-idempotent producer: a retried write may land twice, which the checks allow; an
acknowledged one must never go).

The consumer: long-polling Fetch as the Kafka clients do, one Fetch at a time per
leader carrying every partition it reads from that leader, over the one connection per
broker; one Metadata refresh for all the partitions whose leader it lost. It records
every record it is given with the high watermark the same answer told. What a consumer
was shown is committed: it must be below that HW, and still in the log at that offset
at the end (sim/simulation.py).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import attrs
import trio

from sim import timers as wakes
from sim.cluster import broker_host
from sim.network import Network
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.protocol.primitives import INT32
from trio_broker.protocol.records import build_batch, split_batches

__all__ = ["Ack", "Consumer", "Producer", "Received"]

PRODUCE_VERSION = 9
INIT_PRODUCER_ID_VERSION = 4
FETCH_VERSION = 12
FETCH_MAX_WAIT_MS = 500
METADATA_VERSION = 9
REQUEST_TIMEOUT_S = 5.0
PRODUCE_TIMEOUT_MS = 2000
#: Pause between sends: a modest rate keeps each run cheap; faults matter, not volume.
THINK_S = 0.2
#: The consumer's pause after a failed fetch (doubled after each failure in a row up to
#: MAX_BACKOFF_S, as the Java client's reconnect.backoff.ms and .max.ms), and between
#: Metadata refreshes.
ERROR_BACKOFF_S = 0.05
MAX_BACKOFF_S = 1.0
METADATA_BACKOFF_S = 0.1


@attrs.frozen
class Ack:
    partition: int
    base_offset: int
    values: tuple[bytes, ...]
    at: float  # trio time
    leader: int = -1  # the broker that answered
    sent_at: float = 0.0  # trio time the request was sent


@attrs.frozen
class Received:
    partition: int
    offset: int
    value: bytes
    high_watermark: int  # the HW told by the answer that carried the record
    leader: int
    #: The bound the answer told: its HW, or for read_committed its LSO.
    bound: int = -1


class _Conn:
    """One connection to one broker: a request, its answer, the next."""

    def __init__(self, stream: trio.abc.Stream, client_id: str) -> None:
        self.stream, self.client_id = stream, client_id
        self.buffer = bytearray()
        self.correlation = itertools.count(1)
        self.lock = trio.Lock()

    async def call(self, api_key: int, version: int, request: Any) -> Any:
        # A free lock is taken without the scheduler pass trio.Lock's acquire makes
        # (send_all makes one anyway).
        try:
            self.lock.acquire_nowait()
        except trio.WouldBlock:
            await self.lock.acquire()
        try:
            correlation_id = next(self.correlation)
            frame = m.encode_request(api_key, version, correlation_id, self.client_id, request)
            await self.stream.send_all(frame)
            while True:
                if len(self.buffer) >= 4:
                    size = INT32.unpack_from(self.buffer, 0)[0]
                    if len(self.buffer) >= 4 + size:
                        body = bytes(self.buffer[4 : 4 + size])
                        del self.buffer[: 4 + size]
                        break
                chunk = await self.stream.receive_some(1 << 20)
                if not chunk:
                    raise OSError("connection closed")
                self.buffer += chunk
            got, response = m.decode_response(api_key, version, body)
            if got != correlation_id:
                raise OSError(f"correlation id {got}, expected {correlation_id}")
            return response
        finally:
            self.lock.release()


class _Client:
    """Connections to the brokers (from the network node "client") and the leaders
    Metadata named."""

    client_id = "sim-client"

    def __init__(self, network: Network, topic: str, broker_ids: list[int]) -> None:
        self.network, self.topic, self.broker_ids = network, topic, broker_ids
        self.leaders: dict[int, int] = {}
        self.conns: dict[int, _Conn] = {}
        self.errors: dict[str, int] = {}
        self.stopped = False

    def _note(self, what: str) -> None:
        self.errors[what] = self.errors.get(what, 0) + 1

    async def _conn(self, broker_id: int) -> _Conn:
        conn = self.conns.get(broker_id)
        if conn is None:
            stream = await self.network.connect("client", f"b{broker_id}")
            conn = self.conns[broker_id] = _Conn(stream, self.client_id)
        return conn

    async def _call(self, broker_id: int, api_key: int, version: int, request: Any) -> Any:
        try:
            conn = await self._conn(broker_id)
            with trio.fail_after(REQUEST_TIMEOUT_S):
                return await conn.call(api_key, version, request)
        except (OSError, trio.BrokenResourceError, trio.TooSlowError, m.ProtocolError) as exc:
            self._note(type(exc).__name__)
            dropped = self.conns.pop(broker_id, None)
            if dropped is not None:
                await dropped.stream.aclose()
            return None

    def _least_loaded_first(self) -> list[int]:
        """The brokers, those with no request in flight first (Kafka's least loaded
        node): a Metadata refresh does not queue behind a long poll."""
        busy = [b for b in self.broker_ids if b in self.conns and self.conns[b].lock.locked()]
        return [b for b in self.broker_ids if b not in busy] + busy

    async def refresh_metadata(self) -> None:
        for broker_id in self._least_loaded_first():
            request = m.MetadataRequest(
                topics=[m.MetadataRequest.MetadataRequestTopic(name=self.topic)],
                allow_auto_topic_creation=False,
            )
            response = await self._call(broker_id, m.ApiKey.METADATA, METADATA_VERSION, request)
            if response is None:
                continue
            for topic in response.topics:
                for part in topic.partitions:
                    if part.error_code == ErrorCode.NONE and part.leader_id >= 0:
                        self.leaders[part.partition_index] = part.leader_id
            for broker in response.brokers:
                assert broker.host == broker_host(broker.node_id)
            return

    async def leader_of(self, partition: int) -> int | None:
        """The partition's leader as Metadata last named it; None (after asking
        Metadata again and a pause) while unknown."""
        leader = self.leaders.get(partition)
        if leader is None:
            await self.refresh_metadata()
            await wakes.sleep(0.1)
        return leader

    async def call_leader(
        self, partition: int, leader: int, api_key: int, version: int, request: Any
    ) -> Any:
        """The leader's answer, or None (the leader forgotten, after a pause) when the
        connection failed or timed out."""
        response = await self._call(leader, api_key, version, request)
        if response is None:
            await self.forget_leader(partition)
        return response

    async def forget_leader(self, partition: int) -> None:
        """Ask Metadata who leads ``partition`` next time, after a pause."""
        self.leaders.pop(partition, None)
        await wakes.sleep(0.05)

    async def close(self) -> None:
        for conn in self.conns.values():
            await conn.stream.aclose()
        self.conns.clear()


class Producer(_Client):
    client_id = "sim-producer"

    def __init__(
        self,
        network: Network,
        topic: str,
        broker_ids: list[int],
        *,
        idempotent: bool = False,
        now_ms: Callable[[], int] | None = None,
    ) -> None:
        super().__init__(network, topic, broker_ids)
        self.acks: list[Ack] = []
        self.sent = 0
        self._values = itertools.count()
        #: Idempotent: each batch carries the producer id, epoch and the partition's next
        #: sequence; after any failed or unanswered write the producer takes a new id
        #: (the old one's sequence may or may not have moved), so it never retries.
        self.idempotent = idempotent
        self.producer_id, self.producer_epoch = -1, -1
        self.sequences: dict[int, int] = {}
        #: The batches' timestamp (the cluster's clock; else 0). A producer's state
        #: expires producer.id.expiration.ms after its last batch's timestamp.
        self.now_ms = now_ms
        #: Called with each acknowledgement as it arrives (the simulation's invariant 7).
        self.on_ack: Callable[[Ack], None] | None = None
        #: Called with (partition, values, error code) for each write the leader
        #: answered with an error (the simulation's invariant 10).
        self.on_refusal: Callable[[int, tuple[bytes, ...], ErrorCode], None] | None = None

    async def init_producer_id(self) -> bool:
        """A new producer id from any broker (InitProducerId without a transactional id)."""
        request = m.InitProducerIdRequest(
            transactional_id=None, transaction_timeout_ms=60_000, producer_id=-1, producer_epoch=-1
        )
        for broker_id in self._least_loaded_first():
            response = await self._call(
                broker_id, m.ApiKey.INIT_PRODUCER_ID, INIT_PRODUCER_ID_VERSION, request
            )
            if response is None:
                continue
            if response.error_code == ErrorCode.NONE:
                self.producer_id = response.producer_id
                self.producer_epoch = response.producer_epoch
                self.sequences.clear()
                return True
            self._note(ErrorCode(response.error_code).name)
        await wakes.sleep(0.1)
        return False

    async def produce_once(self, partition: int) -> None:
        if self.idempotent and self.producer_id < 0 and not await self.init_producer_id():
            return
        leader = await self.leader_of(partition)
        if leader is None:
            return
        count = 1 + next(self._values) % 3
        values = tuple(f"v{next(self._values)}".encode() for _ in range(count))
        sequence = self.sequences.get(partition, 0) if self.idempotent else -1
        batch = build_batch(
            [(None, v) for v in values], producer_id=self.producer_id,
            base_timestamp=0 if self.now_ms is None else self.now_ms(),
            producer_epoch=self.producer_epoch, base_sequence=sequence,
        )  # fmt: skip
        Req = m.ProduceRequest
        request = Req(
            acks=-1, timeout_ms=PRODUCE_TIMEOUT_MS,
            topic_data=[Req.TopicProduceData(name=self.topic, partition_data=[
                Req.TopicProduceData.PartitionProduceData(index=partition, records=bytes(batch))
            ])],
        )  # fmt: skip
        self.sent += 1
        sent_at = trio.current_time()
        response = await self.call_leader(
            partition, leader, m.ApiKey.PRODUCE, PRODUCE_VERSION, request
        )
        if response is None:
            self.producer_id = -1
            return
        answer = response.responses[0].partition_responses[0]
        if answer.error_code == ErrorCode.NONE:
            ack = Ack(partition, answer.base_offset, values, trio.current_time(), leader, sent_at)
            self.acks.append(ack)
            if self.on_ack is not None:
                self.on_ack(ack)
            if self.idempotent:
                self.sequences[partition] = sequence + count
            return
        self.producer_id = -1
        self._note(ErrorCode(answer.error_code).name)
        if self.on_refusal is not None:
            self.on_refusal(partition, values, ErrorCode(answer.error_code))
        if answer.error_code in (ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.FENCED_LEADER_EPOCH):
            self.leaders.pop(partition, None)
        await wakes.sleep(0.05)

    async def run(self, partition: int, until: float) -> None:
        """Produce to ``partition`` until trio time ``until``."""
        while trio.current_time() < until and not self.stopped:
            await self.produce_once(partition)
            await wakes.sleep(THINK_S)


class Consumer(_Client):
    """Long-polls the partitions' leaders, read_uncommitted (isolation 0) or
    read_committed (1): a plain consumer may be given records below the HW, a
    read_committed one below the LSO (which is at most the HW).

    As the Kafka clients: one fetcher per broker, which sends one Fetch at a time
    carrying every partition that broker leads (as Metadata last told), and one task
    that asks Metadata again whenever a partition's leader is unknown (at most every
    ``METADATA_BACKOFF_S``)."""

    client_id = "sim-consumer"

    def __init__(
        self, network: Network, topic: str, broker_ids: list[int], isolation_level: int = 0
    ) -> None:
        super().__init__(network, topic, broker_ids)
        self.isolation_level = isolation_level
        self.positions: dict[int, int] = {}
        self.received: list[Received] = []
        #: Records given at or above the HW (read_committed: the LSO) of their answer.
        self.above_high_watermark: list[Received] = []
        #: Answers whose last stable offset lies above their HW: (partition, leader, LSO, HW).
        self.stable_above_high_watermark: list[tuple[int, int, int, int]] = []
        #: Fetches sent, by the number of partitions each carried.
        self.fetch_sizes: dict[int, int] = {}
        #: Set (and replaced) whenever ``leaders`` changes.
        self._leaders_changed = trio.Event()

    def _changed(self) -> None:
        self._leaders_changed.set()
        self._leaders_changed = trio.Event()

    def _forget(self, partition: int, leader: int) -> None:
        """The partition is no longer fetched from ``leader``: ask Metadata again."""
        if self.leaders.get(partition) == leader:
            del self.leaders[partition]
            self._changed()

    async def run(self, partitions: list[int], until: float) -> None:
        """Consume ``partitions`` until trio time ``until``."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._find_leaders, partitions, until)
            for broker_id in self.broker_ids:
                nursery.start_soon(self._fetcher, broker_id, partitions, until)

    async def _find_leaders(self, partitions: list[int], until: float) -> None:
        while trio.current_time() < until and not self.stopped:
            if all(p in self.leaders for p in partitions):
                await self._leaders_changed.wait()
                continue
            known = dict(self.leaders)
            await self.refresh_metadata()
            if self.leaders != known:
                self._changed()
            await wakes.sleep(METADATA_BACKOFF_S)

    async def _fetcher(self, broker_id: int, partitions: list[int], until: float) -> None:
        backoff = ERROR_BACKOFF_S
        while trio.current_time() < until and not self.stopped:
            mine = [p for p in partitions if self.leaders.get(p) == broker_id]
            if not mine:
                await self._leaders_changed.wait()
                continue
            if await self.fetch_once(broker_id, mine):
                backoff = ERROR_BACKOFF_S
            else:  # as the clients' reconnect.backoff.ms, doubling to its max
                await wakes.sleep(backoff)
                backoff = min(2 * backoff, MAX_BACKOFF_S)

    async def fetch_once(self, leader: int, partitions: list[int]) -> bool:
        """One Fetch of ``partitions`` from ``leader``; False if it or a partition failed."""
        Req = m.FetchRequest
        wanted = [
            Req.FetchTopic.FetchPartition(
                partition=p, fetch_offset=self.positions.get(p, 0), log_start_offset=-1,
                partition_max_bytes=1 << 20,
            )
            for p in partitions
        ]  # fmt: skip
        request = Req(replica_id=-1, max_wait_ms=FETCH_MAX_WAIT_MS, min_bytes=1,
                      max_bytes=1 << 20, isolation_level=self.isolation_level,
                      session_id=0, session_epoch=-1,
                      topics=[Req.FetchTopic(topic=self.topic, partitions=wanted)],
                      forgotten_topics_data=[], rack_id="")  # fmt: skip
        self.fetch_sizes[len(partitions)] = self.fetch_sizes.get(len(partitions), 0) + 1
        response = await self._call(leader, m.ApiKey.FETCH, FETCH_VERSION, request)
        if response is None:
            for p in partitions:
                self._forget(p, leader)
            return False
        ok = True
        for topic in response.responses:
            for answer in topic.partitions:
                if answer.partition_index in partitions:
                    ok = await self._take(leader, answer) and ok
        return ok

    async def _take(self, leader: int, answer: Any) -> bool:
        """One partition's part of a Fetch answer; False if it failed."""
        partition = answer.partition_index
        position = self.positions.get(partition, 0)
        if answer.error_code == ErrorCode.OFFSET_OUT_OF_RANGE:
            # DeleteRecords moved the log start past the position: auto.offset.reset
            # "earliest", as the Kafka clients do.
            self._note("OFFSET_OUT_OF_RANGE")
            return await self._reset_to_log_start(partition, leader, position)
        if answer.error_code != ErrorCode.NONE:
            self._note(ErrorCode(answer.error_code).name)
            self._forget(partition, leader)
            return False
        bound = answer.high_watermark
        if answer.last_stable_offset > bound:  # Kafka's LSO is at most the HW
            self.stable_above_high_watermark.append(
                (partition, leader, answer.last_stable_offset, bound)
            )
        if self.isolation_level == 1:
            bound = min(bound, answer.last_stable_offset)
        for batch in split_batches(bytes(answer.records or b""))[0]:
            for record in batch.records():
                offset = batch.base_offset + record.offset_delta
                if offset < position:
                    continue  # the batch began before the position asked for
                got = Received(partition, offset, bytes(record.value or b""),
                               answer.high_watermark, leader, bound)  # fmt: skip
                self.received.append(got)
                if offset >= bound:
                    self.above_high_watermark.append(got)
                position = offset + 1
        self.positions[partition] = position
        return True

    async def _reset_to_log_start(self, partition: int, leader: int, position: int) -> bool:
        Req = m.ListOffsetsRequest
        wanted = Req.ListOffsetsTopic.ListOffsetsPartition(
            partition_index=partition, current_leader_epoch=-1, timestamp=-2
        )
        request = Req(replica_id=-1, isolation_level=self.isolation_level,
                      topics=[Req.ListOffsetsTopic(name=self.topic, partitions=[wanted])])  # fmt: skip
        response = await self._call(leader, m.ApiKey.LIST_OFFSETS, 4, request)
        if response is not None:
            answer = response.topics[0].partitions[0]
            if answer.error_code == ErrorCode.NONE and int(answer.offset) > position:
                if self.positions.get(partition, 0) == position:
                    self.positions[partition] = int(answer.offset)
                return True
        # Failed, or past the end of this leader's log: ask who leads, as before.
        self._forget(partition, leader)
        return False
