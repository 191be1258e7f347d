"""Group configs (the GROUP config resource, type 32) end to end, against a broker process.

librdkafka's own share-consumer tests begin by setting ``share.auto.offset.reset=earliest``
on their group with IncrementalAlterConfigs; before group configs the broker answered
"unsupported resource type 32" and the share partitions started at the log end, so a
share consumer saw none of the records produced before it joined. Here: confluent-kafka's
AdminClient sets and describes group configs, Kafka's refusals (unknown key, out of the
broker's bounds, a bad value, the empty group name) come back with its error codes, the
overrides survive a restart, and a ShareConsumer reads from the log start.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import KafkaException, ShareConsumer
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    ResourceType,
)

from tests.e2e.test_fetch_sessions import MetricsBroker, running_metrics_broker
from tests.e2e.test_share_consumer_librdkafka import make_topic, produce
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode

GROUP_RESOURCE = 32
SET, DELETE, APPEND = 0, 1, 2
DEADLINE_S = 60.0


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MetricsBroker]:
    tmp = tmp_path_factory.mktemp("group-configs")
    with running_metrics_broker(tmp, '"group.share.heartbeat.interval.ms" = 500\n') as process:
        yield process


def group_name() -> str:
    return f"group-cfg-{uuid.uuid4().hex[:8]}"


def alter(
    broker: MetricsBroker, group: str, changes: list[tuple[str, int, str | None]],
    validate_only: bool = False,
) -> tuple[int, str | None]:  # fmt: skip
    Res = m.IncrementalAlterConfigsRequest.AlterConfigsResource
    request = m.IncrementalAlterConfigsRequest(
        resources=[Res(resource_type=GROUP_RESOURCE, resource_name=group, configs=[
            Res.AlterableConfig(name=n, config_operation=op, value=v) for n, op, v in changes])],
        validate_only=validate_only,
    )  # fmt: skip
    with broker.connect() as conn:
        [answer] = conn.request(m.ApiKey.INCREMENTAL_ALTER_CONFIGS, 1, request).responses
    return int(answer.error_code), answer.error_message


def describe(broker: MetricsBroker, group: str) -> tuple[int, dict[str, Any]]:
    Resource = m.DescribeConfigsRequest.DescribeConfigsResource
    request = m.DescribeConfigsRequest(
        resources=[Resource(resource_type=GROUP_RESOURCE, resource_name=group,
                            configuration_keys=None)],
        include_synonyms=True, include_documentation=False,
    )  # fmt: skip
    with broker.connect() as conn:
        [result] = conn.request(m.ApiKey.DESCRIBE_CONFIGS, 4, request).results
    return int(result.error_code), {c.name: c for c in result.configs}


def test_raw_set_describe_delete(broker: MetricsBroker) -> None:
    group = group_name()
    code, configs = describe(broker, group)  # any group name: the defaults
    assert code == ErrorCode.NONE
    lock = configs["share.record.lock.duration.ms"]
    assert (lock.value, lock.config_source, lock.read_only) == ("30000", 5, False)
    assert [(s.name, s.value) for s in lock.synonyms] == [
        ("share.record.lock.duration.ms", "30000"),
        ("group.share.record.lock.duration.ms", "30000"),
    ]
    assert configs["share.auto.offset.reset"].value == "latest"

    assert alter(broker, group, [("share.auto.offset.reset", SET, "earliest")], True)[0] == 0
    assert describe(broker, group)[1]["share.auto.offset.reset"].value == "latest"  # only checked
    changes = [("share.auto.offset.reset", SET, "earliest"),
               ("share.record.lock.duration.ms", SET, "20000")]  # fmt: skip
    assert alter(broker, group, changes) == (ErrorCode.NONE, None)
    configs = describe(broker, group)[1]
    reset = configs["share.auto.offset.reset"]
    assert (reset.value, reset.config_source) == ("earliest", 8)  # GROUP_CONFIG
    lock = configs["share.record.lock.duration.ms"]
    assert (lock.value, lock.config_source) == ("20000", 8)
    assert [(s.name, s.value, s.source) for s in lock.synonyms] == [
        ("share.record.lock.duration.ms", "20000", 8),
        ("group.share.record.lock.duration.ms", "30000", 5),
    ]
    assert alter(broker, group, [("share.record.lock.duration.ms", DELETE, None)])[0] == 0
    configs = describe(broker, group)[1]
    assert configs["share.record.lock.duration.ms"].value == "30000"
    assert configs["share.auto.offset.reset"].value == "earliest"  # untouched by the DELETE


@pytest.mark.parametrize(
    ("change", "code", "message"),
    [
        (("no.such.key", SET, "1"), ErrorCode.INVALID_CONFIG,
         "Unknown group config name: no.such.key"),
        (("share.record.lock.duration.ms", SET, "14999"), ErrorCode.INVALID_CONFIG,
         "share.record.lock.duration.ms must be in the range 15000 to 60000 inclusive."),
        (("share.record.lock.duration.ms", SET, "999"), ErrorCode.INVALID_CONFIG,
         "Value must be at least 1000"),
        (("share.record.lock.duration.ms", SET, "soon"), ErrorCode.INVALID_CONFIG,
         "Not a number of type INT"),
        (("share.auto.offset.reset", SET, "oldest"), ErrorCode.INVALID_CONFIG,
         "'by_duration:<PnDTnHnMn.nS>'"),
        (("share.isolation.level", SET, "dirty"), ErrorCode.INVALID_CONFIG, "String must be"),
        (("share.session.timeout.ms", SET, "15000"), ErrorCode.INVALID_CONFIG,
         "share.session.timeout.ms must be in the range 45000 to 60000 inclusive."),
        (("share.auto.offset.reset", APPEND, "earliest"), ErrorCode.INVALID_CONFIG,
         "is not a list"),
    ],
)  # fmt: skip
def test_raw_refusals(
    broker: MetricsBroker, change: tuple[str, int, str], code: int, message: str
) -> None:
    group = group_name()
    answer = alter(broker, group, [change])
    assert answer[0] == code and message in (answer[1] or ""), answer
    described = describe(broker, group)[1]  # nothing stored
    assert all(c.config_source != 8 for c in described.values())


def test_empty_group_name_refused(broker: MetricsBroker) -> None:
    assert alter(broker, "", [("share.auto.offset.reset", SET, "earliest")]) == (
        ErrorCode.INVALID_REQUEST, "Default group resources are not allowed."
    )  # fmt: skip
    assert describe(broker, "")[0] == ErrorCode.INVALID_REQUEST


def test_admin_client_sets_and_describes(broker: MetricsBroker) -> None:
    """confluent-kafka 2.16: ConfigResource(ResourceType.GROUP, ...) is sent as type 32."""
    group = group_name()
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    resource = ConfigResource(ResourceType.GROUP, group, incremental_configs=[
        ConfigEntry("share.auto.offset.reset", "earliest",
                    incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("share.delivery.count.limit", "3",
                    incremental_operation=AlterConfigOpType.SET),
    ])  # fmt: skip
    admin.incremental_alter_configs([resource])[resource].result(timeout=60)
    [future] = admin.describe_configs([ConfigResource(ResourceType.GROUP, group)]).values()
    entries = future.result(timeout=60)
    assert entries["share.auto.offset.reset"].value == "earliest"
    assert entries["share.auto.offset.reset"].source == ConfigSource.GROUP_CONFIG.value
    assert entries["share.delivery.count.limit"].value == "3"
    assert entries["share.heartbeat.interval.ms"].value == "500"  # the broker's, from its file
    bad = ConfigResource(ResourceType.GROUP, group, incremental_configs=[
        ConfigEntry("share.delivery.count.limit", "11",
                    incremental_operation=AlterConfigOpType.SET),
    ])  # fmt: skip
    with pytest.raises(KafkaException) as refused:
        admin.incremental_alter_configs([bad])[bad].result(timeout=30)
    assert refused.value.args[0].code() == ErrorCode.INVALID_CONFIG


@pytest.mark.timeout(300)
def test_share_consumer_reads_from_the_earliest_offset(broker: MetricsBroker) -> None:
    """Records produced before the group exists are delivered once the group's
    share.auto.offset.reset is earliest (on main: none, the partitions start at the end)."""
    group = group_name()
    topic = f"group-cfg-t-{uuid.uuid4().hex[:8]}"
    make_topic(broker.bootstrap, topic)
    values = [b"early-%d" % i for i in range(20)]
    produce(broker.bootstrap, topic, values)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    resource = ConfigResource(ResourceType.GROUP, group, incremental_configs=[
        ConfigEntry("share.auto.offset.reset", "earliest",
                    incremental_operation=AlterConfigOpType.SET),
    ])  # fmt: skip
    admin.incremental_alter_configs([resource])[resource].result(timeout=60)
    consumer = ShareConsumer({"bootstrap.servers": broker.bootstrap, "group.id": group,
                              "share.acknowledgement.mode": "implicit"})  # fmt: skip
    consumer.subscribe([topic])
    got: list[bytes] = []
    try:
        deadline = time.monotonic() + DEADLINE_S
        while len(got) < len(values):
            assert time.monotonic() < deadline, f"{len(got)} of {len(values)}: {got}"
            got += [x.value() for x in consumer.poll(0.5) if x.error() is None]
    finally:
        consumer.close()
    assert sorted(got) == sorted(values)


def test_group_configs_survive_a_restart(tmp_path: Any) -> None:
    config = tmp_path / "broker.toml"
    config.write_text("")
    process = MetricsBroker(tmp_path / "data", config)
    process.start()
    try:
        group = group_name()
        assert alter(process, group, [("share.auto.offset.reset", SET, "by_duration:PT1H")])[0] == 0
        process.restart()
        reset = describe(process, group)[1]["share.auto.offset.reset"]
        assert (reset.value, reset.config_source) == ("by_duration:PT1H", 8)
    finally:
        if process.running:
            assert process.stop() == 0, process.log_tail()
