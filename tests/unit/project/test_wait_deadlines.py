"""Process-level waits have deadlines of at least a minute (issue 30: slow is never red).

A deadline on a condition that a loaded machine can delay (a broker start, a leader
election, a rebalance, a client's admin call) tests the machine's speed, not the
broker: at load 20 a 20 s wait for a new controller fails a correct broker. The
deadline only costs time when the test fails anyway, so it is generous. This scans the
process-level trees for literal deadlines below :data:`FLOOR_S` given to the shared wait
helpers (docs/testing-waits.md) and to a client future's ``result(timeout=...)``
outside ``pytest.raises``. A short time that *is* the property (an observation window,
a timeout the test expects to expire) is written with ``closed_by_peer``, a socket
timeout or ``pytest.raises``, which this does not scan.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SCANNED = ("tests/cluster", "tests/e2e", "tests/integration", "tests/reliability", "tests/plugin")
FLOOR_S = 60

#: Wait helper -> (position of its deadline argument, its keyword names).
HELPERS: dict[str, tuple[int, tuple[str, ...]]] = {
    "eventually": (2, ("timeout_s",)),
    "every_broker_knows": (3, ("timeout_s",)),
    "every_broker_lists": (2, ("timeout_s",)),
    "converged": (3, ("timeout_s",)),
    "full_isr": (3, ("timeout_s",)),
    "_wait_for": (1, ("timeout",)),
}
#: Files whose ``wait_until(condition, timeout, what)`` is the e2e helper of that shape.
WAIT_UNTIL_POSITION = 1


def _short(node: ast.expr) -> bool:
    return (
        isinstance(node, ast.Constant)
        and isinstance(node.value, int | float)
        and not isinstance(node.value, bool)
        and node.value < FLOOR_S
    )


def short_deadlines(source: str, label: str) -> list[str]:
    """``label:line: call`` for each short deadline in ``source``."""
    tree = ast.parse(source)
    expecting_failure = [
        (node.lineno, node.end_lineno or node.lineno)
        for node in ast.walk(tree)
        if isinstance(node, ast.With | ast.AsyncWith)
        and any("raises" in ast.unparse(item.context_expr) for item in node.items)
    ]
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        deadlines: list[ast.expr] = []
        if name in HELPERS:
            position, keywords = HELPERS[name]
            deadlines += node.args[position : position + 1]
            deadlines += [k.value for k in node.keywords if k.arg in keywords]
        elif name == "wait_until" and len(node.args) > 2:
            deadlines.append(node.args[WAIT_UNTIL_POSITION])
        elif name == "result" and not any(a <= node.lineno <= b for a, b in expecting_failure):
            deadlines += [k.value for k in node.keywords if k.arg == "timeout"]
        found += [f"{label}:{node.lineno}: {ast.unparse(node)[:100]}"
                  for d in deadlines if _short(d)]  # fmt: skip
    return found


def test_process_level_waits_allow_a_loaded_machine_a_minute() -> None:
    short = [
        line
        for top in SCANNED
        for path in sorted((ROOT / top).rglob("*.py"))
        for line in short_deadlines(
            path.read_text(encoding="utf-8"), path.relative_to(ROOT).as_posix()
        )
    ]
    assert short == [], f"deadlines below {FLOOR_S} s:\n" + "\n".join(short)


def test_the_scan_finds_a_short_deadline() -> None:
    source = (
        "import pytest\n"
        "eventually(lambda: ok(), 'a leader', 20)\n"
        "eventually(lambda: ok(), 'a leader', timeout_s=60)\n"
        "future.result(timeout=30)\n"
        "with pytest.raises(KafkaException):\n    future.result(timeout=10)\n"
        "wait_until(lambda: ok(), 10, 'started')\n"
        "conn.closed_by_peer(timeout=0.3)\n"
    )
    assert short_deadlines(source, "t.py") == [
        "t.py:2: eventually(lambda: ok(), 'a leader', 20)",
        "t.py:4: future.result(timeout=30)",
        "t.py:7: wait_until(lambda: ok(), 10, 'started')",
    ]
