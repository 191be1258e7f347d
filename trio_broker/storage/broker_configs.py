"""Dynamic broker configs (KIP-226): log defaults changed at runtime through the Admin API.

Two levels, as in Kafka: the cluster-wide default (the BROKER resource named "") and
this broker (the resource named by its node id); this broker's value wins. The keys
that can be set (:data:`DYNAMIC_BROKER_KEYS`): the broker keys that are the default of a
topic config the partition logs or the leader terms apply (:data:`LOG_DEFAULT_KEYS`:
retention and segment sizes, min.insync.replicas), checked with that topic config's bounds, and the replication throttle rates (:data:`THROTTLE_RATE_KEYS`, bytes
per second, at least 0 as in Kafka), which the replica manager reads when it throttles.

File mode keeps them in ``<data_dir>/dynamic-broker-configs.json``, replaced
atomically on every change (rare); memory mode keeps them in this object only.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from trio_broker.storage.config_file import read_config_tables, string_table, write_config_tables
from trio_broker.storage.errors import InvalidConfigError
from trio_broker.storage.topic_configs import TOPIC_CONFIGS, check_topic_configs

BROKER_CONFIGS_FILE = "dynamic-broker-configs.json"
_FORMAT_VERSION = 1
#: The two levels: the cluster-wide default and this broker's own values.
CLUSTER_DEFAULT, THIS_BROKER = "cluster_default", "broker"

#: The topic configs whose broker default can be changed at runtime (the partition logs
#: apply the first four, the leader terms min.insync.replicas; Kafka makes every log
#: default dynamic, here these five).
DYNAMIC_TOPIC_DEFAULTS = (
    "min.insync.replicas", "retention.bytes", "retention.ms", "segment.bytes", "segment.ms",
)  # fmt: skip
#: Dynamic log default -> the topic config whose default it is (log.retention.ms -> retention.ms).
LOG_DEFAULT_KEYS: Mapping[str, str] = {
    str(TOPIC_CONFIGS[topic_key].broker_key): topic_key for topic_key in DYNAMIC_TOPIC_DEFAULTS
}

MIN_INSYNC_REPLICAS = "min.insync.replicas"
LEADER_THROTTLED_RATE = "leader.replication.throttled.rate"
FOLLOWER_THROTTLED_RATE = "follower.replication.throttled.rate"
#: Dynamic keys that are no topic config's default: the replication throttles (KIP-73),
#: as Kafka's reassignment tool sets them on each broker a move involves.
THROTTLE_RATE_KEYS = frozenset({LEADER_THROTTLED_RATE, FOLLOWER_THROTTLED_RATE})
#: Every broker key that can be set at runtime -> the topic config whose default it is,
#: or None (a throttle rate).
DYNAMIC_BROKER_KEYS: Mapping[str, str | None] = {
    **LOG_DEFAULT_KEYS,
    **dict.fromkeys(sorted(THROTTLE_RATE_KEYS)),
}
_LONG_MAX = 2**63 - 1


def check_broker_configs(configs: Mapping[str, str]) -> None:
    """Raise InvalidConfigError unless every key is dynamic and every value in bounds."""
    static = sorted(key for key in configs if key not in DYNAMIC_BROKER_KEYS)
    if static:
        raise InvalidConfigError(f"Cannot update these configs dynamically: {static}")
    for key in THROTTLE_RATE_KEYS & set(configs):
        try:
            rate = int(configs[key])
        except ValueError:
            raise InvalidConfigError(f"{key} must be an integer, got {configs[key]!r}") from None
        if not 0 <= rate <= _LONG_MAX:
            raise InvalidConfigError(f"{key} must be in [0, {_LONG_MAX}], got {rate}")
    check_topic_configs(
        {LOG_DEFAULT_KEYS[key]: value for key, value in configs.items()
         if key in LOG_DEFAULT_KEYS}
    )  # fmt: skip


class BrokerConfigStore:
    """The dynamic broker configs of both levels, persisted in ``data_dir`` (or not, if None)."""

    def __init__(self, data_dir: Path | None) -> None:
        self.path = None if data_dir is None else Path(data_dir) / BROKER_CONFIGS_FILE
        self.levels: dict[str, dict[str, str]] = {CLUSTER_DEFAULT: {}, THIS_BROKER: {}}
        data = read_config_tables(self.path, _FORMAT_VERSION)
        if data is not None:
            for level in self.levels:
                self.levels[level] = string_table(data[level])

    def get(self, level: str) -> dict[str, str]:
        return dict(self.levels[level])

    def set(self, level: str, configs: Mapping[str, str]) -> None:
        """Replace one level's configs (checked first); durable before it returns."""
        check_broker_configs(configs)
        levels = {**self.levels, level: dict(configs)}
        write_config_tables(self.path, _FORMAT_VERSION, levels)
        self.levels = levels

    def effective(self) -> dict[str, str]:
        """Topic-config form of the log defaults in force: this broker's over the cluster
        default (the throttle rates are no log default: :meth:`value`)."""
        merged = {**self.levels[CLUSTER_DEFAULT], **self.levels[THIS_BROKER]}
        return {
            LOG_DEFAULT_KEYS[key]: value for key, value in merged.items() if key in LOG_DEFAULT_KEYS
        }

    def value(self, key: str) -> str | None:
        """A dynamic key's value in force (this broker's, else the cluster default's), or
        None when neither level sets it (the config file's value applies)."""
        for level in (THIS_BROKER, CLUSTER_DEFAULT):
            if key in self.levels[level]:
                return self.levels[level][key]
        return None

    def throttle_rate(self, key: str, static: int) -> int:
        """The rate in force of one of :data:`THROTTLE_RATE_KEYS`: dynamic, else ``static``."""
        value = self.value(key)
        try:
            return static if value is None else int(value)
        except ValueError:  # checked when set; a hand-edited file is not trusted
            return static

    def min_insync_replicas(self, topic_configs: Mapping[str, str], static: int) -> int:
        """The min.insync.replicas a leader term of a topic with ``topic_configs`` applies:
        the topic's own, else the dynamic one in force (this broker's, else the
        cluster-wide default), else ``static`` (the config file's); at least 1."""
        dynamic = self.value(MIN_INSYNC_REPLICAS)
        try:
            return max(1, int(topic_configs.get(MIN_INSYNC_REPLICAS, dynamic or static)))
        except ValueError:
            return static
