"""min.insync.replicas is a dynamic broker config: a new cluster-wide default (the BROKER
resource "", as ``kafka-configs --entity-type brokers --entity-default --alter
--add-config min.insync.replicas=2``) or a new value for this broker rules acks=all
writes at once, without a restart; a topic's own setting still wins.

An in-process broker leads two partitions as a cluster's leader (a replica manager; the
other replica, broker 2, is out of the ISR), asked over a real socket. With the config
file's min.insync.replicas=1 an acks=all write succeeds; after the dynamic default is set
to 2 the same write is NOT_ENOUGH_REPLICAS, except on the topic that sets 1 itself;
removing the dynamic value brings 1 back. Before the fix the key was refused as not
dynamic (INVALID_REQUEST) and the terms kept the config file's value.
"""

from __future__ import annotations

import trio

from tests.integration.raw_client import RawClient
from tests.integration.stand_in import stand_in_replica_manager
from trio_broker.cluster.replica_manager import ReplicaManager
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.protocol.records import build_batch
from trio_broker.server.broker import Broker
from trio_broker.services.cluster_view import PartitionInfo, TopicInfo

INHERITS, OWN = "inherits", "sets-its-own"
FOLLOWER = 2
SET, DELETE = 0, 1  # IncrementalAlterConfigs operations
BROKER_RESOURCE = 4


async def lead(broker: Broker) -> ReplicaManager:
    me = broker.config.node_id
    manager = stand_in_replica_manager(broker)
    info = PartitionInfo((me, FOLLOWER), me, 1, (me,))  # broker 2 is out of the ISR
    for name, configs in ((INHERITS, {}), (OWN, {"min.insync.replicas": "1"})):
        topic = broker.topics.create(name, 1, configs)
        assert topic.topic_id is not None
        manager.view.topics[name] = TopicInfo(name, topic.topic_id, {0: info})
        await manager._become_leader(name, 0, info)
    broker.replication = manager
    return manager


async def produce_acks_all(stream: trio.SocketStream, topic: str) -> int:
    Req = m.ProduceRequest
    request = Req(
        acks=-1, timeout_ms=10_000,
        topic_data=[Req.TopicProduceData(name=topic, partition_data=[
            Req.TopicProduceData.PartitionProduceData(
                index=0, records=bytes(build_batch([(None, b"v")]))
            )
        ])],
    )  # fmt: skip
    produced = await RawClient(stream).call(m.ApiKey.PRODUCE, 9, request)
    return int(produced.responses[0].partition_responses[0].error_code)


async def alter_broker(stream: trio.SocketStream, name: str, operation: int) -> int:
    Req = m.IncrementalAlterConfigsRequest
    Res = Req.AlterConfigsResource
    request = Req(
        validate_only=False,
        resources=[Res(resource_type=BROKER_RESOURCE, resource_name=name, configs=[
            Res.AlterableConfig(name="min.insync.replicas", config_operation=operation,
                                value="2" if operation == SET else None)
        ])],
    )  # fmt: skip
    response = await RawClient(stream).call(m.ApiKey.INCREMENTAL_ALTER_CONFIGS, 1, request)
    return int(response.responses[0].error_code)


async def test_a_dynamic_min_insync_default_rules_acks_all_without_a_restart(
    broker: Broker,
) -> None:
    manager = await lead(broker)
    host, port = broker.bound[0]
    async with await trio.open_tcp_stream(host, port) as stream:
        assert await produce_acks_all(stream, INHERITS) == ErrorCode.NONE
        assert await alter_broker(stream, "", SET) == ErrorCode.NONE  # the cluster default
        assert manager.terms[INHERITS, 0].min_insync_replicas == 2
        assert await produce_acks_all(stream, INHERITS) == ErrorCode.NOT_ENOUGH_REPLICAS
        assert await produce_acks_all(stream, OWN) == ErrorCode.NONE  # its own 1 wins
        assert await alter_broker(stream, "", DELETE) == ErrorCode.NONE
        assert await produce_acks_all(stream, INHERITS) == ErrorCode.NONE
        # This broker's own dynamic value, too.
        assert await alter_broker(stream, str(broker.config.node_id), SET) == ErrorCode.NONE
        assert await produce_acks_all(stream, INHERITS) == ErrorCode.NOT_ENOUGH_REPLICAS


async def test_a_term_begun_after_the_change_takes_the_dynamic_default(broker: Broker) -> None:
    host, port = broker.bound[0]
    async with await trio.open_tcp_stream(host, port) as stream:
        assert await alter_broker(stream, "", SET) == ErrorCode.NONE
    manager = await lead(broker)
    assert manager.terms[INHERITS, 0].min_insync_replicas == 2
    assert manager.terms[OWN, 0].min_insync_replicas == 1
