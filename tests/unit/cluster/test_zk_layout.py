"""ZooKeeper znode contents: round trips, Kafka's field names, refusals of bad data."""

from __future__ import annotations

import json
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trio_broker.cluster.zk_layout import (
    BrokerRegistration,
    ControllerClaim,
    CoordinationDataError,
    PartitionState,
    TopicAssignment,
    decode_controller_epoch,
    encode_controller_epoch,
    partition_state_path,
)
from trio_broker.replication.controller_rules import LeaderAndIsr
from trio_broker.services.cluster_view import BrokerInfo, ClusterView

ids = st.integers(0, 2**31 - 1)


@given(ids, st.text(min_size=1), st.integers(1, 65535), st.one_of(st.none(), st.text()))
def test_broker_registration_round_trips(
    broker: int, host: str, port: int, rack: str | None
) -> None:
    reg = BrokerRegistration(broker, host, port, rack, (f"PLAINTEXT://{host}:{port}",), 17)
    assert BrokerRegistration.decode(broker, reg.encode()) == reg


def test_layout_uses_kafkas_names() -> None:
    doc = json.loads(BrokerRegistration(1, "h", 9092).encode())
    assert doc["endpoints"] == ["PLAINTEXT://h:9092"] and doc["version"] == 5
    assert json.loads(ControllerClaim(3, 5).encode())["brokerid"] == 3
    state = json.loads(PartitionState(2, 7, (2, 1), 4).encode())
    assert state == {"version": 1, "leader": 2, "leader_epoch": 7, "isr": [2, 1],
                     "controller_epoch": 4}  # fmt: skip
    assert partition_state_path("t", 3) == "/brokers/topics/t/partitions/3/state"


def test_registration_names_every_listener_and_its_protocol() -> None:
    reg = BrokerRegistration(
        2, "127.0.0.1", 9092, None,
        ("PLAINTEXT://127.0.0.1:9092", "REPLICATION://127.0.0.1:19092"), 5,
        (("REPLICATION", "PLAINTEXT"),),
    )  # fmt: skip
    doc = json.loads(reg.encode())
    assert doc["listener_security_protocol_map"] == {
        "PLAINTEXT": "PLAINTEXT", "REPLICATION": "PLAINTEXT"
    }  # fmt: skip
    back = BrokerRegistration.decode(2, reg.encode())
    assert back == reg
    assert back.listener_addresses() == (
        ("PLAINTEXT", "127.0.0.1", 9092), ("REPLICATION", "127.0.0.1", 19092)
    )  # fmt: skip
    info = BrokerInfo(2, "127.0.0.1", 9092, None, back.listener_addresses())
    assert info.endpoint(None) == ("127.0.0.1", 9092)
    assert info.endpoint("REPLICATION") == ("127.0.0.1", 19092)
    assert info.endpoint("CLIENT") is None  # Kafka leaves such a broker out
    view = ClusterView(1, {2: info, 3: BrokerInfo(3, "127.0.0.1", 9093)})
    # Broker 3 registered no listener names: its one address serves every listener.
    assert [(b.broker_id, h, p) for b, h, p in view.brokers_on("REPLICATION")] == [
        (2, "127.0.0.1", 19092), (3, "127.0.0.1", 9093)
    ]  # fmt: skip


@given(ids, ids, st.lists(ids, max_size=5), ids)
def test_partition_state_round_trips(leader: int, epoch: int, isr: list[int], ce: int) -> None:
    state = PartitionState.of(LeaderAndIsr(leader, epoch, tuple(isr)), ce)
    assert PartitionState.decode(state.encode()) == state
    assert state.leader_and_isr == LeaderAndIsr(leader, epoch, tuple(isr))


@given(st.uuids(), st.lists(st.lists(ids, min_size=1, max_size=3), min_size=1, max_size=5))
def test_topic_assignment_round_trips(topic_id: uuid.UUID, replicas: list[list[int]]) -> None:
    topic = TopicAssignment(topic_id, {p: tuple(r) for p, r in enumerate(replicas)})
    assert TopicAssignment.decode(topic.encode()) == topic


@pytest.mark.parametrize(
    "raw",
    [b"", b"[]", b"{", b'{"isr": [1]}', b'{"leader": "1", "leader_epoch": 0, "isr": [],'
     b' "controller_epoch": 0}', b'{"leader": 1, "leader_epoch": 0, "isr": [true],'
     b' "controller_epoch": 0}', b"\xff\xfe"],
)  # fmt: skip
def test_bad_partition_state_is_a_clear_error(raw: bytes) -> None:
    with pytest.raises(CoordinationDataError):
        PartitionState.decode(raw)


@pytest.mark.parametrize(
    "doc",
    [{}, {"topic_id": "x", "partitions": {"0": [1]}}, {"topic_id": "AAAAAAAAAAAAAAAAAAAAAA"},
     {"topic_id": "AAAAAAAAAAAAAAAAAAAAAA", "partitions": {"1": [1]}},
     {"topic_id": "AAAAAAAAAAAAAAAAAAAAAA", "partitions": {"0": []}},
     {"topic_id": "AAAAAAAAAAAAAAAAAAAAAA", "partitions": {"a": [1]}}],
)  # fmt: skip
def test_bad_topic_assignment_is_a_clear_error(doc: dict[str, object]) -> None:
    with pytest.raises(CoordinationDataError):
        TopicAssignment.decode(json.dumps(doc).encode())


def test_controller_epoch_and_claim_refuse_garbage() -> None:
    assert decode_controller_epoch(encode_controller_epoch(12)) == 12
    for raw in (b"", b"-1", b"x", b"\xff"):
        with pytest.raises(CoordinationDataError):
            decode_controller_epoch(raw)
    with pytest.raises(CoordinationDataError):
        ControllerClaim.decode(b'{"brokerid": "1"}')
    with pytest.raises(CoordinationDataError):
        BrokerRegistration.decode(1, b'{"host": "h", "port": 1, "endpoints": [1]}')


# Edges found by mutation testing (issue 31).


def test_the_controller_znode_is_kafkas_json_both_ways() -> None:
    # What Kafka's KafkaZkClient writes to /controller, and reads back.
    assert json.loads(ControllerClaim(3, 5).encode()) == {
        "version": 1, "brokerid": 3, "timestamp": "5"
    }  # fmt: skip
    kafka = b'{"version":1,"brokerid":2,"timestamp":"1732870000000"}'
    assert ControllerClaim.decode(kafka) == ControllerClaim(2, 1732870000000)
    assert ControllerClaim.decode(b'{"version":1,"brokerid":2}') == ControllerClaim(2, 0)
    for bad in (b'{"brokerid":2,"timestamp":"soon"}', b'{"timestamp":"1"}', b"[2]"):
        with pytest.raises(CoordinationDataError):
            ControllerClaim.decode(bad)


def test_controller_epoch_zero_is_an_epoch() -> None:
    assert decode_controller_epoch(encode_controller_epoch(0)) == 0
    assert decode_controller_epoch(b"17") == 17
    for bad in (b"-1", b"x", b"\xff"):
        with pytest.raises(CoordinationDataError):
            decode_controller_epoch(bad)


def test_listener_addresses_read_ipv6_and_skip_what_they_cannot_read() -> None:
    reg = BrokerRegistration(
        1, "::1", 9092, None,
        (
            "PLAINTEXT://[::1]:9092",  # IPv6: the port follows the last colon
            "ssl://host:9093",  # names are case-insensitive: upper-cased
            "CLIENT://a://b:9094",  # only the first "://" separates the name
            "EXT://XENON:9097",  # only IPv6 brackets are stripped from a host
            "BROKEN:9095", "NOPORT://host:", "NOHOST://:9096", "BADPORT://host:x",
        ),
    )  # fmt: skip
    assert reg.listener_addresses() == (
        ("PLAINTEXT", "::1", 9092), ("SSL", "host", 9093), ("CLIENT", "a://b", 9094),
        ("EXT", "XENON", 9097),
    )  # fmt: skip


def test_registration_and_topic_znodes_carry_every_field_kafka_writes() -> None:
    reg = BrokerRegistration(1, "h", 9092, "r1", ("PLAINTEXT://h:9092",), 17)
    assert json.loads(reg.encode()) == {
        "version": 5, "host": "h", "port": 9092, "rack": "r1", "jmx_port": -1,
        "endpoints": ["PLAINTEXT://h:9092"], "features": {}, "timestamp": "17",
        "listener_security_protocol_map": {"PLAINTEXT": "PLAINTEXT"},
    }  # fmt: skip
    topic = TopicAssignment(uuid.UUID(int=1), {0: (1, 2)})
    # Kafka's Uuid.toString: URL-safe base64 of the 16 bytes, no padding.
    assert json.loads(topic.encode()) == {
        "version": 3, "topic_id": "AAAAAAAAAAAAAAAAAAAAAQ", "partitions": {"0": [1, 2]},
        "adding_replicas": {}, "removing_replicas": {},
    }  # fmt: skip


def test_an_old_registration_without_endpoints_or_timestamp_reads() -> None:
    reg = BrokerRegistration.decode(4, b'{"version":1,"host":"h","port":9092}')
    assert (reg.host, reg.port, reg.endpoints, reg.timestamp_ms) == ("h", 9092, (), 0)


def test_damaged_registrations_and_replica_lists_are_refused() -> None:
    for doc in ({"host": "", "port": 1}, {"host": 5, "port": 1}):
        with pytest.raises(CoordinationDataError):
            BrokerRegistration.decode(4, json.dumps(doc).encode())
    good = {"version": 3, "topic_id": "AAAAAAAAAAAAAAAAAAAAAQ", "partitions": {"0": [1]}}
    assert TopicAssignment.decode(json.dumps(good).encode()).partitions == {0: (1,)}
    for partitions in ({}, [[1]], {"0": [True]}, {"0": ["1"]}):
        bad = {**good, "partitions": partitions}
        with pytest.raises(CoordinationDataError):
            TopicAssignment.decode(json.dumps(bad).encode())
    # A move naming a partition that is not a number, or not one of the topic's.
    for moving in ({"x": [1]}, {"5": [1]}):
        bad = {**good, "adding_replicas": moving}
        with pytest.raises(CoordinationDataError):
            TopicAssignment.decode(json.dumps(bad).encode())
