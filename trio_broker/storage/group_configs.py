"""Group configs (KIP-848, KIP-932): per-group overrides set on the GROUP config resource.

Kafka 4 accepts a fixed set of keys on a group (its GroupConfig), each the per-group
form of a broker key (``share.record.lock.duration.ms`` of
``group.share.record.lock.duration.ms``) and held within that broker key's bounds
(``group.share.min/max.record.lock.duration.ms``); ``share.auto.offset.reset`` and
``share.isolation.level`` have no broker key. :data:`GROUP_CONFIGS` is the table;
:func:`check_group_configs` checks a group's whole override set as Kafka does, with its
messages (every refusal is INVALID_CONFIG).

File mode keeps every group's overrides in ``<data_dir>/group-configs.json``, replaced
atomically on every change (rare), as the dynamic broker configs are; memory mode keeps
them in this object only.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

from trio_broker.storage.config_file import read_config_tables, string_table, write_config_tables
from trio_broker.storage.errors import InvalidConfigError

GROUP_CONFIGS_FILE = "group-configs.json"
_FORMAT_VERSION = 1
_INT_MAX = 2**31 - 1

# DescribeConfigs' config types (Kafka's DescribeConfigsResponse.ConfigType).
INT_TYPE, STRING_TYPE = 3, 2


class GroupConfig(NamedTuple):
    #: Kafka's type: INT_TYPE (an int within [at_least, the broker bounds]) or STRING_TYPE.
    type: int
    #: The broker key whose value is the group's default; None: the default is ``default``.
    broker_key: str | None
    #: The broker keys holding the least and the most a group may set (INT only).
    min_key: str | None = None
    max_key: str | None = None
    #: Kafka's ConfigDef lower bound, checked before the broker bounds.
    at_least: int = 1
    #: The values a STRING key takes (None: checked by its own rule).
    choices: tuple[str, ...] | None = None
    #: The default of a key with no broker key.
    default: str | None = None


def _int(key: str, at_least: int = 1) -> GroupConfig:
    return GroupConfig(
        INT_TYPE, f"group.{key}", f"group.{key.replace('.', '.min.', 1)}",
        f"group.{key.replace('.', '.max.', 1)}", at_least,
    )  # fmt: skip


SHARE_AUTO_OFFSET_RESET = "share.auto.offset.reset"
SHARE_RECORD_LOCK_DURATION_MS = "share.record.lock.duration.ms"

#: Kafka 4's group configs we take (its streams.*, assignment-interval, offload and DLQ
#: keys are not here: "Unknown group config name").
GROUP_CONFIGS: Mapping[str, GroupConfig] = {
    "consumer.heartbeat.interval.ms": _int("consumer.heartbeat.interval.ms"),
    "consumer.session.timeout.ms": _int("consumer.session.timeout.ms"),
    SHARE_AUTO_OFFSET_RESET: GroupConfig(STRING_TYPE, None, default="latest"),
    "share.delivery.count.limit": _int("share.delivery.count.limit", at_least=2),
    "share.heartbeat.interval.ms": _int("share.heartbeat.interval.ms"),
    "share.isolation.level": GroupConfig(
        STRING_TYPE,
        None,
        choices=("read_committed", "read_uncommitted"),
        default="read_uncommitted",
    ),
    "share.partition.max.record.locks": _int("share.partition.max.record.locks", at_least=100),
    SHARE_RECORD_LOCK_DURATION_MS: _int(SHARE_RECORD_LOCK_DURATION_MS, at_least=1000),
    "share.session.timeout.ms": _int("share.session.timeout.ms"),
}
#: Pairs Kafka checks together: the session timeout must exceed the heartbeat interval.
_SESSION_OVER_HEARTBEAT = (
    ("consumer.session.timeout.ms", "consumer.heartbeat.interval.ms"),
    ("share.session.timeout.ms", "share.heartbeat.interval.ms"),
)

_DURATION = re.compile(
    r"P(?:(\d+)D)?(?:T(?=\d)(?:(\d+)H)?(?:(\d+)M)?(?:(\d+)(?:[.,](\d{1,9}))?S)?)?", re.IGNORECASE
)


class AutoOffsetReset(NamedTuple):
    """share.auto.offset.reset parsed: "earliest", "latest", or "by_duration" with its ms."""

    kind: str
    duration_ms: int = 0


def parse_auto_offset_reset(value: str) -> AutoOffsetReset:
    """Raise ValueError unless ``value`` is earliest, latest or by_duration:<ISO-8601
    duration, PnDTnHnMn.nS, not negative>."""
    lowered = value.strip().lower()
    if lowered in ("earliest", "latest"):
        return AutoOffsetReset(lowered)
    prefix = "by_duration:"
    if lowered.startswith(prefix):
        match = _DURATION.fullmatch(value.strip()[len(prefix) :])
        if match is not None and match.group(0).upper() not in ("P", "PT"):
            days, hours, minutes, seconds, fraction = (g or "0" for g in match.groups())
            ms = (((int(days) * 24 + int(hours)) * 60 + int(minutes)) * 60 + int(seconds)) * 1000
            return AutoOffsetReset("by_duration", ms + int(fraction.ljust(9, "0")[:3]))
    raise ValueError(value)


def check_group_configs(configs: Mapping[str, str], broker: Mapping[str, str]) -> None:
    """Raise InvalidConfigError unless a group may hold ``configs`` whole; ``broker``: the
    broker's value of each bound and default key (group.share.max.record.lock.duration.ms)."""
    for name in configs:
        if name not in GROUP_CONFIGS:
            raise InvalidConfigError(f"Unknown group config name: {name}")
    ints: dict[str, int] = {}
    for name, value in configs.items():
        spec = GROUP_CONFIGS[name]
        if spec.type == INT_TYPE:
            try:
                number = int(value.strip())
            except ValueError:
                raise InvalidConfigError(
                    f"Invalid value {value} for configuration {name}: Not a number of type INT"
                ) from None
            if not -(2**31) <= number <= _INT_MAX:
                raise InvalidConfigError(
                    f"Invalid value {value} for configuration {name}: Not a number of type INT"
                )
            if number < spec.at_least:
                raise InvalidConfigError(
                    f"Invalid value {number} for configuration {name}: "
                    f"Value must be at least {spec.at_least}"
                )
            assert spec.min_key is not None and spec.max_key is not None
            low, high = int(broker[spec.min_key]), int(broker[spec.max_key])
            if not low <= number <= high:
                raise InvalidConfigError(f"{name} must be in the range {low} to {high} inclusive.")
            ints[name] = number
        elif name == SHARE_AUTO_OFFSET_RESET:
            try:
                parse_auto_offset_reset(value)
            except ValueError:
                raise InvalidConfigError(
                    f"Invalid value {value} for configuration {name}: Invalid value `{value}` "
                    f"for configuration {name}. The value must be either 'earliest', 'latest' "
                    "or of the format 'by_duration:<PnDTnHnMn.nS>'."
                ) from None
        elif spec.choices is not None and value not in spec.choices:
            raise InvalidConfigError(
                f"Invalid value {value} for configuration {name}: "
                f"String must be one of: {', '.join(spec.choices)}"
            )
    for session, heartbeat in _SESSION_OVER_HEARTBEAT:
        if session not in ints and heartbeat not in ints:
            continue
        session_ms = ints.get(session, int(broker[f"group.{session}"]))
        heartbeat_ms = ints.get(heartbeat, int(broker[f"group.{heartbeat}"]))
        if session_ms <= heartbeat_ms:
            raise InvalidConfigError(f"{session} must be greater than {heartbeat}")


def broker_keys_read() -> list[str]:
    """Every broker key :func:`check_group_configs` and the group defaults read."""
    keys = []
    for spec in GROUP_CONFIGS.values():
        keys += [k for k in (spec.broker_key, spec.min_key, spec.max_key) if k is not None]
    return keys


class GroupConfigStore:
    """Every group's config overrides, persisted in ``data_dir`` (or not, if None)."""

    def __init__(self, data_dir: Path | None) -> None:
        self.path = None if data_dir is None else Path(data_dir) / GROUP_CONFIGS_FILE
        data = read_config_tables(self.path, _FORMAT_VERSION)
        self.groups: dict[str, dict[str, str]] = (
            {} if data is None else {str(g): string_table(c) for g, c in data["groups"].items()}
        )

    def get(self, group_id: str) -> dict[str, str]:
        return dict(self.groups.get(group_id, {}))

    def set(self, group_id: str, configs: Mapping[str, str]) -> None:
        """Replace one group's overrides (checked by the caller); durable before it returns.
        An empty set forgets the group."""
        groups = {g: c for g, c in self.groups.items() if g != group_id}
        if configs:
            groups[group_id] = dict(configs)
        write_config_tables(self.path, _FORMAT_VERSION, {"groups": groups})
        self.groups = groups
