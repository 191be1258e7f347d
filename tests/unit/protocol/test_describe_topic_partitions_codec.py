"""DescribeTopicPartitions v0 (API 75) on the wire: bytes written out by hand from Kafka's
schema (flexible from v0: compact lengths, tagged-field counts; the nullable Cursor
structs are an int8 marker, -1 for null, 1 before the struct).

The generic property tests (test_codec_roundtrip.py, test_codec_crosscheck.py against
kafka-python) cover random messages; these pin the exact layout and the null cursor a
message gets when nobody sets one.
"""

from __future__ import annotations

import uuid

from trio_broker.protocol import messages as m
from trio_broker.protocol.codec import decode_body, encode_body

API = m.ApiKey.DESCRIBE_TOPIC_PARTITIONS
Req = m.DescribeTopicPartitionsRequest
Resp = m.DescribeTopicPartitionsResponse
Topic = Resp.DescribeTopicPartitionsResponseTopic
Partition = Topic.DescribeTopicPartitionsResponsePartition


def encode(kind: str, message: object) -> bytes:
    schema = m.request_schema(API) if kind == "request" else m.response_schema(API)
    return b"".join(bytes(p) for p in encode_body(schema, 0, message))  # type: ignore[arg-type]


def decode(kind: str, data: bytes) -> object:
    schema = m.request_schema(API) if kind == "request" else m.response_schema(API)
    return decode_body(schema, 0, memoryview(data))


def test_a_request_without_a_cursor_sends_null() -> None:
    request = Req(topics=[Req.TopicRequest(name="ab")], response_partition_limit=3)
    assert request.cursor is None  # the schema's default is null, not an empty cursor
    wire = bytes.fromhex(
        "02" "03" "6162" "00"  # one topic: compact string "ab", no tagged fields
        "00000003"  # ResponsePartitionLimit
        "ff"  # Cursor: null
        "00"  # no tagged fields
    )  # fmt: skip
    assert encode("request", request) == wire
    assert decode("request", wire) == request


def test_a_request_with_a_cursor() -> None:
    request = Req(topics=[], response_partition_limit=2000,
                  cursor=Req.Cursor(topic_name="ab", partition_index=7))  # fmt: skip
    wire = bytes.fromhex(
        "01"  # no topics (all of them)
        "000007d0"  # 2000
        "01" "03" "6162" "00000007" "00"  # Cursor present: "ab", partition 7, no tags
        "00"
    )  # fmt: skip
    assert encode("request", request) == wire
    assert decode("request", wire) == request


def test_a_response_page_and_its_next_cursor() -> None:
    topic_id = uuid.UUID("00112233-4455-6677-8899-aabbccddeeff")
    partition = Partition(error_code=0, partition_index=1, leader_id=2, leader_epoch=5,
                          replica_nodes=[2], isr_nodes=[2], eligible_leader_replicas=[],
                          last_known_elr=None, offline_replicas=[])  # fmt: skip
    topic = Topic(error_code=0, name="ab", topic_id=topic_id, is_internal=True,
                  partitions=[partition], topic_authorized_operations=256)  # fmt: skip
    response = Resp(throttle_time_ms=0, topics=[topic],
                    next_cursor=Resp.Cursor(topic_name="ab", partition_index=2))  # fmt: skip
    wire = bytes.fromhex(
        "00000000"  # ThrottleTimeMs
        "02"  # one topic
        "0000" "03" "6162" "00112233445566778899aabbccddeeff" "01"  # error, name, id, internal
        "02"  # one partition
        "0000" "00000001" "00000002" "00000005"  # error, index, leader, leader epoch
        "02" "00000002" "02" "00000002"  # replicas [2], ISR [2]
        "01" "00" "01"  # ELR [], last known ELR null, offline []
        "00"  # partition's tagged fields
        "00000100" "00"  # TopicAuthorizedOperations (DESCRIBE), topic's tagged fields
        "01" "03" "6162" "00000002" "00"  # NextCursor "ab" partition 2
        "00"
    )  # fmt: skip
    assert encode("response", response) == wire
    assert decode("response", wire) == response
    last_page = Resp(throttle_time_ms=0, topics=[])
    assert last_page.next_cursor is None
    assert encode("response", last_page) == bytes.fromhex("00000000 01 ff 00")
