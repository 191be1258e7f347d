"""The group config rules (storage/group_configs.py): Kafka's checks and the store."""

from __future__ import annotations

from pathlib import Path

import pytest

from trio_broker.config import BrokerConfig
from trio_broker.groups.group_configs import broker_values
from trio_broker.storage.errors import InvalidConfigError
from trio_broker.storage.group_configs import (
    AutoOffsetReset,
    GroupConfigStore,
    check_group_configs,
    parse_auto_offset_reset,
)

BROKER = broker_values(BrokerConfig())


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("earliest", AutoOffsetReset("earliest")),
        ("LATEST", AutoOffsetReset("latest")),
        ("by_duration:PT1H", AutoOffsetReset("by_duration", 3_600_000)),
        ("by_duration:P1DT2M3.5S", AutoOffsetReset("by_duration", 86_400_000 + 123_500)),
        ("by_duration:PT0S", AutoOffsetReset("by_duration", 0)),
    ],
)
def test_auto_offset_reset_parses(text: str, parsed: AutoOffsetReset) -> None:
    assert parse_auto_offset_reset(text) == parsed


@pytest.mark.parametrize(
    "text", ["none", "by_duration:", "by_duration:P", "by_duration:PT", "by_duration:-PT1H",
             "by_duration:PT-1H", "by_duration:1H", "earliest,latest"],
)  # fmt: skip
def test_auto_offset_reset_refuses(text: str) -> None:
    """Kafka refuses a negative duration and anything but its three forms."""
    with pytest.raises(ValueError):
        parse_auto_offset_reset(text)


def test_bounds_are_the_brokers() -> None:
    """The group value must sit within group.share.min/max.*: the broker's file moves them."""
    check_group_configs({"share.record.lock.duration.ms": "60000"}, BROKER)
    wide = broker_values(BrokerConfig(static_keys={
        "group.share.max.record.lock.duration.ms": "3600000"}))  # fmt: skip
    check_group_configs({"share.record.lock.duration.ms": "600000"}, wide)
    with pytest.raises(InvalidConfigError, match="in the range 15000 to 60000 inclusive"):
        check_group_configs({"share.record.lock.duration.ms": "600000"}, BROKER)


def test_session_timeout_must_exceed_the_heartbeat() -> None:
    wide = broker_values(BrokerConfig(static_keys={
        "group.share.max.heartbeat.interval.ms": "60000"}))  # fmt: skip
    check_group_configs({"share.heartbeat.interval.ms": "44999"}, wide)
    with pytest.raises(InvalidConfigError, match=r"share\.session\.timeout\.ms must be greater"):
        check_group_configs({"share.heartbeat.interval.ms": "45000"}, wide)


def test_the_store_is_durable_and_forgets_empty_groups(tmp_path: Path) -> None:
    store = GroupConfigStore(tmp_path)
    store.set("g", {"share.auto.offset.reset": "earliest"})
    store.set("h", {"share.delivery.count.limit": "3"})
    store.set("h", {})
    again = GroupConfigStore(tmp_path)
    assert again.groups == {"g": {"share.auto.offset.reset": "earliest"}}
