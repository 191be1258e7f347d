"""Produce's refusals in Kafka's order of precedence (handleProduceRequest, then the
partition's guard): the request's (acks), the topic's (an internal topic), the
partition's (unknown here), its batch's (no records); a good partition beside them
is appended. The services are the handler unit tests' real ones (memory logs)."""

from __future__ import annotations

from typing import Any

from tests.unit.handlers.test_handler_effects import Services, context
from trio_broker.handlers.produce import handle_produce
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.protocol.records import build_batch

Req = m.ProduceRequest


def request(acks: int, *entries: tuple[str, int, bytes | None]) -> Any:
    topics: dict[str, list[Any]] = {}
    for name, index, records in entries:
        records = None if records is None else bytearray(records)
        topics.setdefault(name, []).append(
            Req.TopicProduceData.PartitionProduceData(index=index, records=records)
        )
    data = [Req.TopicProduceData(name=n, partition_data=p) for n, p in topics.items()]
    return Req(transactional_id=None, acks=acks, timeout_ms=1000, topic_data=data)


def answers(response: Any) -> dict[tuple[str, int], tuple[int, str | None, int]]:
    return {
        (t.name, p.index): (p.error_code, p.error_message, p.base_offset)
        for t in response.responses
        for p in t.partition_responses
    }


BATCH = build_batch([(b"k", b"v")], base_timestamp=0)


async def test_an_invalid_acks_refuses_every_partition_before_anything_else() -> None:
    services = Services()
    services.topics.create("t", 1)
    response = await handle_produce(
        context(services, m.ApiKey.PRODUCE, 9),
        request(2, ("t", 0, BATCH), ("__consumer_offsets", 0, BATCH), ("gone", 0, BATCH)),
    )
    assert set(answers(response).values()) == {(ErrorCode.INVALID_REQUIRED_ACKS, None, -1)}
    assert services.topics.get("t").logs[0].log_end_offset == 0  # nothing appended


async def test_the_topic_the_partition_then_the_batch() -> None:
    services = Services()
    services.topics.create("t", 1)
    response = await handle_produce(
        context(services, m.ApiKey.PRODUCE, 9),
        request(
            1,
            # An internal topic is refused as one before it is looked up (none exists here).
            ("__consumer_offsets", 0, BATCH),
            ("t", 5, BATCH),  # no such partition
            ("t", 0, b""),  # no records
            ("gone", 0, BATCH),
        ),
    )
    assert answers(response) == {
        ("__consumer_offsets", 0): (
            ErrorCode.INVALID_TOPIC_EXCEPTION,
            "Cannot append to internal topic __consumer_offsets",
            -1,
        ),
        ("t", 5): (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, None, -1),
        ("t", 0): (ErrorCode.INVALID_RECORD, "no records", -1),
        ("gone", 0): (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, None, -1),
    }


async def test_a_good_partition_is_appended_beside_refused_ones() -> None:
    services = Services()
    services.topics.create("t", 2)
    response = await handle_produce(
        context(services, m.ApiKey.PRODUCE, 9),
        request(1, ("t", 0, BATCH), ("t", 1, b""), ("t", 0, BATCH)),
    )
    parts = response.responses[0].partition_responses
    assert [(p.index, p.error_code, p.base_offset) for p in parts] == [
        (0, ErrorCode.NONE, 0),
        (1, ErrorCode.INVALID_RECORD, -1),
        (0, ErrorCode.NONE, 1),
    ]
    assert services.topics.get("t").logs[0].log_end_offset == 2
