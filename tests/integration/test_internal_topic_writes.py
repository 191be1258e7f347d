"""A broker alone and the internal topics' names: a client's Produce into one is
INVALID_TOPIC_EXCEPTION (Kafka's "Cannot append to internal topic"), but from Kafka's
admin client id; DescribeConfigs no longer refuses the name itself (alone, the broker
keeps group offsets and transaction state in private files, so the topic is unknown).
The cluster side: tests/cluster/test_internal_topics.py."""

from __future__ import annotations

import pytest
import trio

from tests.integration.raw_client import RawClient
from trio_broker.handlers import load_handlers
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.protocol.records import build_batch
from trio_broker.server.broker import Broker

load_handlers()


async def _client(broker: Broker, client_id: str) -> tuple[trio.SocketStream, RawClient]:
    host, port = broker.bound[0]
    stream = await trio.open_tcp_stream(host, port)
    return stream, RawClient(stream, client_id)


async def _produce(client: RawClient, topic: str, acks: int = -1) -> ErrorCode:
    Req = m.ProduceRequest
    data = Req.TopicProduceData(
        name=topic,
        partition_data=[
            Req.TopicProduceData.PartitionProduceData(
                index=0, records=bytes(build_batch([(b"k", b"v")]))
            )
        ],
    )
    request = Req(transactional_id=None, acks=acks, timeout_ms=5000, topic_data=[data])
    response = await client.call(m.ApiKey.PRODUCE, 9, request)
    return ErrorCode(response.responses[0].partition_responses[0].error_code)


@pytest.mark.parametrize("topic", ["__consumer_offsets", "__transaction_state"])
async def test_clients_may_not_produce_to_internal_topics(broker: Broker, topic: str) -> None:
    stream, client = await _client(broker, "an-application")
    async with stream:
        assert await _produce(client, topic) == ErrorCode.INVALID_TOPIC_EXCEPTION
        assert await _produce(client, topic, acks=1) == ErrorCode.INVALID_TOPIC_EXCEPTION
        assert await _produce(client, "ordinary") == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    # Kafka's own admin client id may write them: here they are no topics (alone).
    stream, admin = await _client(broker, "__admin_client")
    async with stream:
        assert await _produce(admin, topic) == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


async def test_describe_configs_takes_internal_names(broker: Broker) -> None:
    stream, client = await _client(broker, "an-application")
    Req = m.DescribeConfigsRequest
    async with stream:
        response = await client.call(
            m.ApiKey.DESCRIBE_CONFIGS, 4,
            Req(resources=[Req.DescribeConfigsResource(
                resource_type=2, resource_name="__consumer_offsets", configuration_keys=None)],
                include_synonyms=False, include_documentation=False),
        )  # fmt: skip
    [result] = response.results
    assert result.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
