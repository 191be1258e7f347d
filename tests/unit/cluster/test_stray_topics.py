"""The replica manager's stray-topic sweep and conditional config writes, over the
in-memory ZooKeeper: local copies go only when ZooKeeper confirms the cluster lost
them (or holds another topic under the name), never on an empty view's word or when
ZooKeeper fails; a config change made meanwhile by another broker is not overwritten."""

from __future__ import annotations

import uuid

import pytest

from trio_broker.cluster.coordination import (
    CoordinationError,
    MemoryCoordination,
    MemoryZooKeeper,
    Znode,
)
from trio_broker.cluster.replica_manager import ReplicaManager
from trio_broker.cluster.topic_admin import decode_configs, encode_configs
from trio_broker.cluster.zk_layout import TopicAssignment, topic_config_path, topic_path
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.services.cluster_view import ClusterView
from trio_broker.services.topics import TopicError, TopicManager
from trio_broker.storage.log import LogConfig


class _Unreachable(MemoryCoordination):
    async def get(self, path: str) -> Znode | None:
        raise CoordinationError("connection loss")


async def _cluster(coord: MemoryCoordination) -> ReplicaManager:
    for path in ("/brokers", "/brokers/topics", "/config", "/config/topics"):
        await coord.create(path, b"")
    topics = TopicManager(None, LogConfig(), lambda: 0)
    return ReplicaManager(
        ClusterView(1), coord, topics, min_insync_replicas=1, replica_lag_time_max_ms=1000,
        now_ms=lambda: 0, durability=None,
    )  # fmt: skip


async def _make_in_zookeeper(coord: MemoryCoordination, name: str, topic_id: uuid.UUID) -> None:
    await coord.create(topic_config_path(name), encode_configs({}))
    await coord.create(topic_path(name), TopicAssignment(topic_id, {0: (1,)}).encode())


async def test_stray_topics_are_deleted_once_zookeeper_confirms() -> None:
    server = MemoryZooKeeper()
    coord = MemoryCoordination(server)
    manager = await _cluster(coord)
    kept = manager.topics.create("kept", 1)
    manager.topics.create("deleted", 1)
    manager.topics.create("replaced", 1)
    manager.topics.create("__consumer_offsets", 1, internal=True)
    await _make_in_zookeeper(coord, "kept", kept.topic_id)
    await _make_in_zookeeper(coord, "replaced", uuid.uuid4())

    # The view is still empty (not read yet): each candidate is asked about in ZooKeeper.
    assert manager.view.topics == {}
    assert await manager.copies.delete_strays()
    assert sorted(manager.topics.topics) == ["__consumer_offsets", "kept"]


async def test_no_copy_goes_when_zookeeper_holds_no_topic_at_all() -> None:
    server = MemoryZooKeeper()
    manager = await _cluster(MemoryCoordination(server))
    manager.topics.create("precious", 1)
    assert await manager.copies.delete_strays()  # a new or wiped ensemble: nothing is deleted
    assert list(manager.topics.topics) == ["precious"]


async def test_no_copy_goes_while_zookeeper_fails() -> None:
    server = MemoryZooKeeper()
    coord = MemoryCoordination(server)
    manager = await _cluster(coord)
    await _make_in_zookeeper(coord, "other", uuid.uuid4())
    manager.coord = _Unreachable(server)  # lists the topics, then fails every read
    manager.topics.create("orphan", 1)
    assert not await manager.copies.delete_strays()  # asked again at the next view change
    assert list(manager.topics.topics) == ["orphan"]


async def test_a_config_change_made_meanwhile_is_not_lost() -> None:
    server = MemoryZooKeeper()
    coord = MemoryCoordination(server)
    manager = await _cluster(coord)
    await _make_in_zookeeper(coord, "t", uuid.uuid4())
    seen: list[dict[str, str]] = []

    def add_retention(current: dict[str, str]) -> dict[str, str]:
        seen.append(dict(current))
        if len(seen) == 1:  # another broker's write lands between the read and the write
            server.nodes[topic_config_path("t")].data = encode_configs(
                {"cleanup.policy": "compact"}
            )
            server.nodes[topic_config_path("t")].version += 1
        return {**current, "retention.ms": "5"}

    await manager.admin.update_topic_configs("t", add_retention)
    assert seen == [{}, {"cleanup.policy": "compact"}]
    stored = await manager.admin.read_topic_configs("t")
    assert stored == {"cleanup.policy": "compact", "retention.ms": "5"}
    node = await coord.get(topic_config_path("t"))
    assert node is not None and decode_configs(node.data) == stored

    await manager.admin.update_topic_configs("t", lambda current: None)  # validate only
    assert await manager.admin.read_topic_configs("t") == stored
    with pytest.raises(TopicError) as refused:
        await manager.admin.read_topic_configs("missing")
    assert refused.value.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
