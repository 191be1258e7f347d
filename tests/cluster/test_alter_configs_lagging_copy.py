"""A topic config change taken by a broker whose copy lags ZooKeeper keeps the others.

A broker's copy of a topic follows the topic's config znode through a watch, a moment
after each change. A broker that applied an AlterConfigs to its copy first and then
wrote its copy's whole override set to ZooKeeper undid any change its watch had not
applied yet, including one of its own watch racing the request: found as the CI flake
of test_throttle_configs_through_confluent_kafka, where broker 1 (a replica) answered
the SET of leader.replication.throttled.replicas and then never described it.
The change is made on ZooKeeper's value, with a conditional write, as on a broker
without a copy.

Here a real in-process broker with a real replica manager holds a copy, ZooKeeper (the
in-memory twin) holds an override its copy lacks (no config watch runs: the lag, held
open), and IncrementalAlterConfigs SETs another key over a socket.
"""

from __future__ import annotations

import json
from pathlib import Path

import trio

from tests.e2e.conftest import RawConnection
from trio_broker.cluster.coordination import MemoryCoordination, MemoryZooKeeper
from trio_broker.cluster.replica_manager import ReplicaManager
from trio_broker.cluster.topic_admin import encode_configs
from trio_broker.cluster.zk_layout import TopicAssignment, topic_config_path, topic_path
from trio_broker.config import BrokerConfig
from trio_broker.protocol import messages as m
from trio_broker.server.broker import Broker
from trio_broker.services.cluster_view import ClusterView, PartitionInfo, TopicInfo

TOPIC = "lagging"
TOPIC_RESOURCE, SET = 2, 0


async def test_a_change_on_a_lagging_copy_keeps_what_zookeeper_holds(tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        broker: Broker = await nursery.start(
            Broker(BrokerConfig(port=0, data_dir=tmp_path, storage="memory")).run
        )
        coord = MemoryCoordination(MemoryZooKeeper())
        manager = ReplicaManager(
            ClusterView(1), coord, broker.topics, min_insync_replicas=1,
            replica_lag_time_max_ms=30_000, now_ms=broker.now_ms, durability=broker.durability,
        )  # fmt: skip
        topic = broker.topics.create(TOPIC, 1)
        assert topic.topic_id is not None
        await coord.create(topic_path(TOPIC), TopicAssignment(topic.topic_id, {0: (1,)}).encode())
        # Set through another broker; this broker's watch has not applied it yet.
        await coord.create(topic_config_path(TOPIC), encode_configs({"retention.ms": "60000"}))
        manager.view.topics[TOPIC] = TopicInfo(
            TOPIC, topic.topic_id, {0: PartitionInfo((1,), 1, 0, (1,))}
        )
        manager.local_copies.add(TOPIC)
        broker.joined(manager, manager.admin)  # as broker_node does once it joined
        port = broker.bound[0][1]

        def set_segment_ms() -> int:
            Req = m.IncrementalAlterConfigsRequest
            body = Req(resources=[Req.AlterConfigsResource(
                resource_type=TOPIC_RESOURCE, resource_name=TOPIC,
                configs=[Req.AlterConfigsResource.AlterableConfig(
                    name="segment.ms", config_operation=SET, value="3600000")],
            )], validate_only=False)  # fmt: skip
            with RawConnection(port, timeout=20) as conn:
                answer = conn.request(m.ApiKey.INCREMENTAL_ALTER_CONFIGS, 1, body)
            return int(answer.responses[0].error_code)

        assert await trio.to_thread.run_sync(set_segment_ms) == 0
        node = await coord.get(topic_config_path(TOPIC))
        assert node is not None
        both = {"retention.ms": "60000", "segment.ms": "3600000"}
        assert json.loads(node.data)["config"] == both, "a change another broker made was lost"
        # The broker that took it shows ZooKeeper's value in its copy at once.
        assert dict(topic.info.configs) == both
        nursery.cancel_scope.cancel()
