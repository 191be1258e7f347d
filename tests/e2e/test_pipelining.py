"""Pipelining: 20 requests sent back to back on one connection, answers in request order.

The mix has requests that complete at once (ApiVersions, Metadata, an immediate
Fetch), requests the broker defers (Produce acks=-1 waits for the fsync; a
Fetch whose min_bytes cannot be met waits out its max_wait), and in one variant
Produce acks=0, which gets no answer at all. Whatever the completion order, the
answers must come back in request order, each decodable at the version asked.
Since a connection's requests are handled in order, each immediate Fetch sees the
records produced before it in the pipeline as far as they are synced (all those of an
answered produce in the serial model).
"""

from __future__ import annotations

import time
import uuid
from typing import TYPE_CHECKING, Any

import attrs
import pytest

from tests.waits import wait_until
from trio_broker.protocol import messages as m
from trio_broker.protocol.records import build_batch, iter_batches

if TYPE_CHECKING:
    from tests.e2e.conftest import BrokerProcess

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(300),
    # One broker per (model, storage) for the module: the two tests use their own topics.
    pytest.mark.parametrize(
        "shared_broker_process",
        [(p, s) for p in ("pipelined", "serial") for s in ("file", "memory")],
        indirect=True,
        ids=lambda p: "-".join(p),
        scope="module",
    ),
]

REQUESTS = 20
RECORDS_PER_PRODUCE = 3
#: A min_bytes no partition reaches: the Fetch waits out its max_wait.
UNREACHABLE_MIN_BYTES = 64 << 20
LONG_POLL_MS = 300


@attrs.define
class Sent:
    correlation_id: int
    kind: str  # api-versions | metadata | produce | produce-acks0 | fetch | long-poll
    api_key: int
    version: int
    produced_before: int  # records from Produce requests earlier in the pipeline
    records: int = 0  # records this Produce carries
    #: Records of the acks=-1 Produce requests earlier in the pipeline: synced before
    #: they are answered, so before this request is read in the serial model.
    acked_before: int = 0


def fetch_body(
    topic: str, topic_id: uuid.UUID, version: int, min_bytes: int, max_wait_ms: int
) -> Any:
    Topic = m.FetchRequest.FetchTopic
    partition = Topic.FetchPartition(partition=0, fetch_offset=0, partition_max_bytes=1 << 20)
    wanted = Topic(topic=topic, partitions=[partition])
    if version >= 13:
        wanted.topic_id = topic_id
    return m.FetchRequest(
        replica_id=-1,
        max_wait_ms=max_wait_ms,
        min_bytes=min_bytes,
        max_bytes=4 << 20,
        isolation_level=0,
        topics=[wanted],
    )


def produce_body(topic: str, topic_id: uuid.UUID, version: int, acks: int, first: int) -> Any:
    pairs = [(b"key-%d" % i, b"value-%d" % i) for i in range(first, first + RECORDS_PER_PRODUCE)]
    Topic = m.ProduceRequest.TopicProduceData
    data = [Topic.PartitionProduceData(index=0, records=bytes(build_batch(pairs)))]
    wanted = Topic(name=topic, partition_data=data)
    if version >= 13:
        wanted.topic_id = topic_id
    return m.ProduceRequest(acks=acks, timeout_ms=10_000, topic_data=[wanted])


def plan(with_acks0: bool) -> list[tuple[str, int]]:
    """(kind, version) for each of the 20 requests: every kind, several versions each."""
    kinds = [
        ("api-versions", 0),
        ("metadata", 4),
        ("produce", 3),
        ("fetch", 4),
        ("long-poll", 11),
        ("api-versions", 3),
        ("metadata", 12),
        ("produce", 9),
        ("fetch", 12),
        ("produce", 13),
        ("long-poll", 4),
        ("metadata", 1),
        ("fetch", 16),
        ("produce", 7),
        ("api-versions", 4),
        ("fetch", 13),
        ("produce", 11),
        ("metadata", 9),
        ("long-poll", 17),
        ("fetch", 18),
    ]
    if with_acks0:  # turn three of the Produce requests into acks=0
        for index in (2, 9, 16):
            kinds[index] = ("produce-acks0", kinds[index][1])
    assert len(kinds) == REQUESTS
    return kinds


def run_pipeline(bp: BrokerProcess, topic: str, with_acks0: bool) -> None:
    with bp.connect() as setup:
        topic_id = setup.topic_id(topic)  # Metadata v12 auto-creates and names the id
    sent: list[Sent] = []
    payload = bytearray()
    produced = acked = 0
    with bp.connect(timeout=20) as conn:
        for i, (kind, version) in enumerate(plan(with_acks0)):
            cid = 1000 + i
            if kind == "api-versions":
                key, body = (
                    m.ApiKey.API_VERSIONS,
                    m.ApiVersionsRequest(client_software_name="e2e", client_software_version="1"),
                )
            elif kind == "metadata":
                key = m.ApiKey.METADATA
                body = m.MetadataRequest(
                    topics=[m.MetadataRequest.MetadataRequestTopic(name=topic)]
                )
            elif kind.startswith("produce"):
                acks = 0 if kind == "produce-acks0" else -1
                key, body = m.ApiKey.PRODUCE, produce_body(topic, topic_id, version, acks, produced)
            elif kind == "fetch":
                key, body = m.ApiKey.FETCH, fetch_body(topic, topic_id, version, 0, 0)
            else:
                key = m.ApiKey.FETCH
                body = fetch_body(topic, topic_id, version, UNREACHABLE_MIN_BYTES, LONG_POLL_MS)
            records = RECORDS_PER_PRODUCE if kind.startswith("produce") else 0
            sent.append(Sent(cid, kind, key, version, produced, records, acked))
            produced += records
            acked += records if kind == "produce" else 0
            payload += m.encode_request(key, version, cid, "e2e-pipeline", body)
        started = time.monotonic()
        conn.send(bytes(payload))  # all 20 at once, before reading anything
        expected = [s for s in sent if s.kind != "produce-acks0"]
        answers = [conn.recv_response(s.api_key, s.version) for s in expected]
        elapsed = time.monotonic() - started
        # Nothing more is owed: the next answer is to a request sent after this check.
        tail = conn.request(m.ApiKey.API_VERSIONS, 0, m.ApiVersionsRequest())
        assert tail.error_code == 0
    assert [cid for cid, _ in answers] == [s.correlation_id for s in expected]
    serial = bp.processing_model == "serial"
    for s, (_, response) in zip(expected, answers):
        check_answer(s, response, topic, produced, serial)
    with bp.connect() as conn:
        # Every record, once synced (a node alone's high watermark is its durable end).
        wait_until(lambda: conn.end_offset(topic) == produced, "every record synced")
    print(f"{bp.processing_model}: {len(expected)} answers in {elapsed * 1000:.0f} ms")


def check_answer(s: Sent, response: Any, topic: str, produced_total: int, serial: bool) -> None:
    where = f"{s.kind} v{s.version} (correlation id {s.correlation_id})"
    if s.kind == "api-versions":
        assert response.error_code == 0 and response.api_keys, where
    elif s.kind == "metadata":
        (meta,) = response.topics
        assert (meta.error_code, meta.name) == (0, topic), where
    elif s.kind == "produce":
        part = response.responses[0].partition_responses[0]
        # appends happen in request order: the base offset counts every earlier record
        assert (part.error_code, part.base_offset) == (0, s.produced_before), where
    else:
        part = response.responses[0].partitions[0]
        assert part.error_code == 0, where
        records = [r for batch in iter_batches(bytes(part.records or b"")) for r in batch.records()]
        keys = [r.key for r in records]
        if s.kind == "fetch":
            # The records produced before it in the pipeline, as far as they are synced:
            # a node alone's high watermark is its durable end (docs/reliability.md).
            # In the serial model every acks=-1 produce before it was answered, so
            # synced, before the fetch was read; pipelined, a produce ahead may still
            # wait for its fsync (as a cluster's leader's HW waits for its followers).
            hw = part.high_watermark
            assert (s.acked_before if serial else 0) <= hw <= s.produced_before, where
            assert keys == [b"key-%d" % i for i in range(hw)], where
        else:
            # The long poll answers what is synced when its max_wait ends, which may
            # include later appends. Serial: every produce before it was answered, so
            # synced, before it was read. Pipelined: a produce ahead may still wait for
            # its fsync when the 300 ms are over (busy-a-1, an fsync slower than that
            # at load 10, answered HW 0 after three produces).
            synced_before = s.acked_before if serial else 0
            assert synced_before <= part.high_watermark <= produced_total, where
            assert keys == [b"key-%d" % i for i in range(len(keys))], where
            assert len(keys) >= synced_before, where


def test_twenty_pipelined_requests_answered_in_order(
    shared_broker_process: BrokerProcess,
) -> None:
    run_pipeline(shared_broker_process, "pipelined", with_acks0=False)


def test_pipeline_with_acks0_produces_skips_only_those(
    shared_broker_process: BrokerProcess,
) -> None:
    run_pipeline(shared_broker_process, "pipelined-acks0", with_acks0=True)
