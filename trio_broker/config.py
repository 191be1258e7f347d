"""Broker configuration: defaults, a TOML file with Kafka's key names, and CLI overrides.

Every key that Kafka has keeps Kafka's name (``num.partitions``,
``log.segment.bytes``, ...); keys that are ours say so in their comment.
Unknown keys and bad values fail at start with a message naming the key.
"""

from __future__ import annotations

import tomllib
import uuid
from pathlib import Path
from typing import Any

import attrs

from trio_broker.config_errors import ConfigError, parse_host_port
from trio_broker.security.listeners import resolve_listeners
from trio_broker.storage.durable import make_dirs_durable, write_file_atomically

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
    listener_security_protocol_map: str = ""
    #: ssl.*, sasl.enabled.mechanisms, connections.max.reauth.ms and their
    #: listener.name.<name>.<key> overrides, by Kafka key (docs/security.md).
    security: dict[str, Any] = attrs.field(factory=dict, hash=False)
    data_dir: Path = Path("data")
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
    flush_interval_messages: int | None = None
    flush_interval_ms: int | None = None
    connections_max_idle_ms: int = 600_000
    group_initial_rebalance_delay_ms: int = 3000
    offsets_retention_minutes: int = 7 * 24 * 60
    capture_dir: Path | None = None  # ours: write every frame to Parquet here (capture.dir)
    #: ours: HOST:PORT of the /metrics and /health responder (metrics.listener); None = off.
    metrics_listener: str | None = None
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

    @property
    def advertised(self) -> tuple[str, int]:
        return (self.advertised_host or self.host, self.advertised_port or self.port)

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
                     "quota_window_num", "quota_window_size_seconds"):  # fmt: skip
            if getattr(self, name) <= 0:
                raise ConfigError(f"{KEY_FOR_FIELD.get(name, name)}: must be positive")
        if self.metrics_listener is not None:
            parse_host_port(self.metrics_listener, "metrics.listener")
        slow_ms = self.request_log_slow_ms
        if isinstance(slow_ms, bool) or not isinstance(slow_ms, int) or slow_ms < 0:
            raise ConfigError(f"request.log.slow.ms: expected an integer >= 0, got {slow_ms!r}")
        resolve_listeners(self)  # raises ConfigError naming the bad key
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


#: TOML (Kafka-style) key -> BrokerConfig field.
FIELD_FOR_KEY: dict[str, str] = {
    "listeners": "listeners",
    "advertised.listeners": "advertised.listeners",
    "listener.security.protocol.map": "listener_security_protocol_map",
    "log.dirs": "data_dir",
    "log.dir": "data_dir",
    "storage": "storage",
    "processing.model": "processing_model",
    "node.id": "node_id",
    "broker.id": "node_id",
    "cluster.id": "cluster_id",
    "num.io.threads": "num_handlers",
    "max.connections": "max_connections",
    "max.connections.per.ip": "max_connections_per_ip",
    "max.in.flight.requests.per.connection": "max_in_flight_per_connection",
    "queued.max.request.bytes": "queued_max_request_bytes",
    "socket.request.max.bytes": "socket_request_max_bytes",
    "auto.create.topics.enable": "auto_create_topics",
    "num.partitions": "num_partitions",
    "log.segment.bytes": "segment_bytes",
    "log.roll.ms": "segment_ms",
    "log.retention.ms": "retention_ms",
    "log.retention.bytes": "retention_bytes",
    "log.retention.check.interval.ms": "retention_check_interval_ms",
    "log.flush.interval.messages": "flush_interval_messages",
    "log.flush.interval.ms": "flush_interval_ms",
    "connections.max.idle.ms": "connections_max_idle_ms",
    "group.initial.rebalance.delay.ms": "group_initial_rebalance_delay_ms",
    "offsets.retention.minutes": "offsets_retention_minutes",
    "capture.dir": "capture_dir",
    "metrics.listener": "metrics_listener",
    "request.log.slow.ms": "request_log_slow_ms",
    "quota.window.num": "quota_window_num",
    "quota.window.size.seconds": "quota_window_size_seconds",
    "authorizer.class.name": "authorizer_class_name",
    "super.users": "super_users",
    "allow.everyone.if.no.acl.found": "allow_everyone_if_no_acl_found",
}
KEY_FOR_FIELD = {v: k for k, v in FIELD_FOR_KEY.items()}


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


def load_config(path: Path | None = None, **overrides: Any) -> BrokerConfig:
    """Defaults, then the TOML file, then explicit overrides (CLI flags)."""
    values: dict[str, Any] = {}
    if path is not None:
        try:
            raw = tomllib.loads(Path(path).read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"cannot read config {path}: {exc}") from exc
        fields = attrs.fields_dict(BrokerConfig)
        quotas = raw.pop("quotas", None)  # entity names contain dots and '=': not flattened
        if quotas is not None:
            if not isinstance(quotas, dict):
                raise ConfigError("quotas: expected a table of entities")
            values["quotas"] = quotas
        for key, value in _flatten(raw).items():
            field = FIELD_FOR_KEY.get(key)
            if field is None and _is_security_key(key):
                values.setdefault("security", {})[key] = value
                continue
            if field is None:
                raise ConfigError(f"unknown config key {key!r}")
            if field == "listeners":
                first = value.split(",")[0] if isinstance(value, str) else value[0]
                values["host"], values["port"] = parse_host_port(first, key)
                values["listeners"] = value if isinstance(value, str) else ",".join(value)
            elif field == "advertised.listeners":
                values["advertised_listeners"] = (
                    value if isinstance(value, str) else ",".join(value)
                )
            else:
                values[field] = _coerce(key, fields[field].default, value)
    values.update({k: v for k, v in overrides.items() if v is not None})
    if "data_dir" in values:
        values["data_dir"] = Path(values["data_dir"])
    if values.get("capture_dir") is not None:
        values["capture_dir"] = Path(values["capture_dir"])
    return BrokerConfig(**values).validate()


def _is_security_key(key: str) -> bool:
    """TLS/SASL keys live in BrokerConfig.security, checked by resolve_listeners."""
    return key.startswith(("ssl.", "sasl.", "listener.name.")) or key == "connections.max.reauth.ms"


def _coerce(key: str, default: Any, value: Any) -> Any:
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: expected true or false, got {value!r}")
        return value
    if isinstance(default, int) or (default is None and isinstance(value, int)):
        try:
            return int(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{key}: expected an integer, got {value!r}") from None
    if isinstance(default, Path):
        return Path(value.split(",")[0] if isinstance(value, str) else value[0])
    return value if value is None else str(value)


def ensure_cluster_id(data_dir: Path | None, configured: str | None) -> str:
    """Keep one cluster id per data dir (meta.properties, as Kafka does)."""
    if configured:
        return configured
    if data_dir is None:
        return _new_cluster_id()
    meta = data_dir / "meta.properties"
    if meta.exists():
        for line in meta.read_text().splitlines():
            if line.startswith("cluster.id="):
                return line.split("=", 1)[1].strip()
    cluster_id = _new_cluster_id()
    # Durably, or a power cut brings back an empty file and the next start makes a new id.
    make_dirs_durable(data_dir)
    write_file_atomically(meta, f"cluster.id={cluster_id}\nversion=1\n".encode())
    return cluster_id


def _new_cluster_id() -> str:
    import base64

    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
