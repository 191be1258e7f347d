"""Where the cluster's shared state lives in ZooKeeper, and what each znode holds.

The layout follows the one Kafka used with ZooKeeper, so that the tree reads familiar
to anyone who ran such a cluster (zkCli.sh ``ls /brokers/ids``). Znode contents are
JSON; a znode that does not parse is a :class:`CoordinationDataError`, never a crash.
Pure: no trio, no kazoo.
"""

from __future__ import annotations

import base64
import json
import uuid
from typing import Any
from urllib.parse import quote, unquote

import attrs

from trio_broker.replication.controller_rules import LeaderAndIsr

__all__ = [
    "BROKER_DEFAULT_CONFIG",
    "BROKER_IDS",
    "CLUSTER_ID",
    "CONTROLLER",
    "CONTROLLER_EPOCH",
    "GROUP_CONFIGS",
    "LOG_DIR_EVENTS",
    "LOG_DIR_EVENT_PREFIX",
    "OFFLINE_REPLICAS",
    "PRODUCER_ID_BLOCK",
    "TOPICS",
    "BrokerRegistration",
    "ControllerClaim",
    "CoordinationDataError",
    "LogDirEvent",
    "OfflineReplicas",
    "PartitionState",
    "ProducerIdBlock",
    "TopicAssignment",
    "broker_path",
    "group_config_path",
    "group_of_config_znode",
    "offline_replicas_path",
    "partition_state_path",
    "topic_config_path",
    "topic_path",
]

BROKER_IDS = "/brokers/ids"
TOPICS = "/brokers/topics"
CONTROLLER = "/controller"
CONTROLLER_EPOCH = "/controller_epoch"
CLUSTER_ID = "/cluster/id"
PRODUCER_ID_BLOCK = "/latest_producer_id_block"
#: Kafka's log dir event notifications: a broker whose log dir failed creates a
#: persistent sequential ``log_dir_event_<seq>`` here; the controller reads and deletes them.
LOG_DIR_EVENTS = "/log_dir_event_notification"
LOG_DIR_EVENT_PREFIX = f"{LOG_DIR_EVENTS}/log_dir_event_"
#: Each broker's replicas in failed log dirs, one ephemeral znode per broker that has
#: any (``OfflineReplicas``): what the controller reads (Kafka's controller asks the
#: broker over LeaderAndIsr instead; ours reads its state from ZooKeeper only).
OFFLINE_REPLICAS = "/brokers/offline_replicas"
#: The cluster-wide default of the dynamic broker configs (Kafka's entity-default znode),
#: in the topic config znodes' layout.
BROKER_DEFAULT_CONFIG = "/config/brokers/<default>"


class CoordinationDataError(ValueError):
    """A znode holds something that is not what the layout says it holds."""


def broker_path(broker_id: int) -> str:
    return f"{BROKER_IDS}/{broker_id}"


def offline_replicas_path(broker_id: int) -> str:
    return f"{OFFLINE_REPLICAS}/{broker_id}"


def topic_path(topic: str) -> str:
    return f"{TOPICS}/{topic}"


def topic_config_path(topic: str) -> str:
    return f"/config/topics/{topic}"


#: Group configs (the GROUP config resource, KIP-848/KIP-932), one znode per group in the
#: topic config znodes' layout: Kafka keeps them in its metadata log; every broker here
#: watches these (cluster/group_config_watch.py).
GROUP_CONFIGS = "/config/groups"


def group_config_path(group_id: str) -> str:
    """A group id may hold any character, ``/`` too: the znode's name quotes it."""
    return f"{GROUP_CONFIGS}/{quote(group_id, safe='')}"


def group_of_config_znode(name: str) -> str:
    return unquote(name)


def partition_state_path(topic: str, partition: int) -> str:
    return f"{TOPICS}/{topic}/partitions/{partition}/state"


def _load(raw: bytes, what: str) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise CoordinationDataError(f"{what}: not JSON ({exc})") from None
    if not isinstance(value, dict):
        raise CoordinationDataError(f"{what}: expected a JSON object")
    return value


def _int(doc: dict[str, Any], key: str, what: str) -> int:
    value = doc.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise CoordinationDataError(f"{what}: {key!r} must be an integer, got {value!r}")
    return value


def _dump(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()


@attrs.frozen
class BrokerRegistration:
    """``/brokers/ids/<id>``: an ephemeral znode, present while the broker's session lives."""

    broker_id: int
    host: str
    port: int
    rack: str | None = None
    #: "NAME://HOST:PORT" per listener; the first is the one clients are told about.
    endpoints: tuple[str, ...] = ()
    timestamp_ms: int = 0
    #: (listener name, security protocol) for names that are not a protocol themselves.
    security_protocols: tuple[tuple[str, str], ...] = ()

    def encode(self) -> bytes:
        endpoints = list(self.endpoints) or [f"PLAINTEXT://{self.host}:{self.port}"]
        names = [e.split("://", 1)[0] for e in endpoints]
        protocols = dict(self.security_protocols)
        return _dump({
            "version": 5, "host": self.host, "port": self.port, "rack": self.rack,
            "endpoints": endpoints, "jmx_port": -1, "features": {},
            "listener_security_protocol_map": {n: protocols.get(n, n) for n in names},
            "timestamp": str(self.timestamp_ms),
        })  # fmt: skip

    def listener_addresses(self) -> tuple[tuple[str, str, int], ...]:
        """(name, host, port) of each readable endpoint, in registration order."""
        out = []
        for endpoint in self.endpoints:
            name, sep, address = endpoint.partition("://")
            host, colon, port = address.rpartition(":")
            if sep and colon and host and port.isdigit():
                out.append((name.upper(), host.strip("[]"), int(port)))
        return tuple(out)

    @classmethod
    def decode(cls, broker_id: int, raw: bytes) -> BrokerRegistration:
        what = f"broker {broker_id} registration"
        doc = _load(raw, what)
        host, rack, endpoints = doc.get("host"), doc.get("rack"), doc.get("endpoints", [])
        if not isinstance(host, str) or not host:
            raise CoordinationDataError(f"{what}: no host")
        if rack is not None and not isinstance(rack, str):
            raise CoordinationDataError(f"{what}: rack must be a string")
        if not isinstance(endpoints, list) or not all(isinstance(e, str) for e in endpoints):
            raise CoordinationDataError(f"{what}: endpoints must be a list of strings")
        try:
            timestamp = int(doc.get("timestamp", 0))
        except (TypeError, ValueError):
            raise CoordinationDataError(f"{what}: bad timestamp") from None
        protocols = doc.get("listener_security_protocol_map") or {}
        if not isinstance(protocols, dict):
            raise CoordinationDataError(f"{what}: listener_security_protocol_map must be a map")
        return cls(
            broker_id, host, _int(doc, "port", what), rack, tuple(endpoints), timestamp,
            tuple((str(k), str(v)) for k, v in protocols.items() if k != v),
        )  # fmt: skip


@attrs.frozen
class ControllerClaim:
    """``/controller``: ephemeral, held by the broker that is the controller."""

    broker_id: int
    timestamp_ms: int = 0

    def encode(self) -> bytes:
        return _dump(
            {"version": 1, "brokerid": self.broker_id, "timestamp": str(self.timestamp_ms)}
        )

    @classmethod
    def decode(cls, raw: bytes) -> ControllerClaim:
        doc = _load(raw, "controller")
        try:
            timestamp = int(doc.get("timestamp", 0))
        except (TypeError, ValueError):
            raise CoordinationDataError("controller: bad timestamp") from None
        return cls(_int(doc, "brokerid", "controller"), timestamp)


@attrs.frozen
class ProducerIdBlock:
    """``/latest_producer_id_block``: the last block of producer ids a broker claimed,
    ``[start, end)``; stored as Kafka does, with an inclusive ``block_end``. Claims are
    conditional updates of the znode (cluster/producer_id_blocks.py)."""

    broker_id: int
    start: int
    end: int

    def encode(self) -> bytes:
        # Kafka's field order, its ids as strings; json.dumps' own spacing.
        doc = {"version": 1, "broker": self.broker_id, "block_start": str(self.start),
               "block_end": str(self.end - 1)}  # fmt: skip
        return json.dumps(doc).encode()

    @staticmethod
    def next_start(raw: bytes) -> int:
        """The first producer id after the block ``raw`` holds: its ``block_end`` + 1
        (nothing else of the znode is read)."""
        doc = _load(raw, PRODUCER_ID_BLOCK)
        try:
            return int(doc["block_end"]) + 1
        except (ValueError, KeyError, TypeError):
            raise CoordinationDataError(f"{PRODUCER_ID_BLOCK}: no readable block_end") from None


def encode_controller_epoch(epoch: int) -> bytes:
    return str(epoch).encode()


def decode_controller_epoch(raw: bytes) -> int:
    try:
        epoch = int(raw.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        raise CoordinationDataError(f"controller epoch: not an integer: {raw[:40]!r}") from None
    if epoch < 0:
        raise CoordinationDataError(f"controller epoch: negative: {epoch}")
    return epoch


@attrs.frozen
class PartitionState:
    """``/brokers/topics/<t>/partitions/<p>/state``: leader, leader epoch, ISR.

    Updated only with the znode version as a condition, so that a deposed controller or
    leader cannot overwrite what its successor wrote.
    """

    leader: int  # -1: no leader (offline)
    leader_epoch: int
    isr: tuple[int, ...]
    controller_epoch: int

    @classmethod
    def of(cls, state: LeaderAndIsr, controller_epoch: int) -> PartitionState:
        return cls(state.leader, state.leader_epoch, state.isr, controller_epoch)

    @property
    def leader_and_isr(self) -> LeaderAndIsr:
        return LeaderAndIsr(self.leader, self.leader_epoch, self.isr)

    def encode(self) -> bytes:
        return _dump({
            "version": 1, "leader": self.leader, "leader_epoch": self.leader_epoch,
            "isr": list(self.isr), "controller_epoch": self.controller_epoch,
        })  # fmt: skip

    @classmethod
    def decode(cls, raw: bytes, what: str = "partition state") -> PartitionState:
        doc = _load(raw, what)
        isr = doc.get("isr")
        if not isinstance(isr, list) or not all(
            isinstance(b, int) and not isinstance(b, bool) for b in isr
        ):
            raise CoordinationDataError(f"{what}: isr must be a list of broker ids")
        return cls(
            leader=_int(doc, "leader", what),
            leader_epoch=_int(doc, "leader_epoch", what),
            isr=tuple(isr),
            controller_epoch=_int(doc, "controller_epoch", what),
        )


@attrs.frozen
class TopicAssignment:
    """``/brokers/topics/<topic>``: the topic's id and each partition's replica list.

    While a partition is reassigned (Kafka 2.4's layout, KIP-455) its replica list is
    the union of the old and the target replicas, target first; ``adding`` names the
    replicas that are joining, ``removing`` those that leave once the new ones are in
    sync. Partitions not being moved have no entry in either.
    """

    topic_id: uuid.UUID
    partitions: dict[int, tuple[int, ...]]
    adding: dict[int, tuple[int, ...]] = attrs.field(factory=dict)
    removing: dict[int, tuple[int, ...]] = attrs.field(factory=dict)

    def encode(self) -> bytes:
        topic_id = base64.urlsafe_b64encode(self.topic_id.bytes).rstrip(b"=").decode()

        def as_json(by_partition: dict[int, tuple[int, ...]]) -> dict[str, list[int]]:
            return {str(p): list(r) for p, r in sorted(by_partition.items()) if r}

        return _dump({
            "version": 3, "topic_id": topic_id, "adding_replicas": as_json(self.adding),
            "removing_replicas": as_json(self.removing),
            "partitions": as_json(self.partitions),
        })  # fmt: skip

    def target(self, partition: int) -> tuple[int, ...]:
        """The replicas the partition will have once its reassignment completes."""
        removing = self.removing.get(partition, ())
        return tuple(r for r in self.partitions[partition] if r not in removing)

    @classmethod
    def decode(cls, raw: bytes, what: str = "topic") -> TopicAssignment:
        doc = _load(raw, what)
        raw_id, parts = doc.get("topic_id"), doc.get("partitions")
        if not isinstance(raw_id, str):
            raise CoordinationDataError(f"{what}: no topic_id")
        try:
            topic_id = uuid.UUID(bytes=base64.urlsafe_b64decode(raw_id + "=" * (-len(raw_id) % 4)))
        except ValueError:
            raise CoordinationDataError(f"{what}: bad topic_id {raw_id!r}") from None
        if not isinstance(parts, dict) or not parts:
            raise CoordinationDataError(f"{what}: no partitions")
        partitions: dict[int, tuple[int, ...]] = {}
        for key, replicas in parts.items():
            if not (isinstance(key, str) and key.isdigit()) or not isinstance(replicas, list):
                raise CoordinationDataError(f"{what}: bad partition entry {key!r}")
            if not replicas or not all(
                isinstance(b, int) and not isinstance(b, bool) for b in replicas
            ):
                raise CoordinationDataError(f"{what}: partition {key}: bad replica list")
            partitions[int(key)] = tuple(replicas)
        if sorted(partitions) != list(range(len(partitions))):
            raise CoordinationDataError(f"{what}: partitions are not numbered 0..n-1")
        moving = [_replica_lists(doc, key, partitions, what) for key in _MOVING]
        return cls(topic_id, partitions, moving[0], moving[1])


_MOVING = ("adding_replicas", "removing_replicas")


def _replica_lists(
    doc: dict[str, Any], key: str, partitions: dict[int, tuple[int, ...]], what: str
) -> dict[int, tuple[int, ...]]:
    """``adding_replicas`` or ``removing_replicas``: partition -> brokers among its replicas."""
    raw = doc.get(key) or {}
    if not isinstance(raw, dict):
        raise CoordinationDataError(f"{what}: {key} must be an object")
    lists: dict[int, tuple[int, ...]] = {}
    for name, brokers in raw.items():
        if not (isinstance(name, str) and name.isdigit()) or int(name) not in partitions:
            raise CoordinationDataError(f"{what}: {key}: unknown partition {name!r}")
        if not isinstance(brokers, list) or not all(
            isinstance(b, int) and not isinstance(b, bool) and b in partitions[int(name)]
            for b in brokers
        ):
            raise CoordinationDataError(f"{what}: {key}: partition {name}: not among its replicas")
        if brokers:
            lists[int(name)] = tuple(brokers)
    return lists


@attrs.frozen
class LogDirEvent:
    """``/log_dir_event_notification/log_dir_event_<seq>``, as Kafka writes it: broker
    ``broker_id`` had a log dir fail (event 1, Kafka's only kind). A trigger: what
    failed is in the broker's :class:`OfflineReplicas`."""

    broker_id: int
    event: int = 1

    def encode(self) -> bytes:
        return _dump({"version": 1, "broker": self.broker_id, "event": self.event})

    @classmethod
    def decode(cls, raw: bytes, what: str = "log dir event") -> LogDirEvent:
        doc = _load(raw, what)
        return cls(_int(doc, "broker", what), _int(doc, "event", what))


@attrs.frozen
class OfflineReplicas:
    """``/brokers/offline_replicas/<id>`` (ephemeral, written by that broker): its log
    dirs that are offline and the partitions whose replica there is offline with them.
    Absent: none. It goes with the broker's session, as the broker's replicas do."""

    broker_id: int
    log_dirs: tuple[str, ...]
    partitions: frozenset[tuple[str, int]]

    def encode(self) -> bytes:
        by_topic: dict[str, list[int]] = {}
        for topic, partition in sorted(self.partitions):
            by_topic.setdefault(topic, []).append(partition)
        return _dump({"version": 1, "log_dirs": list(self.log_dirs), "partitions": by_topic})

    @classmethod
    def decode(cls, broker_id: int, raw: bytes) -> OfflineReplicas:
        what = f"broker {broker_id} offline replicas"
        doc = _load(raw, what)
        dirs, parts = doc.get("log_dirs", []), doc.get("partitions")
        if not isinstance(dirs, list) or not all(isinstance(d, str) for d in dirs):
            raise CoordinationDataError(f"{what}: log_dirs must be a list of paths")
        if not isinstance(parts, dict):
            raise CoordinationDataError(f"{what}: partitions must be an object")
        partitions: set[tuple[str, int]] = set()
        for topic, numbers in parts.items():
            if not isinstance(numbers, list) or not all(
                isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in numbers
            ):
                raise CoordinationDataError(f"{what}: {topic}: bad partition list")
            partitions.update((topic, n) for n in numbers)
        return cls(broker_id, tuple(dirs), frozenset(partitions))
