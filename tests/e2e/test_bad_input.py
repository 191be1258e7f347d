"""Hostile and malformed input on raw sockets against a real broker process.

Input the broker cannot frame or decode gets a clean disconnect (no bytes
back); ApiVersions at an unknown version gets Kafka's v0 answer with
UNSUPPORTED_VERSION; bad record batches get per-partition errors. After every
case a well-behaved client on another connection still gets Metadata: one
broker serves the whole module, so the hostile cases pile up on it.
"""

from __future__ import annotations

import ssl
import struct
import time
from typing import TYPE_CHECKING, Any

import crc32c
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trio_broker.protocol import messages as m
from trio_broker.protocol.compression import Compression
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.protocol.records import build_batch

if TYPE_CHECKING:
    from tests.e2e.conftest import BrokerProcess

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(300),
    pytest.mark.parametrize(
        "shared_broker_process",
        [("pipelined", "file"), ("serial", "file")],
        indirect=True,
        scope="module",
        ids=["pipelined", "serial"],
    ),
]

_HEADER = struct.Struct(">hhi")


def frame(body: bytes) -> bytes:
    return struct.pack(">i", len(body)) + body


def raw_request(api_key: int, version: int, correlation_id: int, body: bytes = b"") -> bytes:
    """A frame with a v1 request header (null client id) and an arbitrary body."""
    return frame(_HEADER.pack(api_key, version, correlation_id) + struct.pack(">h", -1) + body)


def tls_client_hello() -> bytes:
    """The first bytes a TLS client sends (read as a length prefix: ~369 MB)."""
    context = ssl.create_default_context()
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname="broker.invalid")
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    hello = outgoing.read()
    assert hello[:1] == b"\x16", "not a TLS handshake record"
    return hello


def metadata_v4(correlation_id: int, topics: list[str] | None = None) -> bytes:
    wanted = (
        None if topics is None else [m.MetadataRequest.MetadataRequestTopic(name=t) for t in topics]
    )
    return m.encode_request(
        m.ApiKey.METADATA, 4, correlation_id, "e2e", m.MetadataRequest(topics=wanted)
    )


CLOSING_INPUTS: dict[str, Any] = {
    "length-0x7fffffff": lambda: struct.pack(">i", 0x7FFFFFFF) + b"\x00" * 64,
    "length-over-socket.request.max.bytes": lambda: struct.pack(">i", 100 * 1024 * 1024 + 1),
    "length-minus-1": lambda: struct.pack(">i", -1) + b"\x00" * 16,
    "length-int32-min": lambda: struct.pack(">i", -(2**31)),
    "tls-client-hello": tls_client_hello,
    "unknown-api-key-9999": lambda: raw_request(9999, 0, 7),
    "metadata-v99": lambda: raw_request(m.ApiKey.METADATA, 99, 7, b"\x00" * 8),
    "metadata-v-1": lambda: raw_request(m.ApiKey.METADATA, -1, 7, b"\x00" * 8),
    "frame-shorter-than-header": lambda: frame(b"\x00\x03\x00"),
    "negative-client-id-length": lambda: frame(
        _HEADER.pack(3, 4, 7) + struct.pack(">h", -5) + b"\xff" * 8
    ),
    # Metadata v4: topics array claims 2**31-1 entries, carries none.
    "huge-array-count": lambda: raw_request(
        m.ApiKey.METADATA, 4, 7, struct.pack(">i", 0x7FFFFFFF) + b"\x01"
    ),
    # Metadata v12 (flexible): a compact array length as an over-long varint.
    "over-long-varint": lambda: frame(
        _HEADER.pack(3, 12, 7) + struct.pack(">h", -1) + b"\x00" + b"\xff" * 12
    ),
}


@pytest.mark.parametrize("case", list(CLOSING_INPUTS))
def test_undecodable_input_gets_a_clean_disconnect(
    shared_broker_process: BrokerProcess, case: str
) -> None:
    bp = shared_broker_process
    with bp.connect() as conn:
        try:
            conn.send(CLOSING_INPUTS[case]())
        except (BrokenPipeError, ConnectionResetError):
            pass  # closed while we were still sending: also a disconnect
        assert conn.closed_by_peer(timeout=10), f"{case}: connection still open after 10 s"
    bp.assert_serving()


def test_valid_request_answered_before_a_bad_frame_closes(
    shared_broker_process: BrokerProcess,
) -> None:
    """A good request, then garbage: the broker may answer the first; then it closes."""
    bp = shared_broker_process
    with bp.connect() as conn:
        conn.send(metadata_v4(1) + struct.pack(">i", -1))
        try:
            correlation_id, response = conn.recv_response(m.ApiKey.METADATA, 4)
        except conn.Closed:
            pass  # the close may win the race with the answer in the pipelined model
        else:
            assert correlation_id == 1 and response.brokers
            assert conn.closed_by_peer(timeout=10)
    bp.assert_serving()


@pytest.mark.parametrize("split", [1, 4, 9, "half"])
def test_truncated_request_then_close(
    shared_broker_process: BrokerProcess, split: int | str
) -> None:
    bp = shared_broker_process
    data = metadata_v4(1, ["truncated"])
    cut = len(data) // 2 if split == "half" else int(split)
    for _ in range(3):  # several, so a leak of half-read connections would add up
        with bp.connect() as conn:
            conn.send(data[:cut])
    # And one that stops mid-frame but stays open: the broker must not answer it.
    with bp.connect() as conn:
        conn.send(data[:cut])
        assert not conn.closed_by_peer(timeout=0.3), "closed a connection that was only slow"
    bp.assert_serving()


def test_api_versions_unknown_version_gets_v0_error_35(
    shared_broker_process: BrokerProcess,
) -> None:
    bp = shared_broker_process
    with bp.connect() as conn:
        conn.send(raw_request(m.ApiKey.API_VERSIONS, 99, 4242, b"\x07future\x00\x01\x02"))
        correlation_id, response = m.decode_response(m.ApiKey.API_VERSIONS, 0, conn.recv_frame())
        assert correlation_id == 4242
        assert response.error_code == ErrorCode.UNSUPPORTED_VERSION == 35
        ranges = {k.api_key: (k.min_version, k.max_version) for k in response.api_keys}
        low, high = ranges[m.ApiKey.API_VERSIONS]
        assert low == 0 and high >= 3, ranges
        # The client retries on the same connection, which must still work.
        again = conn.request(
            m.ApiKey.API_VERSIONS,
            high,
            m.ApiVersionsRequest(client_software_name="e2e", client_software_version="1"),
        )
        assert again.error_code == 0 and again.api_keys
    bp.assert_serving()


@pytest.mark.parametrize("version", [3, 9])
@pytest.mark.parametrize("where", ["crc-field", "attributes", "last-byte"])
def test_produce_with_bad_crc_gets_corrupt_message(
    shared_broker_process: BrokerProcess, version: int, where: str
) -> None:
    bp = shared_broker_process
    topic = f"bad-crc-v{version}-{where}"
    good = build_batch([(b"key-%d" % i, b"value-%d" % i) for i in range(5)])
    bad = bytearray(good)
    index = {"crc-field": 18, "attributes": 22, "last-byte": len(bad) - 1}[where]
    bad[index] ^= 0x01
    with bp.connect() as conn:
        conn.metadata([topic])  # auto-creates the topic
        rejected = conn.produce(topic, bytes(bad), version=version)
        assert rejected.error_code == ErrorCode.CORRUPT_MESSAGE == 2, rejected
        accepted = conn.produce(topic, bytes(good), version=version)
        assert (accepted.error_code, accepted.base_offset) == (0, 0), accepted
        assert conn.end_offset(topic) == 5  # nothing of the corrupt batch was stored
    bp.assert_serving()


@pytest.mark.parametrize(
    ("codec", "padding"),
    [(Compression.NONE, 0), (Compression.LZ4, 0), (Compression.ZSTD, 400_000)],
    ids=["none", "lz4", "zstd-2MB-inflated"],
)
def test_produce_whose_records_do_not_add_up_gets_invalid_record(
    shared_broker_process: BrokerProcess, codec: Compression, padding: int
) -> None:
    """A sound header and CRC over records that do not match the declared count. The
    zstd batch inflates past 1 MiB: its records are checked in a worker thread
    (handlers/produce.py, INLINE_UNCOMPRESSED), with the same verdicts."""
    bp = shared_broker_process
    topic = f"bad-records-{codec.name.lower()}"
    good = build_batch(
        [(b"key-%d" % i, b"value-%d" % i + bytes(padding)) for i in range(5)], compression=codec
    )
    bad = bytearray(good)
    struct.pack_into(">i", bad, 23, 3)  # last offset delta: 4 records claimed ...
    struct.pack_into(">i", bad, 57, 4)  # ... where 5 are stored
    struct.pack_into(">I", bad, 17, crc32c.crc32c(bytes(bad[21:])))
    with bp.connect() as conn:
        conn.metadata([topic])
        rejected = conn.produce(topic, bytes(bad), version=9)
        assert rejected.error_code == ErrorCode.INVALID_RECORD == 87, rejected
        accepted = conn.produce(topic, bytes(good), version=9)
        assert (accepted.error_code, accepted.base_offset) == (0, 0), accepted
        assert conn.end_offset(topic) == 5  # nothing of the refused batch was stored
    bp.assert_serving()


def test_zstd_before_produce_v7_is_unsupported(shared_broker_process: BrokerProcess) -> None:
    bp = shared_broker_process
    topic = "zstd-v3"
    batch = bytes(build_batch([(b"k", b"zstd " * 50)] * 3, compression=Compression.ZSTD))
    with bp.connect() as conn:
        conn.metadata([topic])
        rejected = conn.produce(topic, batch, version=3)
        assert rejected.error_code == ErrorCode.UNSUPPORTED_COMPRESSION_TYPE == 76, rejected
        accepted = conn.produce(topic, batch, version=7)
        assert (accepted.error_code, accepted.base_offset) == (0, 0), accepted
        assert conn.end_offset(topic) == 3
    bp.assert_serving()


# --------------------------------------------------------------------------- garbage frames

#: APIs whose answer may legitimately wait a long time (long polls, rebalances) are left
#: out of garbage frames so that "no answer yet" can only mean a stuck broker.
WAITING_APIS = {m.ApiKey.FETCH, m.ApiKey.JOIN_GROUP, m.ApiKey.SYNC_GROUP}
API_KEYS = sorted(set(m.REQUESTS) - WAITING_APIS)
SENTINEL_CORRELATION_ID = -559038737  # negative: never generated below


def _no_waiting_api(body: bytes) -> bool:
    return len(body) < 2 or struct.unpack_from(">h", body)[0] not in WAITING_APIS


def _with_version(key: int) -> st.SearchStrategy[tuple[int, int]]:
    schema = m.REQUESTS[key]  # mostly versions the codec knows, sometimes one either side
    return st.tuples(st.just(key), st.integers(schema.min_version - 1, schema.max_version + 1))


headered_bodies = st.builds(
    lambda key_version, cid, client_id, rest: _HEADER.pack(*key_version, cid) + client_id + rest,
    st.sampled_from(API_KEYS).flatmap(_with_version),
    st.integers(0, 2**31 - 1),
    st.sampled_from([b"\xff\xff", b"\x00\x00", b"\x00\x03e2e", b"\x00\x09short"]),
    st.binary(max_size=120),
)
random_bodies = st.binary(max_size=160).filter(_no_waiting_api)


def produce_body(topic: str, batch: bytes) -> Any:
    Topic = m.ProduceRequest.TopicProduceData
    data = [Topic.PartitionProduceData(index=0, records=batch)]
    return m.ProduceRequest(
        acks=-1, timeout_ms=5000, topic_data=[Topic(name=topic, partition_data=data)]
    )


def _seed_requests() -> list[bytes]:
    """Valid request bodies (size prefix stripped) for mutation."""
    batch = bytes(build_batch([(b"key", b"value"), (None, b"v2")]))
    Topic = m.MetadataRequest.MetadataRequestTopic
    LTopic = m.ListOffsetsRequest.ListOffsetsTopic
    list_offsets = m.ListOffsetsRequest(
        replica_id=-1,
        topics=[
            LTopic(
                name="garbage",
                partitions=[LTopic.ListOffsetsPartition(partition_index=0, timestamp=-2)],
            )
        ],
    )
    seeds = [
        (
            m.ApiKey.API_VERSIONS,
            3,
            m.ApiVersionsRequest(client_software_name="e2e", client_software_version="1"),
        ),
        (m.ApiKey.METADATA, 4, m.MetadataRequest(topics=[Topic(name="garbage")])),
        (m.ApiKey.METADATA, 12, m.MetadataRequest(topics=[Topic(name="garbage")])),
        (m.ApiKey.PRODUCE, 3, produce_body("garbage", batch)),
        (m.ApiKey.PRODUCE, 9, produce_body("garbage", batch)),
        (m.ApiKey.LIST_OFFSETS, 1, list_offsets),
        (m.ApiKey.LIST_OFFSETS, 7, list_offsets),
    ]
    return [m.encode_request(key, version, 1, "e2e", body)[4:] for key, version, body in seeds]


def _mutate(seed: bytes, edits: list[tuple[int, int]], cut: int) -> bytes:
    out = bytearray(seed)
    for position, value in edits:  # header bytes (key, version) stay: the request routes
        out[4 + position % (len(out) - 4)] = value
    return bytes(out[: max(8, cut)]) if cut < len(out) else bytes(out)


mutated_requests = st.builds(
    _mutate,
    st.sampled_from(_seed_requests()),
    st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=4),
    st.integers(8, 10_000),
)
garbage_frames = st.lists(
    st.one_of(headered_bodies, random_bodies, mutated_requests), min_size=1, max_size=6
)


def _response_version(api_key: int, version: int) -> int:
    if api_key == m.ApiKey.API_VERSIONS and not 0 <= version <= m.REQUESTS[api_key].max_version:
        return 0  # Kafka answers an unknown ApiVersions version in v0
    return version


def _read_until_sentinel_or_close(conn: Any, timeout: float = 10.0) -> tuple[list[bytes], bool]:
    """Response frames read until the sentinel's answer; and whether the broker closed."""
    frames: list[bytes] = []
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"no answer to the sentinel and no close within {timeout}s"
        conn.sock.settimeout(remaining)
        try:
            data = conn.recv_frame()
        except conn.Closed:
            return frames, True
        except TimeoutError:
            raise AssertionError(
                f"no answer to the sentinel and no close within {timeout}s"
            ) from None
        frames.append(data)
        if struct.unpack_from(">i", data)[0] == SENTINEL_CORRELATION_ID:
            return frames, False


@settings(
    max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(bodies=garbage_frames)
def test_garbage_frames_get_ordered_answers_or_a_close(
    shared_broker_process: BrokerProcess, bodies: list[bytes]
) -> None:
    bp = shared_broker_process
    sent = [  # (correlation id, api key, version) of frames that carry a request header
        (cid, key, version)
        for key, version, cid in (_HEADER.unpack_from(b) for b in bodies if len(b) >= 8)
    ]
    sentinel = m.encode_request(
        m.ApiKey.API_VERSIONS, 0, SENTINEL_CORRELATION_ID, "e2e", m.ApiVersionsRequest()
    )
    sent.append((SENTINEL_CORRELATION_ID, m.ApiKey.API_VERSIONS, 0))
    with bp.connect() as conn:
        try:
            conn.send(b"".join(frame(b) for b in bodies) + sentinel)
        except (BrokenPipeError, ConnectionResetError):
            pass
        frames, _closed = _read_until_sentinel_or_close(conn)
    position = 0
    for data in frames:  # each answer matches a later request than the one before it
        cid = struct.unpack_from(">i", data)[0]
        while position < len(sent) and sent[position][0] != cid:
            position += 1
        assert position < len(sent), f"answer with correlation id {cid} out of order or unknown"
        _, key, version = sent[position]
        m.decode_response(key, _response_version(key, version), data)  # well-formed
        position += 1
    bp.assert_serving()


LONGEST_GROUP_ID = "g" * 0x7FFF  # an offsets-log key's int16-length string, full


def _commit(conn: Any, group_id: str, topic: str, offset: int) -> list[int]:
    Topic = m.OffsetCommitRequest.OffsetCommitRequestTopic
    body = m.OffsetCommitRequest(
        group_id=group_id, generation_id_or_member_epoch=-1, member_id="",
        group_instance_id=None, retention_time_ms=-1,
        topics=[Topic(name=topic, partitions=[Topic.OffsetCommitRequestPartition(
            partition_index=0, committed_offset=offset, committed_leader_epoch=-1,
            committed_metadata="",
        )])],
    )  # fmt: skip
    answer = conn.request(m.ApiKey.OFFSET_COMMIT, 8, body)
    return [p.error_code for t in answer.topics for p in t.partitions]


def test_a_group_id_too_long_for_the_offsets_log_gets_invalid_group_id(
    shared_broker_process: BrokerProcess,
) -> None:
    """Flexible requests carry compact strings, so a group id may be longer than the
    int16-length string an offsets-log key holds (Kafka's keys too). Such a group can
    never be stored: every group request about it answers INVALID_GROUP_ID, on a
    connection that stays open, where a write of it closed the connection before."""
    too_long = "g" * 0x8000
    topic = "long-group-ids"
    with shared_broker_process.connect() as conn:
        conn.metadata([topic])  # created on first use
        assert _commit(conn, too_long, topic, 5) == [ErrorCode.INVALID_GROUP_ID]
        Protocol = m.JoinGroupRequest.JoinGroupRequestProtocol
        join = m.JoinGroupRequest(
            group_id=too_long, session_timeout_ms=10_000, rebalance_timeout_ms=10_000,
            member_id="", group_instance_id=None, protocol_type="consumer",
            protocols=[Protocol(name="range", metadata=b"")], reason=None,
        )  # fmt: skip
        assert conn.request(m.ApiKey.JOIN_GROUP, 9, join).error_code == ErrorCode.INVALID_GROUP_ID
        sync = m.SyncGroupRequest(
            group_id=too_long, generation_id=1, member_id="m", group_instance_id=None,
            protocol_type="consumer", protocol_name="range", assignments=[],
        )  # fmt: skip
        assert conn.request(m.ApiKey.SYNC_GROUP, 5, sync).error_code == ErrorCode.INVALID_GROUP_ID
        heartbeat = m.ConsumerGroupHeartbeatRequest(
            group_id=too_long, member_id="m" * 22, member_epoch=0, instance_id=None,
            rack_id=None, rebalance_timeout_ms=10_000, subscribed_topic_names=[topic],
            subscribed_topic_regex=None, server_assignor=None, topic_partitions=[],
        )  # fmt: skip
        answer = conn.request(m.ApiKey.CONSUMER_GROUP_HEARTBEAT, 0, heartbeat)
        assert answer.error_code == ErrorCode.INVALID_GROUP_ID
        # The longest id a key holds is a group like any other, stored and read back.
        assert _commit(conn, LONGEST_GROUP_ID, topic, 7) == [ErrorCode.NONE]
        Fetch = m.OffsetFetchRequest.OffsetFetchRequestTopic
        fetch = m.OffsetFetchRequest(
            group_id=LONGEST_GROUP_ID, topics=[Fetch(name=topic, partition_indexes=[0])],
            require_stable=False,
        )  # fmt: skip
        fetched = conn.request(m.ApiKey.OFFSET_FETCH, 7, fetch)
        assert [p.committed_offset for t in fetched.topics for p in t.partitions] == [7]
    shared_broker_process.assert_serving()


def test_broker_still_serves_a_real_client_at_the_end(shared_broker_process: BrokerProcess) -> None:
    """After everything above, a real client produces and reads back on the same broker."""
    from kafka import KafkaConsumer, TopicPartition

    bp = shared_broker_process
    with bp.connect() as conn:
        conn.metadata(["after-hostile"])
        assert (
            conn.produce("after-hostile", bytes(build_batch([(b"k", b"still here")]))).error_code
            == 0
        )
    consumer = KafkaConsumer(
        bootstrap_servers=bp.bootstrap, group_id=None, enable_auto_commit=False
    )
    try:
        tp = TopicPartition("after-hostile", 0)
        consumer.assign([tp])
        consumer.seek(tp, 0)
        got: list[Any] = []
        deadline = time.monotonic() + 60
        while not got and time.monotonic() < deadline:
            got = [r for batch in consumer.poll(timeout_ms=500).values() for r in batch]
        assert [(r.key, r.value) for r in got] == [(b"k", b"still here")]
    finally:
        consumer.close()
