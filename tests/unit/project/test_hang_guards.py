"""Per-test timeouts are hang guards, not speed bounds (issue 30).

pytest-timeout's default here is 300 s (pyproject.toml). A test marked with less says
"this must finish in N s", which a loaded machine breaks while nothing is wrong: ci16
(a fresh clone at load 27) lost ``test_committed_offsets_survive_a_restart`` to its 90 s
mark, inside waits that each had their own deadline, and the next test of that worker
with it. A test may ask for more than the default, never less; its own waits (a
condition and a deadline, docs/testing-waits.md) say when something is wrong.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
DEFAULT_S = 300
MARK = re.compile(r"mark\.timeout\((\d+)\)")


def test_no_test_asks_for_less_than_the_default_timeout() -> None:
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert re.search(rf"^timeout = {DEFAULT_S}$", pyproject, re.M), "the default moved"
    tight = [
        f"{path.relative_to(ROOT)}:{text[: m.start()].count(chr(10)) + 1}: {m.group(0)}"
        for folder in ("tests", "statemachine", "spec", "fuzz")
        for path in sorted((ROOT / folder).rglob("*.py"))
        for text in [path.read_text()]
        for m in MARK.finditer(text)
        if int(m.group(1)) < DEFAULT_S
    ]
    assert not tight, "timeouts below the default (make them hang guards):\n" + "\n".join(tight)
