"""docs/protocol.md's API table must be the one generated from the schema table."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from tests.load_tool import load_tool
from trio_broker.protocol.schema import REQUESTS

ROOT = Path(__file__).resolve().parents[3]


def _load_tool() -> ModuleType:
    return load_tool("api_table.py")


api_table = _load_tool()


def test_doc_table_is_generated_table() -> None:
    text = (ROOT / "docs" / "protocol.md").read_text()
    assert api_table.extract(text) == api_table.block(), (
        "docs/protocol.md is out of date: run .venv/bin/python tools/api_table.py --write"
    )


def test_table_lists_every_api_once() -> None:
    rows = [line for line in api_table.api_table().splitlines()[2:]]
    assert [int(row.split("|")[1]) for row in rows] == sorted(REQUESTS)
    for row, (key, schema) in zip(rows, sorted(REQUESTS.items())):
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[2] == f"{schema.min_version}-{schema.max_version}", key
