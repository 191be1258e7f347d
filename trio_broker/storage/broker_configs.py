"""Dynamic broker configs (KIP-226): log defaults changed at runtime through the Admin API.

Two levels, as in Kafka: the cluster-wide default (the BROKER resource named "") and
this broker (the resource named by its node id); this broker's value wins. Only the
broker keys that are the default of a topic config the partition logs apply can be
set (:data:`DYNAMIC_BROKER_KEYS`); values are checked with that topic config's bounds.

File mode keeps them in ``<data_dir>/dynamic-broker-configs.json``, replaced
atomically on every change (rare); memory mode keeps them in this object only.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from trio_broker.storage.durable import write_file_atomically
from trio_broker.storage.errors import InvalidConfigError
from trio_broker.storage.topic_configs import TOPIC_CONFIGS, check_topic_configs

BROKER_CONFIGS_FILE = "dynamic-broker-configs.json"
_FORMAT_VERSION = 1
#: The two levels: the cluster-wide default and this broker's own values.
CLUSTER_DEFAULT, THIS_BROKER = "cluster_default", "broker"

#: Dynamic broker key -> the topic config whose default it is (log.retention.ms -> retention.ms).
DYNAMIC_BROKER_KEYS: Mapping[str, str] = {
    spec.broker_key: topic_key
    for topic_key, spec in TOPIC_CONFIGS.items()
    if spec.broker_key is not None and spec.log_field is not None
    and spec.default_field is not None
}  # fmt: skip


def check_broker_configs(configs: Mapping[str, str]) -> None:
    """Raise InvalidConfigError unless every key is dynamic and every value in bounds."""
    static = sorted(key for key in configs if key not in DYNAMIC_BROKER_KEYS)
    if static:
        raise InvalidConfigError(f"Cannot update these configs dynamically: {static}")
    check_topic_configs({DYNAMIC_BROKER_KEYS[key]: value for key, value in configs.items()})


class BrokerConfigStore:
    """The dynamic broker configs of both levels, persisted in ``data_dir`` (or not, if None)."""

    def __init__(self, data_dir: Path | None) -> None:
        self.path = None if data_dir is None else Path(data_dir) / BROKER_CONFIGS_FILE
        self.levels: dict[str, dict[str, str]] = {CLUSTER_DEFAULT: {}, THIS_BROKER: {}}
        if self.path is not None and self.path.exists():
            data = json.loads(self.path.read_bytes())
            if data.get("version") != _FORMAT_VERSION:
                raise ValueError(f"{self.path}: unknown version {data.get('version')!r}")
            for level in self.levels:
                self.levels[level] = {str(k): str(v) for k, v in data[level].items()}

    def get(self, level: str) -> dict[str, str]:
        return dict(self.levels[level])

    def set(self, level: str, configs: Mapping[str, str]) -> None:
        """Replace one level's configs (checked first); durable before it returns."""
        check_broker_configs(configs)
        levels = {**self.levels, level: dict(configs)}
        if self.path is not None:
            body = {"version": _FORMAT_VERSION, **levels}
            write_file_atomically(self.path, json.dumps(body, indent=1, sort_keys=True).encode())
        self.levels = levels

    def effective(self) -> dict[str, str]:
        """Topic-config form of the values in force: this broker's over the cluster default."""
        merged = {**self.levels[CLUSTER_DEFAULT], **self.levels[THIS_BROKER]}
        return {DYNAMIC_BROKER_KEYS[key]: value for key, value in merged.items()}
