"""Produce with a transactional id needs WRITE on it (Kafka's rule), over a real socket
to an in-process broker with the ACL authorizer; ``User:ANONYMOUS`` is the client."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from tests.integration.raw_client import RawClient
from trio_broker.config import BrokerConfig
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.protocol.records import build_batch
from trio_broker.security.acl import AclBinding, Operation, PatternType, Permission
from trio_broker.security.acl import ResourceType as RT
from trio_broker.server.broker import Broker

pytestmark = pytest.mark.timeout(300)
ME = "User:ANONYMOUS"


@pytest.fixture
def broker_config(tmp_path: Path) -> BrokerConfig:
    return BrokerConfig(port=0, data_dir=tmp_path / "data", authorizer_class_name="acl")


def grant(broker: Broker, rtype: RT, name: str, op: Operation) -> None:
    assert broker.authorizer is not None
    broker.authorizer.store.add(
        [AclBinding(rtype, name, PatternType.LITERAL, ME, "*", op, Permission.ALLOW)]
    )


async def test_transactional_produce_needs_write_on_the_transactional_id(broker: Broker) -> None:
    broker.topics.create("t", 1)
    grant(broker, RT.TOPIC, "t", Operation.WRITE)
    Req = m.ProduceRequest

    def body(transactional_id: str | None) -> m.ProduceRequest:
        data = Req.TopicProduceData.PartitionProduceData(
            index=0, records=bytes(build_batch([(None, b"x")]))
        )
        return Req(
            transactional_id=transactional_id, acks=1, timeout_ms=5000,
            topic_data=[Req.TopicProduceData(name="t", partition_data=[data])],
        )  # fmt: skip

    stream = await trio.open_tcp_stream(*broker.bound[0])
    async with stream:
        client = RawClient(stream)

        async def error_of(transactional_id: str | None) -> int:
            response = await client.call(m.ApiKey.PRODUCE, 9, body(transactional_id))
            return int(response.responses[0].partition_responses[0].error_code)

        assert await error_of("tx") == ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        assert await error_of(None) == ErrorCode.NONE
        grant(broker, RT.TRANSACTIONAL_ID, "tx", Operation.WRITE)
        # Allowed now; the (non-transactional) batch itself is fine.
        assert await error_of("tx") == ErrorCode.NONE
