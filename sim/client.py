"""The simulated producer: acks=all Produce over the Kafka wire protocol, our codec both ways.

It finds leaders with Metadata, sends one batch at a time per partition with values
unique in the run, and records what the broker acknowledged. A timed-out or refused
send is retried later with new values (a plain, non-idempotent producer: a retried
write may land twice, which the checks allow; an acknowledged one must never go).
"""

from __future__ import annotations

import itertools
from typing import Any

import attrs
import trio

from sim.cluster import broker_host
from sim.network import Network
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.protocol.primitives import INT32
from trio_broker.protocol.records import build_batch

__all__ = ["Ack", "Producer"]

PRODUCE_VERSION = 9
METADATA_VERSION = 9
REQUEST_TIMEOUT_S = 5.0
PRODUCE_TIMEOUT_MS = 2000
#: Pause between sends: a modest rate keeps each run cheap; faults matter, not volume.
THINK_S = 0.2


@attrs.frozen
class Ack:
    partition: int
    base_offset: int
    values: tuple[bytes, ...]
    at: float  # trio time


class _Conn:
    """One connection to one broker: a request, its answer, the next."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.buffer = bytearray()
        self.correlation = itertools.count(1)
        self.lock = trio.Lock()

    async def call(self, api_key: int, version: int, request: Any) -> Any:
        async with self.lock:
            correlation_id = next(self.correlation)
            frame = m.encode_request(api_key, version, correlation_id, "sim-producer", request)
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


class Producer:
    def __init__(self, network: Network, topic: str, broker_ids: list[int]) -> None:
        self.network, self.topic, self.broker_ids = network, topic, broker_ids
        self.leaders: dict[int, int] = {}
        self.conns: dict[int, _Conn] = {}
        self.acks: list[Ack] = []
        self.sent = 0
        self.errors: dict[str, int] = {}
        self._values = itertools.count()
        self.stopped = False

    def _note(self, what: str) -> None:
        self.errors[what] = self.errors.get(what, 0) + 1

    async def _conn(self, broker_id: int) -> _Conn:
        conn = self.conns.get(broker_id)
        if conn is None:
            stream = await self.network.connect("client", f"b{broker_id}")
            conn = self.conns[broker_id] = _Conn(stream)
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

    async def refresh_metadata(self) -> None:
        for broker_id in self.broker_ids:
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

    async def produce_once(self, partition: int) -> None:
        leader = self.leaders.get(partition)
        if leader is None:
            await self.refresh_metadata()
            await trio.sleep(0.1)
            return
        count = 1 + next(self._values) % 3
        values = tuple(f"v{next(self._values)}".encode() for _ in range(count))
        batch = build_batch([(None, v) for v in values], base_timestamp=0)
        Req = m.ProduceRequest
        request = Req(
            acks=-1, timeout_ms=PRODUCE_TIMEOUT_MS,
            topic_data=[Req.TopicProduceData(name=self.topic, partition_data=[
                Req.TopicProduceData.PartitionProduceData(index=partition, records=bytes(batch))
            ])],
        )  # fmt: skip
        self.sent += 1
        response = await self._call(leader, m.ApiKey.PRODUCE, PRODUCE_VERSION, request)
        if response is None:
            self.leaders.pop(partition, None)
            await trio.sleep(0.05)
            return
        answer = response.responses[0].partition_responses[0]
        if answer.error_code == ErrorCode.NONE:
            self.acks.append(Ack(partition, answer.base_offset, values, trio.current_time()))
            return
        self._note(ErrorCode(answer.error_code).name)
        if answer.error_code in (ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.FENCED_LEADER_EPOCH):
            self.leaders.pop(partition, None)
        await trio.sleep(0.05)

    async def run(self, partition: int, until: float) -> None:
        """Produce to ``partition`` until trio time ``until``."""
        while trio.current_time() < until and not self.stopped:
            await self.produce_once(partition)
            await trio.sleep(THINK_S)

    async def close(self) -> None:
        for conn in self.conns.values():
            await conn.stream.aclose()
        self.conns.clear()
