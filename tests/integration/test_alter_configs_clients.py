"""AlterConfigs and IncrementalAlterConfigs with kafka-python and confluent-kafka.

A change must be visible three ways: DescribeConfigs reports it with source
DYNAMIC_TOPIC_CONFIG, the live partition logs use it (a lowered
max.message.bytes refuses the next big batch), and the topic catalogue keeps
it across a restart. Bad keys and values change nothing and answer
INVALID_CONFIG; validate_only changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
import trio
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry
from confluent_kafka.admin import ConfigResource as CConfigResource
from confluent_kafka.admin import ResourceType as CResourceType
from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient

from tests.integration.raw_client import RawClient
from trio_broker.config import BrokerConfig
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.security.acl import AclBinding, Operation, PatternType, Permission, ResourceType
from trio_broker.server.broker import Broker

T = TypeVar("T")
pytestmark = pytest.mark.timeout(300)


async def in_thread(fn: Callable[[], T]) -> T:
    return await trio.to_thread.run_sync(fn)


@pytest.fixture(params=["file", "memory"])
def broker_config(request: pytest.FixtureRequest, tmp_path: Path) -> BrokerConfig:
    return BrokerConfig(port=0, data_dir=tmp_path / "data", storage=request.param)


def describe(bootstrap: str, topic: str, config_filter: str = "modified") -> dict[str, Any]:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        result = admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, topic)], config_filter=config_filter
        )
    finally:
        admin.close()
    configs: dict[str, Any] = result["topic"][topic]
    return configs


async def test_kafka_python_alters_and_the_change_is_live(broker: Broker, bootstrap: str) -> None:
    broker.topics.create("tuned", 1)

    def run() -> tuple[Any, Any, Any]:
        admin = KafkaAdminClient(bootstrap_servers=bootstrap)
        try:
            # IncrementalAlterConfigs (the client's default when the broker has it).
            first = admin.alter_configs([
                ConfigResource(ConfigResourceType.TOPIC, "tuned", configs={
                    "retention.ms": "3600000", "max.message.bytes": "2000",
                    "segment.bytes": "1048576",
                }),
            ])  # fmt: skip
            # Legacy AlterConfigs.
            legacy = admin.alter_configs(
                [ConfigResource(ConfigResourceType.TOPIC, "tuned",
                                configs={"retention.bytes": "123456789"})],
                incremental=False,
            )  # fmt: skip
            bad = admin.alter_configs(
                [ConfigResource(ConfigResourceType.TOPIC, "tuned",
                                configs={"no.such.config": "1"})],
                raise_on_unknown=False,
            )  # fmt: skip
            return first, legacy, bad
        finally:
            admin.close()

    first, legacy, bad = await in_thread(run)
    assert first == {"topic": {"tuned": "OK"}}
    assert legacy == {"topic": {"tuned": "OK"}}
    assert "InvalidConfiguration" in bad["topic"]["tuned"]
    configs = await in_thread(lambda: describe(bootstrap, "tuned"))
    for key, value in {
        "retention.ms": "3600000", "max.message.bytes": "2000", "segment.bytes": "1048576",
        "retention.bytes": "123456789",
    }.items():  # fmt: skip
        assert configs[key]["value"] == value, key
        assert configs[key]["config_source"] == "DYNAMIC_TOPIC_CONFIG", key
    log = broker.topics.log("tuned", 0)
    assert (log.config.retention_ms, log.config.segment_bytes) == (3_600_000, 1_048_576)
    assert log.config.retention_bytes == 123_456_789

    def produce() -> list[Any]:
        errors: list[Any] = []
        producer = Producer({"bootstrap.servers": bootstrap, "message.send.max.retries": 0})
        for size in (100, 5000):
            producer.produce("tuned", b"x" * size, on_delivery=lambda e, m: errors.append(e))
            producer.flush(20)
        return errors

    small, big = await in_thread(produce)
    assert small is None
    assert big.code() == KafkaError.MSG_SIZE_TOO_LARGE


async def test_confluent_incremental_and_legacy_alter(broker: Broker, bootstrap: str) -> None:
    broker.topics.create("inc", 1)
    broker.topics.set_configs("inc", {"retention.ms": "1000", "segment.ms": "60000"})

    def alter(
        resource: CConfigResource, *, legacy: bool = False, validate_only: bool = False
    ) -> Any:
        admin = AdminClient({"bootstrap.servers": bootstrap})
        call = admin.alter_configs if legacy else admin.incremental_alter_configs
        [future] = call([resource], validate_only=validate_only).values()
        try:
            future.result(timeout=60)
        except KafkaException as exc:
            return exc.args[0].code()
        return None

    def entry(name: str, value: str | None, op: AlterConfigOpType) -> ConfigEntry:
        return ConfigEntry(name, value, incremental_operation=op)

    def res(*entries: ConfigEntry) -> CConfigResource:
        return CConfigResource(CResourceType.TOPIC, "inc", incremental_configs=list(entries))

    SET, DELETE = AlterConfigOpType.SET, AlterConfigOpType.DELETE
    assert await in_thread(lambda: alter(res(entry("segment.ms", "120000", SET),
                                             entry("retention.ms", None, DELETE)))) is None  # fmt: skip
    assert broker.topics.get("inc").info.configs == {"segment.ms": "120000"}  # type: ignore[union-attr]
    assert broker.topics.log("inc", 0).config.segment_ms == 120_000

    # validate_only checks but changes nothing.
    assert await in_thread(
        lambda: alter(res(entry("retention.ms", "5000", SET)), validate_only=True)
    ) is None  # fmt: skip
    assert broker.topics.get("inc").info.configs == {"segment.ms": "120000"}  # type: ignore[union-attr]

    # cleanup.policy=compact,delete is taken and reaches the logs (docs/compaction.md).
    assert (
        await in_thread(lambda: alter(res(entry("cleanup.policy", "compact,delete", SET)))) is None
    )
    assert broker.topics.log("inc", 0).config.compact
    assert broker.topics.log("inc", 0).config.delete
    assert await in_thread(lambda: alter(res(entry("cleanup.policy", None, DELETE)))) is None
    assert not broker.topics.log("inc", 0).config.compact

    # Refused: unknown policies and keys, malformed and out-of-range values; nothing changes.
    invalid = KafkaError.INVALID_CONFIG
    for bad in (
        entry("cleanup.policy", "compact,shred", SET), entry("no.such.key", "1", SET),
        entry("min.cleanable.dirty.ratio", "1.5", SET),
        entry("retention.ms", "soon", SET), entry("segment.bytes", "5", SET),
        entry("retention.ms", "x", AlterConfigOpType.APPEND),
        entry("min.insync.replicas", "many", SET), entry("preallocate", "maybe", SET),
        entry("compression.type", "brotli", SET), entry("retention.ms", "-2", SET),
    ):  # fmt: skip
        assert await in_thread(lambda bad=bad: alter(res(bad))) == invalid, bad
    assert broker.topics.get("inc").info.configs == {"segment.ms": "120000"}  # type: ignore[union-attr]

    # Legacy AlterConfigs replaces the whole override set.
    legacy = CConfigResource(CResourceType.TOPIC, "inc", set_config={"cleanup.policy": "delete"})
    assert await in_thread(lambda: alter(legacy, legacy=True)) is None
    assert broker.topics.get("inc").info.configs == {"cleanup.policy": "delete"}  # type: ignore[union-attr]
    assert broker.topics.log("inc", 0).config.segment_ms == broker.config.segment_ms

    # Unknown topic; a broker key that is not dynamic (Kafka: 42).
    missing = CConfigResource(CResourceType.TOPIC, "nope", set_config={"retention.ms": "1"})
    assert await in_thread(lambda: alter(missing, legacy=True)) == (
        KafkaError.UNKNOWN_TOPIC_OR_PART
    )
    static = CConfigResource(CResourceType.BROKER, "0", set_config={"num.partitions": "3"})
    assert await in_thread(lambda: alter(static, legacy=True)) == KafkaError.INVALID_REQUEST


async def test_altered_configs_survive_a_restart(tmp_path: Path) -> None:
    config = BrokerConfig(port=0, data_dir=tmp_path / "data")
    async with trio.open_nursery() as nursery:
        broker: Broker = await nursery.start(Broker(config).run)
        broker.topics.create("kept", 2)
        bootstrap = f"127.0.0.1:{broker.bound[0][1]}"

        def alter() -> Any:
            admin = KafkaAdminClient(bootstrap_servers=bootstrap)
            try:
                return admin.alter_configs(
                    [ConfigResource(ConfigResourceType.TOPIC, "kept",
                                    configs={"retention.ms": "7200000"})]
                )  # fmt: skip
            finally:
                admin.close()

        assert await in_thread(alter) == {"topic": {"kept": "OK"}}
        nursery.cancel_scope.cancel()
    async with trio.open_nursery() as nursery:
        broker = await nursery.start(Broker(config).run)
        assert [log.config.retention_ms for log in broker.topics.get("kept").logs] == [  # type: ignore[union-attr]
            7_200_000, 7_200_000,
        ]  # fmt: skip
        bootstrap = f"127.0.0.1:{broker.bound[0][1]}"
        configs = await in_thread(lambda: describe(bootstrap, "kept"))
        assert configs["retention.ms"]["value"] == "7200000"
        assert configs["retention.ms"]["config_source"] == "DYNAMIC_TOPIC_CONFIG"
        nursery.cancel_scope.cancel()


async def test_alter_configs_needs_alter_configs_permission(tmp_path: Path) -> None:
    config = BrokerConfig(port=0, data_dir=tmp_path / "data", authorizer_class_name="acl")
    async with trio.open_nursery() as nursery:
        broker: Broker = await nursery.start(Broker(config).run)
        broker.topics.create("guarded", 1)
        broker.topics.create("open", 1)
        assert broker.authorizer is not None
        broker.authorizer.store.add([
            AclBinding(ResourceType.TOPIC, name, PatternType.LITERAL, "User:ANONYMOUS", "*", op,
                       Permission.ALLOW)
            for name, op in (("guarded", Operation.DESCRIBE_CONFIGS),
                             ("open", Operation.ALTER_CONFIGS))
        ])  # fmt: skip
        bootstrap = f"127.0.0.1:{broker.bound[0][1]}"

        def alter() -> Any:
            admin = KafkaAdminClient(bootstrap_servers=bootstrap)
            try:
                return admin.alter_configs([
                    ConfigResource(ConfigResourceType.TOPIC, name, configs={"retention.ms": "1"})
                    for name in ("guarded", "open")
                ])  # fmt: skip
            finally:
                admin.close()

        result = await in_thread(alter)
        assert "TopicAuthorizationFailed" in result["topic"]["guarded"]
        assert result["topic"]["open"] == "OK"
        assert broker.topics.get("guarded").info.configs == {}  # type: ignore[union-attr]
        nursery.cancel_scope.cancel()


def describe_broker(bootstrap: str, node: int) -> dict[str, Any]:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        result = admin.describe_configs(
            [ConfigResource(ConfigResourceType.BROKER, str(node))], include_synonyms=True
        )
    finally:
        admin.close()
    configs: dict[str, Any] = result["broker"][str(node)]
    return configs


async def raw_alter(broker: Broker, node: str, *entries: tuple[str, str | None, int],
                    validate_only: bool = False) -> int:  # fmt: skip
    """IncrementalAlterConfigs v1 on a BROKER resource over our codec (the clients cannot
    name the cluster default "" or another node); the resource's error code."""
    Req = m.IncrementalAlterConfigsRequest
    Res = Req.AlterConfigsResource
    configs = [Res.AlterableConfig(name=k, config_operation=op, value=v) for k, v, op in entries]
    request = Req(resources=[Res(resource_type=4, resource_name=node, configs=configs)],
                  validate_only=validate_only)  # fmt: skip
    host, port = broker.bound[0]
    async with await trio.open_tcp_stream(host, port) as stream:
        response = await RawClient(stream).call(m.ApiKey.INCREMENTAL_ALTER_CONFIGS, 1, request)
    return int(response.responses[0].error_code)


async def test_dynamic_broker_configs(tmp_path: Path) -> None:
    """KIP-226 for the log defaults: the cluster default ("") and this broker's value (its
    id; it wins) become the defaults of every topic that does not set the key, live, in
    DescribeConfigs and across a restart; DELETE goes back to the config file's value."""
    config = BrokerConfig(port=0, data_dir=tmp_path / "data", retention_ms=86_400_000)
    SET, DELETE = 0, 1
    ok, invalid = ErrorCode.NONE, ErrorCode.INVALID_REQUEST

    async with trio.open_nursery() as nursery:
        broker: Broker = await nursery.start(Broker(config).run)
        bootstrap = f"127.0.0.1:{broker.bound[0][1]}"
        broker.topics.create("inherits", 1)
        broker.topics.create("overrides", 1, {"retention.ms": "5000"})
        log, own = broker.topics.log("inherits", 0), broker.topics.log("overrides", 0)
        assert log is not None and own is not None and log.config.retention_ms == 86_400_000

        assert await raw_alter(broker, "", ("log.retention.ms", "7200000", SET),
                               ("log.segment.bytes", "1048576", SET)) == ok  # fmt: skip
        assert (log.config.retention_ms, log.config.segment_bytes) == (7_200_000, 1_048_576)

        def alter_this_broker() -> None:  # a real client (confluent-kafka) on node id 0
            change = ConfigEntry("log.retention.ms", "3600000",
                                 incremental_operation=AlterConfigOpType.SET)  # fmt: skip
            node = CConfigResource(CResourceType.BROKER, "0", incremental_configs=[change])
            admin = AdminClient({"bootstrap.servers": bootstrap})
            [future] = admin.incremental_alter_configs([node]).values()
            future.result(timeout=60)

        await in_thread(alter_this_broker)
        assert log.config.retention_ms == 3_600_000  # this broker's value wins
        assert own.config.retention_ms == 5000  # the topic's own setting wins over both
        assert broker.topics.create("new", 1).logs[0].config.retention_ms == 3_600_000

        configs = await in_thread(lambda: describe_broker(bootstrap, 0))
        retention = configs["log.retention.ms"]
        assert (retention["value"], retention["config_source"]) == (
            "3600000", "DYNAMIC_BROKER_CONFIG"
        )  # fmt: skip
        assert [(s["value"], s["source"]) for s in retention["synonyms"]] == [
            ("3600000", "DYNAMIC_BROKER_CONFIG"), ("7200000", "DYNAMIC_DEFAULT_BROKER_CONFIG"),
            ("86400000", "STATIC_BROKER_CONFIG"), ("604800000", "DEFAULT_CONFIG"),
        ]  # fmt: skip
        topic = await in_thread(lambda: describe(bootstrap, "inherits", "all"))
        assert (topic["retention.ms"]["value"], topic["retention.ms"]["config_source"]) == (
            "3600000", "DYNAMIC_BROKER_CONFIG"
        )  # fmt: skip
        assert topic["segment.bytes"]["config_source"] == "DYNAMIC_DEFAULT_BROKER_CONFIG"

        # Refused whole (Kafka: INVALID_REQUEST): a key that is not dynamic, bad values,
        # another broker's id. validate_only checks only. Nothing changes.
        for bad in ((("log.retention.ms", "1", SET), ("num.partitions", "3", SET)),
                    (("log.segment.bytes", "5", SET),), (("log.roll.ms", "soon", SET),)):  # fmt: skip
            assert await raw_alter(broker, "0", *bad) == invalid, bad
        assert await raw_alter(broker, "7", ("log.retention.ms", "1", SET)) == invalid
        assert await raw_alter(broker, "0", ("log.retention.ms", "1000", SET),
                               validate_only=True) == ok  # fmt: skip
        assert log.config.retention_ms == 3_600_000
        nursery.cancel_scope.cancel()

    async with trio.open_nursery() as nursery:
        broker = await nursery.start(Broker(config).run)
        log = broker.topics.log("inherits", 0)
        assert log is not None and log.config.retention_ms == 3_600_000  # kept on disk
        assert await raw_alter(broker, "0", ("log.retention.ms", None, DELETE)) == ok
        assert log.config.retention_ms == 7_200_000  # back to the cluster default
        assert await raw_alter(broker, "", ("log.retention.ms", None, DELETE)) == ok
        assert log.config.retention_ms == 86_400_000  # back to the config file's value
        assert log.config.segment_bytes == 1_048_576
        nursery.cancel_scope.cancel()
