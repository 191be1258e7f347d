"""Test files need unique base names: the test trees have no ``__init__.py``, so pytest
imports each file as a top-level module by its name, and a second file of the same
name is a collection error that stops the whole run (two did, once)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
TREES = ("tests", "statemachine", "spec", "fuzz", "sim")


def test_every_test_file_name_is_unique() -> None:
    by_name: dict[str, list[str]] = defaultdict(list)
    for tree in TREES:
        for path in (ROOT / tree).rglob("test_*.py"):
            by_name[path.name].append(path.relative_to(ROOT).as_posix())
    assert {name: paths for name, paths in by_name.items() if len(paths) > 1} == {}
