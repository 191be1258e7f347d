"""librdkafka's request quirks against a real broker.

librdkafka writes some flexible-version requests with bytes left over after the
body (it reserves a 4-byte int32 for a count and, for "all topics", never
shrinks it to the 1-byte compact form). Kafka's parser ignores what follows the
body, so we must too, or ``AdminClient.list_topics()`` and ``kcat -L`` fail.
"""

from __future__ import annotations

import uuid

import trio
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from trio_broker.protocol import messages as m
from trio_broker.protocol.messages import ApiKey, decode_request, encode_request


def test_a_request_with_bytes_after_its_body_decodes() -> None:
    request = m.MetadataRequest(topics=None, allow_auto_topic_creation=True)
    frame = encode_request(ApiKey.METADATA, 13, 7, "rdkafka", request)[4:]
    # The all-topics Metadata v13 body librdkafka sends: 00 00 00 00 | 01 00 00.
    header, body = decode_request(frame + b"\x01\x00\x00")
    assert (header.api_key, header.api_version, header.correlation_id) == (3, 13, 7)
    assert body.topics is None


async def test_confluent_admin_list_topics_sees_every_topic(bootstrap: str) -> None:
    topics = [f"listed-{uuid.uuid4().hex[:8]}" for _ in range(3)]

    def produce_then_list() -> set[str]:
        producer = Producer({"bootstrap.servers": bootstrap})
        for topic in topics:
            producer.produce(topic, b"x")
        assert producer.flush(30) == 0
        metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=30)
        return set(metadata.topics)

    listed = await trio.to_thread.run_sync(produce_then_list)
    assert set(topics) <= listed
