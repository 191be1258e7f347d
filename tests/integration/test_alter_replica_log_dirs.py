"""AlterReplicaLogDirs (34) and DescribeLogDirs on a broker with two log dirs, over the
wire (in-process broker, raw codec): every version, authorization, Kafka's errors."""

from __future__ import annotations

from pathlib import Path

import trio

from tests.integration.raw_client import RawClient
from trio_broker.config import BrokerConfig
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.security.acl import AclBinding, Operation, PatternType, Permission, ResourceType
from trio_broker.server.broker import Broker

Req = m.AlterReplicaLogDirsRequest


def alter(moves: dict[str, dict[str, list[int]]]) -> m.AlterReplicaLogDirsRequest:
    return Req(dirs=[
        Req.AlterReplicaLogDir(path=path, topics=[
            Req.AlterReplicaLogDir.AlterReplicaLogDirTopic(name=t, partitions=ps)
            for t, ps in topics.items()
        ])
        for path, topics in moves.items()
    ])  # fmt: skip


def codes(response: m.AlterReplicaLogDirsResponse) -> dict[tuple[str, int], int]:
    return {(t.topic_name, p.partition_index): p.error_code
            for t in response.results for p in t.partitions}  # fmt: skip


async def log_dirs(raw: RawClient) -> dict[str, list[tuple[str, int]]]:
    DReq = m.DescribeLogDirsRequest
    answer = await raw.call(m.ApiKey.DESCRIBE_LOG_DIRS, 4, DReq(topics=None))
    return {d.log_dir: sorted((t.name, p.partition_index) for t in d.topics
                              for p in t.partitions if t.name == "t")
            for d in answer.results}  # fmt: skip


async def test_moves_need_alter_on_the_cluster_and_answer_as_kafka(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    config = BrokerConfig(port=0, data_dir=a, extra_log_dirs=(b,), authorizer_class_name="acl")
    async with trio.open_nursery() as nursery:
        broker: Broker = await nursery.start(Broker(config).run)
        broker.topics.create("t", 2)
        assert broker.authorizer is not None
        broker.authorizer.store.add([
            AclBinding(ResourceType.CLUSTER, "kafka-cluster", PatternType.LITERAL,
                       "User:ANONYMOUS", "*", Operation.DESCRIBE, Permission.ALLOW)
        ])  # fmt: skip
        host, port = broker.bound[0]
        async with await trio.open_tcp_stream(host, port) as stream:
            raw = RawClient(stream)
            assert await log_dirs(raw) == {str(a): [("t", 0)], str(b): [("t", 1)]}
            for version in (1, 2):
                refused = await raw.call(
                    m.ApiKey.ALTER_REPLICA_LOG_DIRS, version, alter({str(b): {"t": [0]}})
                )
                assert codes(refused) == {("t", 0): ErrorCode.CLUSTER_AUTHORIZATION_FAILED}
            assert await log_dirs(raw) == {str(a): [("t", 0)], str(b): [("t", 1)]}
            broker.authorizer.store.add([
                AclBinding(ResourceType.CLUSTER, "kafka-cluster", PatternType.LITERAL,
                           "User:ANONYMOUS", "*", Operation.ALTER, Permission.ALLOW)
            ])  # fmt: skip
            answer = await raw.call(m.ApiKey.ALTER_REPLICA_LOG_DIRS, 2, alter({
                str(b): {"t": [0, 1, 5], "nope": [0]},  # 1 is there already
                str(tmp_path / "c"): {"u": [0]},
                "b": {"v": [0]},  # relative: not one of the dirs' absolute paths
            }))  # fmt: skip
            assert codes(answer) == {
                ("t", 0): ErrorCode.NONE, ("t", 1): ErrorCode.NONE,
                ("t", 5): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                ("nope", 0): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                ("u", 0): ErrorCode.LOG_DIR_NOT_FOUND, ("v", 0): ErrorCode.LOG_DIR_NOT_FOUND,
            }  # fmt: skip
            assert await log_dirs(raw) == {str(a): [], str(b): [("t", 0), ("t", 1)]}
        nursery.cancel_scope.cancel()
