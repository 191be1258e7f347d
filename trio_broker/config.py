"""Broker configuration: defaults, a config file with Kafka's key names, and CLI overrides.

The file is TOML or Kafka's own ``server.properties`` (Java properties syntax,
config_properties.py). Every key is in the one table of config_keys.py: Kafka's
broker keys keep Kafka's names and are applied or, where they have no effect
here, accepted with a warning naming them; keys that are ours say so. Unknown keys
and bad values fail at start with a message naming the key (docs/configuration.md).
"""

from __future__ import annotations

import logging
import tomllib
import uuid
from pathlib import Path
from typing import Any

import attrs

from trio_broker.config_errors import ConfigError, parse_host_port
from trio_broker.config_keys import (
    APPLIED,
    BROKER_KEYS,
    INERT,
    SECURITY,
    SYNONYMS,
    inert_reason,
    listener_key,
    lookup,
    parse_value,
)
from trio_broker.config_properties import read_properties_file
from trio_broker.security.inter_broker import inter_broker_listener, inter_broker_login
from trio_broker.security.listeners import resolve_listeners
from trio_broker.security.zookeeper_tls import ZooKeeperTls, tls_from_properties
from trio_broker.storage.durable import make_dirs_durable, write_file_atomically
from trio_broker.storage.topic_configs import DEFAULT_MAX_MESSAGE_BYTES

__all__ = ["AUTHORIZER_NAMES", "BrokerConfig", "ConfigError", "parse_host_port"]

#: ``authorizer.class.name`` values that turn ACLs on: Kafka's KRaft and ZooKeeper
#: authorizers (both mean the same rules here) and our short alias.
AUTHORIZER_NAMES = frozenset(
    {"org.apache.kafka.metadata.authorizer.StandardAuthorizer",
     "kafka.security.authorizer.AclAuthorizer", "acl"}
)  # fmt: skip


@attrs.frozen
class BrokerConfig:
    host: str = "127.0.0.1"
    port: int = 9092
    #: Where clients are told to connect (Metadata); defaults to the bound address.
    advertised_host: str | None = None
    advertised_port: int | None = None
    #: listeners / advertised.listeners as written ("NAME://HOST:PORT,..."); the first
    #: listener binds host:port above. See trio_broker/security/listeners.py.
    listeners: str | None = None
    advertised_listeners: str | None = None
    #: The listener followers fetch from (its advertised address); None = the first.
    inter_broker_listener_name: str | None = None
    listener_security_protocol_map: str = (  # Kafka's default: each protocol names itself
        "SASL_SSL:SASL_SSL,PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_PLAINTEXT:SASL_PLAINTEXT"
    )
    #: ssl.*, sasl.enabled.mechanisms, connections.max.reauth.ms and their
    #: listener.name.<name>.<key> overrides, by Kafka key (docs/security.md).
    security: dict[str, Any] = attrs.field(factory=dict, hash=False)
    data_dir: Path = Path("data")
    #: log.dirs after the first (JBOD): partitions spread over ``data_dir`` and these.
    extra_log_dirs: tuple[Path, ...] = ()
    storage: str = "file"  # ours: "file" or "memory"
    processing_model: str = "pipelined"  # ours: "pipelined" or "serial"
    node_id: int = 0
    cluster_id: str | None = None  # generated once and kept in the data dir
    num_handlers: int = 8  # num.io.threads: request queues / handler tasks
    max_connections: int = 10_000
    max_connections_per_ip: int = 2**31 - 1  # Kafka's default: no per-IP limit
    max_in_flight_per_connection: int = 64  # ours: requests queued per connection
    queued_max_request_bytes: int = 256 * 1024 * 1024  # broker-wide budget (MEMORY_PRESSURE)
    socket_request_max_bytes: int = 100 * 1024 * 1024
    auto_create_topics: bool = True
    num_partitions: int = 1
    segment_bytes: int = 1 << 30
    segment_ms: int = 7 * 24 * 3600 * 1000
    retention_ms: int = 7 * 24 * 3600 * 1000
    retention_bytes: int = -1
    retention_check_interval_ms: int = 300_000
    #: Log compaction (docs/compaction.md): the cleaner's switch, pause, rate and the
    #: defaults of the topics' cleanup.policy and compaction configs.
    log_cleaner_enable: bool = True
    log_cleaner_backoff_ms: int = 15_000
    log_cleaner_io_max_bytes_per_second: float = float("inf")
    #: the key map's bound, counted as Kafka sizes it: 24 bytes a key (docs/compaction.md).
    log_cleaner_dedupe_buffer_size: int = 134_217_728
    log_cleanup_policy: str = "delete"
    log_cleaner_delete_retention_ms: int = 86_400_000
    log_cleaner_min_compaction_lag_ms: int = 0
    log_cleaner_max_compaction_lag_ms: int = 2**63 - 1
    log_cleaner_min_cleanable_ratio: float = 0.5
    flush_interval_messages: int | None = None
    flush_interval_ms: int | None = None
    #: ours (acks.all.fsync): acks=all waits for an fsync on the leader and, in a cluster,
    #: on every ISR member; False relies on replication (page cache), as Kafka does.
    acks_all_fsync: bool = True
    connections_max_idle_ms: int = 600_000
    #: A failed SASL login is answered this long after it failed, and the connection
    #: closed once the answer is out (Kafka's KIP-306; its default 100): a password
    #: guesser waits between tries.
    connection_failed_authentication_delay_ms: int = 100
    group_initial_rebalance_delay_ms: int = 3000
    #: JoinGroup with a session timeout outside [min, max] gets INVALID_SESSION_TIMEOUT.
    group_min_session_timeout_ms: int = 6000
    group_max_session_timeout_ms: int = 1_800_000
    #: KIP-848 groups (group.protocol=consumer): the session a member's heartbeats keep,
    #: the interval told to members, and the server-side assignors (the first is default).
    group_consumer_session_timeout_ms: int = 45_000
    group_consumer_heartbeat_interval_ms: int = 5_000
    group_consumer_assignors: tuple[str, ...] = ("uniform", "range")
    #: group.consumer.migration.policy (Kafka's values, lower case): whether a classic
    #: group with members becomes a consumer group when a consumer-protocol member joins
    #: (upgrade) and back when the last one leaves (downgrade).
    group_consumer_migration_policy: str = "bidirectional"
    #: Share groups (KIP-932, docs/share-groups.md): a member's session and heartbeat
    #: interval, how long a delivered record stays locked to its consumer, how many
    #: deliveries a record gets before it is archived, and the in-flight records a share
    #: partition holds at most.
    group_share_session_timeout_ms: int = 45_000
    group_share_heartbeat_interval_ms: int = 5_000
    group_share_record_lock_duration_ms: int = 30_000
    group_share_delivery_count_limit: int = 5
    group_share_partition_max_record_locks: int = 2_000
    #: How long a share partition recorded as initializing is left to that initialization
    #: before a heartbeat starts it again (at least offsets.commit.timeout.ms, as Kafka).
    group_share_initialize_retry_interval_ms: int = 30_000
    #: False: DeleteTopics answers TOPIC_DELETION_DISABLED (INVALID_REQUEST before v3).
    delete_topic_enable: bool = True
    #: Fetch sessions (KIP-227) the broker keeps; 0: every fetch is answered in full.
    max_incremental_fetch_session_cache_slots: int = 1000
    #: DescribeTopicPartitions answers at most this many partitions (and fewer if the
    #: request asks so); the rest come by cursor.
    max_request_partition_size_limit: int = 2000
    #: Topic defaults of max.message.bytes and message.timestamp.type.
    message_max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    log_message_timestamp_type: str = "CreateTime"
    offsets_retention_minutes: int = 7 * 24 * 60
    #: Cluster mode: ``__consumer_offsets`` is made with these on first use (a group's
    #: coordinator leads the partition its id hashes to); a commit not replicated within
    #: the timeout gets COORDINATOR_NOT_AVAILABLE.
    offsets_topic_num_partitions: int = 50
    offsets_topic_replication_factor: int = 3
    offsets_topic_segment_bytes: int = 104_857_600
    offsets_commit_timeout_ms: int = 5000
    #: Transactions (docs/transactions.md): InitProducerId with a longer
    #: transaction.timeout.ms gets INVALID_TRANSACTION_TIMEOUT.
    transaction_max_timeout_ms: int = 900_000
    #: How often open transactions past their timeout are aborted.
    transaction_abort_timed_out_transaction_cleanup_interval_ms: int = 10_000
    #: An idle transactional id (no open transaction) is forgotten after this long.
    transactional_id_expiration_ms: int = 604_800_000
    #: An idempotent producer silent this long (no batch, no marker) is forgotten.
    producer_id_expiration_ms: int = 86_400_000
    transaction_remove_expired_transaction_cleanup_interval_ms: int = 3_600_000
    #: Cluster mode: the replicated __transaction_state topic, made on first use
    #: (FindCoordinator for a transactional id); min.isr goes into its topic configs.
    transaction_state_log_num_partitions: int = 50
    transaction_state_log_replication_factor: int = 3
    transaction_state_log_min_isr: int = 2
    transaction_state_log_segment_bytes: int = 104_857_600
    #: Cluster mode: the replicated __share_group_state topic of the share coordinator
    #: (groups/share_coordinator.py), made on first use; min.isr goes into its configs.
    share_coordinator_state_topic_num_partitions: int = 50
    share_coordinator_state_topic_replication_factor: int = 3
    share_coordinator_state_topic_min_isr: int = 2
    share_coordinator_state_topic_segment_bytes: int = 104_857_600
    #: Cluster mode ([cluster], docs/cluster.md): HOST:PORT[,HOST:PORT...][/chroot] of
    #: ZooKeeper; None runs a single broker as before.
    zookeeper_connect: str | None = None
    zookeeper_session_timeout_ms: int = 18_000
    #: Create znodes with ACLs that only the brokers' ZooKeeper user can change
    #: (Kafka 3's zookeeper.set.acl; docs/security.md, "Cluster mode: threat model").
    zookeeper_set_acl: bool = False
    #: A JAAS file whose Client section (DigestLoginModule username/password) is the
    #: brokers' SASL DIGEST-MD5 login to ZooKeeper; None: no login.
    zookeeper_jaas_file: str | None = None
    broker_rack: str | None = None
    #: Replicas of a new topic when CreateTopics asks for the default (-1).
    default_replication_factor: int = 1
    #: acks=all needs this many in-sync replicas (NOT_ENOUGH_REPLICAS below it).
    min_insync_replicas: int = 1
    replica_lag_time_max_ms: int = 30_000
    unclean_leader_election_enable: bool = False
    #: The controller moves leadership back to preferred replicas every interval.
    auto_leader_rebalance_enable: bool = True
    leader_imbalance_check_interval_seconds: int = 300
    #: Bytes per second a broker copies of partitions a reassignment adds to it.
    follower_replication_throttled_rate: int = 2**63 - 1
    leader_replication_throttled_rate: int = 2**63 - 1
    capture_dir: Path | None = None  # ours: write every frame to Parquet here (capture.dir)
    #: ours: HOST:PORT of the /metrics and /health responder (metrics.listener); None = off.
    metrics_listener: str | None = None
    #: ours: the web console on metrics.listener may create and delete topics
    #: (console.writes.enable; docs/console.md).
    console_writes_enable: bool = False
    #: ours: log one line per request slower than this (request.log.slow.ms); 0 = off.
    request_log_slow_ms: int = 1000
    #: ACLs are enforced when set (Kafka's StandardAuthorizer name, or "acl"); see docs/acls.md.
    authorizer_class_name: str = ""
    super_users: str = ""  # semicolon-separated principals that bypass ACLs
    allow_everyone_if_no_acl_found: bool = False
    #: Client quotas by entity ("client-id=bench", "user=alice", "default"), each a table
    #: of Kafka's dynamic quota keys (producer_byte_rate, ...); see docs/reliability.md.
    quotas: dict[str, dict[str, float]] = attrs.field(factory=dict, hash=False)
    quota_window_num: int = 11  # samples a quota's rate is measured over
    quota_window_size_seconds: int = 1
    #: Every key set at start, as written (file keys, inert ones too, and the keys of
    #: CLI flags): DescribeConfigs reports these as STATIC_BROKER_CONFIG.
    static_keys: dict[str, str] = attrs.field(factory=dict, hash=False)

    @property
    def queued_request_bytes_limit(self) -> int:
        """queued.max.request.bytes as a budget: Kafka's -1 means no limit."""
        return self.queued_max_request_bytes if self.queued_max_request_bytes > 0 else 2**63 - 1

    @property
    def advertised(self) -> tuple[str, int]:
        return (self.advertised_host or self.host, self.advertised_port or self.port)

    def zookeeper_tls(self) -> ZooKeeperTls | None:
        """TLS to ZooKeeper (``zookeeper.ssl.*`` as written); None: plaintext."""
        return tls_from_properties(self.static_keys)

    def validate(self) -> BrokerConfig:
        if self.storage not in ("file", "memory"):
            raise ConfigError(f"storage: expected 'file' or 'memory', got {self.storage!r}")
        if self.processing_model not in ("pipelined", "serial"):
            raise ConfigError(
                f"processing.model: expected 'pipelined' or 'serial', got {self.processing_model!r}"
            )
        for name in ("num_handlers", "max_connections", "max_connections_per_ip",
                     "max_in_flight_per_connection", "num_partitions", "segment_bytes",
                     "socket_request_max_bytes", "connections_max_idle_ms",
                     "max_request_partition_size_limit",
                     "quota_window_num", "quota_window_size_seconds"):  # fmt: skip
            if getattr(self, name) <= 0:
                raise ConfigError(f"{KEY_FOR_FIELD.get(name, name)}: must be positive")
        if self.connection_failed_authentication_delay_ms < 0:
            raise ConfigError("connection.failed.authentication.delay.ms: must be at least 0")
        if self.queued_max_request_bytes == 0 or self.queued_max_request_bytes < -1:
            raise ConfigError("queued.max.request.bytes: must be positive, or -1 for no limit")
        if self.max_incremental_fetch_session_cache_slots < 0:
            raise ConfigError("max.incremental.fetch.session.cache.slots: must be at least 0")
        if self.default_replication_factor != 1 and not self.zookeeper_connect:
            raise ConfigError(
                "default.replication.factor: a single broker (no zookeeper.connect) keeps "
                f"only 1 replica, got {self.default_replication_factor}"
            )
        if self.default_replication_factor < 1 or self.min_insync_replicas < 1:
            raise ConfigError("default.replication.factor and min.insync.replicas: at least 1")
        if not 0 < self.group_min_session_timeout_ms <= self.group_max_session_timeout_ms:
            raise ConfigError(
                "group.min.session.timeout.ms: must be positive and at most "
                f"group.max.session.timeout.ms ({self.group_max_session_timeout_ms})"
            )
        for name in ("transaction_max_timeout_ms", "transactional_id_expiration_ms",
                     "producer_id_expiration_ms",
                     "transaction_abort_timed_out_transaction_cleanup_interval_ms",
                     "transaction_remove_expired_transaction_cleanup_interval_ms",
                     "transaction_state_log_num_partitions",
                     "transaction_state_log_replication_factor",
                     "transaction_state_log_min_isr", "transaction_state_log_segment_bytes",
                     "share_coordinator_state_topic_num_partitions",
                     "share_coordinator_state_topic_replication_factor",
                     "share_coordinator_state_topic_min_isr",
                     "share_coordinator_state_topic_segment_bytes",
                     "group_share_initialize_retry_interval_ms"):  # fmt: skip
            if getattr(self, name) <= 0:
                raise ConfigError(f"{KEY_FOR_FIELD.get(name, name)}: must be positive")
        for name in ("offsets_topic_num_partitions", "offsets_topic_replication_factor",
                     "offsets_topic_segment_bytes", "offsets_commit_timeout_ms"):  # fmt: skip
            if getattr(self, name) <= 0:
                raise ConfigError(f"{KEY_FOR_FIELD.get(name, name)}: must be positive")
        if self.message_max_bytes < 0:
            raise ConfigError("message.max.bytes: must be at least 0")
        if self.log_message_timestamp_type not in ("CreateTime", "LogAppendTime"):
            raise ConfigError(
                "log.message.timestamp.type: expected CreateTime or LogAppendTime, "
                f"got {self.log_message_timestamp_type!r}"
            )
        if self.metrics_listener is not None:
            parse_host_port(self.metrics_listener, "metrics.listener")
        slow_ms = self.request_log_slow_ms
        if isinstance(slow_ms, bool) or not isinstance(slow_ms, int) or slow_ms < 0:
            raise ConfigError(f"request.log.slow.ms: expected an integer >= 0, got {slow_ms!r}")
        listeners = resolve_listeners(self)
        inter_broker = self.inter_broker_listener_name
        if inter_broker is not None and inter_broker.upper() not in {s.name for s in listeners}:
            raise ConfigError(
                f"inter.broker.listener.name: {inter_broker} is not in listeners "
                f"({', '.join(s.name for s in listeners)})"
            )
        if self.zookeeper_set_acl and not self.zookeeper_jaas_file:
            raise ConfigError(
                "zookeeper.set.acl: the ACLs name the brokers' ZooKeeper user; set "
                "zookeeper.jaas.file to a JAAS file with its Client section"
            )
        if self.zookeeper_connect is not None and self.zookeeper_jaas_file:
            from trio_broker.security.zookeeper_login import read_client_login

            read_client_login(self.zookeeper_jaas_file)  # unreadable: fail now, not at join
        if self.zookeeper_connect is not None:
            self.zookeeper_tls()  # bad or unreadable certificates: fail now, not at join
        if self.zookeeper_connect is not None:
            # The brokers' own login to each other: its credentials must be there now,
            # not found missing at the first replica fetch.
            inter_broker_login(inter_broker_listener(listeners, inter_broker), self.security)
        if self.authorizer_class_name and self.authorizer_class_name not in AUTHORIZER_NAMES:
            raise ConfigError(
                f"authorizer.class.name: expected one of {sorted(AUTHORIZER_NAMES)}, "
                f"got {self.authorizer_class_name!r}"
            )
        _check_quotas(self.quotas)
        return self


def _check_quotas(quotas: dict[str, dict[str, float]]) -> None:
    from trio_broker.state.quota import QuotaConfigError, check_quota, parse_entity

    for entity, values in quotas.items():
        try:
            parse_entity(entity)
            if not isinstance(values, dict):
                raise QuotaConfigError("expected a table of quota keys")
            for key, value in values.items():
                if isinstance(value, bool) or not isinstance(value, int | float):
                    raise QuotaConfigError(f"{key} must be a number, got {value!r}")
                check_quota(key, float(value))
        except QuotaConfigError as exc:
            raise ConfigError(f"quotas.{entity}: {exc}") from None


#: BrokerConfig field -> the key that names it in messages (the first, most specific one).
KEY_FOR_FIELD: dict[str, str] = {}
for _spec in BROKER_KEYS.values():
    if _spec.field not in (None, SECURITY):
        KEY_FOR_FIELD.setdefault(str(_spec.field), _spec.name)
# Where several keys set a field, messages (and flags) use the one Kafka's docs lead with.
KEY_FOR_FIELD.update({"host": "listeners", "port": "listeners", "node_id": "node.id"})
KEY_FOR_FIELD.update({str(BROKER_KEYS[group[0]].field): group[0] for group in SYNONYMS})

log = logging.getLogger("trio_broker.config")


def _flatten(table: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """TOML tables become dotted keys: [log] segment.bytes -> log.segment.bytes."""
    out: dict[str, Any] = {}
    for key, value in table.items():
        full = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flatten(value, full + "."))
        else:
            out[full] = value
    return out


def read_config_file(path: Path) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(key -> value, the TOML [quotas] table) of a TOML or Java-properties file.

    ``*.properties`` is Kafka's server.properties syntax, ``*.toml`` TOML; any other
    name is TOML if it parses as TOML, else properties.
    """
    path = Path(path)
    if path.suffix == ".properties":
        return read_properties_file(path), None
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read config {path}: {exc}") from exc
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        if path.suffix == ".toml":
            raise ConfigError(f"cannot read config {path}: {exc}") from exc
        return read_properties_file(path), None
    quotas = raw.pop("quotas", None)  # entity names contain dots and '=': not flattened
    if quotas is not None and not isinstance(quotas, dict):
        raise ConfigError("quotas: expected a table of entities")
    return _flatten(raw), quotas


def _as_written(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list | tuple):
        return ",".join(str(item) for item in value)
    return str(value)


def _apply_keys(raw: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """BrokerConfig field values and the keys as written, from a file's keys.

    Every key must be in the table (config_keys.py); inert keys are logged once each.
    """
    values: dict[str, Any] = {}
    security: dict[str, Any] = {}
    static: dict[str, str] = {}
    inert: list[str] = []
    typed: dict[str, Any] = {}
    for key, value in raw.items():
        spec = listener_key(key) if key.startswith("listener.name.") else lookup(key)
        static[key] = _as_written(value)
        typed[key] = parse_value(spec, value, key)
        if spec.status == INERT:
            inert.append(key)
        elif spec.field == SECURITY:
            security[key] = typed[key]
    for key in inert:
        spec = listener_key(key) if key.startswith("listener.name.") else BROKER_KEYS[key]
        log.warning(
            "config key %s is accepted for Kafka compatibility but has no effect in "
            "trio-broker: %s", key, inert_reason(spec.name),
        )  # fmt: skip
    if security:
        values["security"] = security
    # A field set by several keys takes the most specific one present (Kafka's synonyms);
    # keys that are not synonyms (node.id and broker.id) must agree, as in Kafka.
    chosen: dict[str, str] = {}
    for key in typed:
        row = BROKER_KEYS.get(key)
        if row is None or row.status != APPLIED or row.field in (None, SECURITY):
            continue
        field = str(row.field)
        other = chosen.setdefault(field, key)
        if other == key:
            continue
        if _precedence(key) < _precedence(other):
            chosen[field] = key
        elif _precedence(key) == _precedence(other) and typed[key] != typed[other]:
            raise ConfigError(f"{key}: {typed[key]} differs from {other} = {typed[other]}")
    for field, key in chosen.items():
        value = typed[key]
        if BROKER_KEYS[key].scale != 1:
            value = -1 if value < 0 else value * BROKER_KEYS[key].scale  # negative: no limit
        if field == "data_dir":
            dirs = [d.strip() for d in str(value).split(",") if d.strip()]
            if len(dirs) > 1:
                values["extra_log_dirs"] = tuple(Path(d) for d in dirs[1:])
            value = dirs[0] if dirs else value
        if field == "group_consumer_assignors":
            value = _assignors(key, value)
        if field == "group_consumer_migration_policy":
            value = _migration_policy(key, value)
        values[field] = value
    values.update(_listeners(typed))
    return values, static


def _assignors(key: str, value: Any) -> tuple[str, ...]:
    """group.consumer.assignors: Kafka's short names (its class names are not ours)."""
    names = [n.strip() for n in value.split(",")] if isinstance(value, str) else list(value)
    names = [n for n in names if n]
    unknown = [n for n in names if n not in ("uniform", "range")]
    if not names or unknown:
        raise ConfigError(f"{key}: {value!r}: the assignors are uniform and range")
    return tuple(names)


MIGRATION_POLICIES = ("bidirectional", "upgrade", "downgrade", "disabled")


def _migration_policy(key: str, value: Any) -> str:
    """group.consumer.migration.policy: one of Kafka's values, any case (as Kafka)."""
    policy = str(value).strip().lower()
    if policy not in MIGRATION_POLICIES:
        raise ConfigError(f"{key}: {value!r}: one of {', '.join(MIGRATION_POLICIES)}")
    return policy


def _precedence(key: str) -> int:
    """0 for the most specific key of a synonym group (log.retention.ms), then 1, 2, ..."""
    for group in SYNONYMS:
        if key in group:
            return group.index(key)
    return 0


def _listeners(typed: dict[str, Any]) -> dict[str, Any]:
    """listeners / advertised.listeners without the controller.listener.names entries.

    A combined Kafka node's file also names its controller listener; trio-broker has
    no controller quorum, so that listener is not opened.
    """
    values: dict[str, Any] = {}
    controllers = {
        name.strip().upper()
        for name in str(typed.get("controller.listener.names") or "").split(",")
        if name.strip()
    }

    def broker_entries(key: str) -> list[str]:
        entries = [e.strip() for e in str(typed.get(key) or "").split(",") if e.strip()]
        kept = [e for e in entries if e.partition("://")[0].upper() not in controllers]
        for entry in entries:
            if entry not in kept and key == "listeners":
                log.info("listener %s is a controller listener: not opened here", entry)
        return kept

    if "listeners" in typed:
        kept = broker_entries("listeners")
        if not kept:
            raise ConfigError("listeners: no broker listener (all are controller.listener.names)")
        values["host"], values["port"] = parse_host_port(kept[0], "listeners")
        values["listeners"] = ",".join(kept)
    if "advertised.listeners" in typed:
        values["advertised_listeners"] = ",".join(broker_entries("advertised.listeners")) or None
    return values


def load_config(path: Path | None = None, **overrides: Any) -> BrokerConfig:
    """Defaults, then the config file (TOML or Java properties), then explicit overrides.

    ``static_keys`` of the result holds every key the file set, as written, and the
    keys of the overridden fields (CLI flags): DescribeConfigs reports them as
    STATIC_BROKER_CONFIG.
    """
    values: dict[str, Any] = {}
    static: dict[str, str] = {}
    if path is not None:
        raw, quotas = read_config_file(path)
        if quotas is not None:
            values["quotas"] = quotas
        file_values, static = _apply_keys(raw)
        values.update(file_values)
    given = {k: v for k, v in overrides.items() if v is not None}
    values.update(given)
    for field, value in given.items():
        key = KEY_FOR_FIELD.get(field)
        if key is not None and field not in ("host", "port"):
            static[key] = _as_written(value)
    if "host" in given or "port" in given:
        static.setdefault("listeners", f"PLAINTEXT://{values.get('host')}:{values.get('port')}")
    if "data_dir" in given:  # --data-dir: one dir, whatever log.dirs said
        values.pop("extra_log_dirs", None)
    if "data_dir" in values:
        values["data_dir"] = Path(values["data_dir"])
    if values.get("capture_dir") is not None:
        values["capture_dir"] = Path(values["capture_dir"])
    return BrokerConfig(**values, static_keys=static).validate()


def ensure_cluster_id(
    data_dir: Path | None, configured: str | None, extra_log_dirs: tuple[Path, ...] = ()
) -> str:
    """Keep one cluster id per data dir (meta.properties, as Kafka does). With several
    log dirs each has its meta.properties, and (as Kafka) they must agree."""
    if configured:
        return configured
    if data_dir is None:
        return _new_cluster_id()
    found = {d: _read_cluster_id(d) for d in (data_dir, *extra_log_dirs)}
    ids = {i for i in found.values() if i is not None}
    if len(ids) > 1:
        raise ConfigError(
            "log dirs belong to different clusters: "
            + ", ".join(f"{d} has cluster.id {i}" for d, i in found.items() if i is not None)
        )
    cluster_id = ids.pop() if ids else _new_cluster_id()
    for d, i in found.items():
        if i is None:
            # Durably, or a power cut brings back an empty file and the next start
            # makes a new id.
            make_dirs_durable(d)
            write_file_atomically(
                d / "meta.properties", f"cluster.id={cluster_id}\nversion=1\n".encode()
            )
    return cluster_id


def _read_cluster_id(data_dir: Path) -> str | None:
    meta = data_dir / "meta.properties"
    if meta.exists():
        for line in meta.read_text().splitlines():
            if line.startswith("cluster.id="):
                return line.split("=", 1)[1].strip()
    return None


def _new_cluster_id() -> str:
    import base64

    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
