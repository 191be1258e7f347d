"""The small JSON files that hold configs set at runtime (dynamic broker configs, group
configs): a version number and string tables, replaced atomically on each change.

This module never imports trio.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trio_broker.storage.durable import write_file_atomically


def read_config_tables(path: Path | None, version: int) -> dict[str, Any] | None:
    """The file's body, or None when there is no file (or no data dir); ValueError for a
    version this broker does not know."""
    if path is None or not path.exists():
        return None
    data = json.loads(path.read_bytes())
    if data.get("version") != version:
        raise ValueError(f"{path}: unknown version {data.get('version')!r}")
    return dict(data)


def write_config_tables(path: Path | None, version: int, tables: Mapping[str, Any]) -> None:
    """Replace the file's body atomically (durable before it returns); nothing without a
    data dir."""
    if path is not None:
        body = {"version": version, **tables}
        write_file_atomically(path, json.dumps(body, indent=1, sort_keys=True).encode())


def string_table(table: Mapping[Any, Any]) -> dict[str, str]:
    return {str(key): str(value) for key, value in table.items()}
