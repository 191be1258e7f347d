"""Every planted bug of tools/planted_bugs.py still applies to today's code.

A bug's ``old`` text must occur exactly once in its file, or the tool refuses to plant
it; a fix that rewrites those lines makes the bug stale without anyone noticing until
the next scoring run (four went stale so, issue 31). Planted, the file must still
compile: a bug that is a syntax error would be "caught" by every check for nothing.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Protocol

import pytest

from tests.load_tool import load_tool

ROOT = Path(__file__).resolve().parents[3]


def _load_tool() -> ModuleType:
    return load_tool("planted_bugs.py")


class PlantedBug(Protocol):  # the tool's Bug, as far as this test reads it
    name: str
    path: str
    old: str
    new: str


_tool = _load_tool()
EVERY: tuple[PlantedBug, ...] = (
    *_tool.BUGS,
    *_tool.FRESH,
    *_tool.FOURTH,
    *_tool.FIFTH,
    *_tool.SIXTH,
    *_tool.SEVENTH,
    *_tool.EIGHTH,
    *_tool.NINTH,
    *_tool.TENTH,
    *_tool.ELEVENTH,
    *_tool.THIRTEENTH,
    *_tool.FOURTEENTH,
    *_tool.FIFTEENTH,
    *_tool.SIXTEENTH,
    *_tool.SEVENTEENTH,
)


def test_names_are_unique() -> None:
    names = [bug.name for bug in EVERY]
    assert len(names) == len(set(names))


@pytest.mark.parametrize("bug", EVERY, ids=[bug.name for bug in EVERY])
def test_bug_applies_once_and_changes_the_code(bug: PlantedBug) -> None:
    source = (ROOT / bug.path).read_text()
    assert source.count(bug.old) == 1, f"`old` occurs {source.count(bug.old)} times in {bug.path}"
    assert bug.new != bug.old
    compile(source.replace(bug.old, bug.new), bug.path, "exec")
