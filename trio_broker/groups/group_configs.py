"""The broker's side of group configs: the values a GROUP resource's keys default to and
are bounded by (storage/group_configs.py holds the table and the overrides)."""

from __future__ import annotations

from trio_broker.config import BrokerConfig
from trio_broker.config_keys import APPLIED, BROKER_KEYS
from trio_broker.storage.group_configs import broker_keys_read


def broker_value(config: BrokerConfig, key: str) -> str:
    """A group.* broker key's value in force: the field it sets, else as written, else
    Kafka's default (group.share.max.record.lock.duration.ms)."""
    spec = BROKER_KEYS[key]
    if spec.status == APPLIED and spec.field is not None and spec.scale == 1:
        return str(getattr(config, spec.field))
    return config.static_keys.get(key, spec.kafka_default or "")


def broker_values(config: BrokerConfig) -> dict[str, str]:
    """Every broker key the group configs read (defaults and bounds), by name."""
    return {key: broker_value(config, key) for key in broker_keys_read()}
