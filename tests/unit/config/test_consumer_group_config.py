"""group.consumer.* keys of a server.properties or TOML file reach the KIP-848 groups."""

from __future__ import annotations

from pathlib import Path

import pytest

from trio_broker.config import load_config
from trio_broker.config_errors import ConfigError


def test_consumer_group_keys_are_applied(tmp_path: Path) -> None:
    props = tmp_path / "server.properties"
    props.write_text(
        "group.consumer.assignors=range, uniform\n"
        "group.consumer.session.timeout.ms=50000\n"
        "group.consumer.heartbeat.interval.ms=3000\n"
    )
    config = load_config(props)
    assert config.group_consumer_assignors == ("range", "uniform")
    assert config.group_consumer_session_timeout_ms == 50_000
    assert config.group_consumer_heartbeat_interval_ms == 3_000
    toml = tmp_path / "broker.toml"
    toml.write_text('"group.consumer.assignors" = ["uniform"]\n')
    assert load_config(toml).group_consumer_assignors == ("uniform",)


def test_an_unknown_assignor_is_a_config_error(tmp_path: Path) -> None:
    props = tmp_path / "server.properties"
    props.write_text("group.consumer.assignors=uniform,sticky\n")
    with pytest.raises(ConfigError, match="sticky"):
        load_config(props)
