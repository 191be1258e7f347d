"""docs/configuration.md's key tables must be the ones generated from the key table."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from tests.load_tool import load_tool
from trio_broker.config_keys import APPLIED, BROKER_KEYS, INERT

ROOT = Path(__file__).resolve().parents[3]


def _load_tool() -> ModuleType:
    return load_tool("config_table.py")


config_table = _load_tool()


def test_doc_tables_are_the_generated_tables() -> None:
    text = (ROOT / "docs" / "configuration.md").read_text()
    assert config_table.extract(text) == config_table.block(), (
        "docs/configuration.md is out of date: run .venv/bin/python tools/config_table.py --write"
    )


def test_every_key_is_listed_once_under_its_status() -> None:
    block = config_table.block()
    applied, inert = block.split("### Accepted with a warning")
    for name, spec in BROKER_KEYS.items():
        assert spec.status in (APPLIED, INERT)
        where = applied if spec.status == APPLIED else inert
        assert where.count(f"`{name}`") == 1, name
        assert (inert if spec.status == APPLIED else applied).count(f"`{name}`") == 0, name


def test_the_example_toml_of_operations_md_loads(tmp_path: Path) -> None:
    """Every key of the documented example is accepted, with its documented default."""
    from trio_broker.config import BrokerConfig, load_config

    text = (ROOT / "docs" / "operations.md").read_text()
    example = text.split("```toml\n", 1)[1].split("```", 1)[0]
    path = tmp_path / "broker.toml"
    path.write_text(example)
    config = load_config(path)
    defaults = BrokerConfig()
    for field in ("num_partitions", "retention_ms", "max_connections_per_ip",
                  "group_min_session_timeout_ms", "delete_topic_enable", "message_max_bytes"):  # fmt: skip
        assert getattr(config, field) == getattr(defaults, field), field
