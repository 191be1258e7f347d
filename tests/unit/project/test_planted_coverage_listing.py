"""tools/planted_bugs.py ``--coverage``: a bug is listed for the models whose traced run
executed its planted line, the hand listing's others after them."""

from __future__ import annotations

import attrs

from tests.load_tool import load_tool

_tool = load_tool("planted_bugs.py")

SOURCE = (
    "def acked(log, last):\n"  # 1
    "    result = check(\n"  # 2
    "        log,\n"  # 3
    "        last,\n"  # 4
    "    )\n"  # 5
    "    if result:\n"  # 6
    "        return log.durable > last\n"  # 7
    "    else:\n"  # 8
    "        return False\n"  # 9
)

COVERAGE = {
    "statemachine/test_a.py": {"seconds": 9.0, "lines": {"trio_broker/x.py": [1, 2, 6, 7]}},
    "statemachine/test_b.py": {"seconds": 2.0, "lines": {"trio_broker/x.py": [1, 2, 6, 9]}},
    "sim --seeds 0:60": {"seconds": 30.0, "lines": {"trio_broker/y.py": [7]}},
}


def _bug(old: str, models: tuple[str, ...] = ()) -> object:
    return _tool.Bug("b", "trio_broker/x.py", old, "x", "what", models, ())


def test_the_planted_lines_are_the_old_texts_and_their_statements_first_line() -> None:
    assert _tool.planted_lines(SOURCE, "        return log.durable > last\n") == {7}
    assert _tool.planted_lines(SOURCE, "durable > last") == {7}
    # A continuation line of a call has no line event of its own: the call's line counts.
    assert _tool.planted_lines(SOURCE, "        last,\n") == {4, 2}
    # ``else:`` has none either: the ``if`` holding it counts.
    assert _tool.planted_lines(SOURCE, "    else:\n        return False\n") == {8, 9, 6}


def test_models_that_ran_the_line_are_listed_cheapest_first() -> None:
    assert _tool.models_running(COVERAGE, "trio_broker/x.py", {2}) == [
        "statemachine/test_b.py",
        "statemachine/test_a.py",
    ]
    assert _tool.models_running(COVERAGE, "trio_broker/x.py", {7}) == ["statemachine/test_a.py"]
    # The same line number in another file is not the bug's.
    assert _tool.models_running(COVERAGE, "trio_broker/y.py", {9}) == []


def test_the_hand_listing_is_kept_after_the_coverage_one() -> None:
    bug = _bug(
        "        return log.durable > last\n", ("sim --seeds 0:60", "statemachine/test_a.py")
    )
    models, traced = _tool.coverage_listing(COVERAGE, bug, SOURCE)
    assert traced == ["statemachine/test_a.py"]
    assert models == ("statemachine/test_a.py", "sim --seeds 0:60")
    unrun = attrs.evolve(bug, old="        return False\n")
    models, traced = _tool.coverage_listing(COVERAGE, unrun, SOURCE)
    assert traced == ["statemachine/test_b.py"]
    assert models == ("statemachine/test_b.py", "sim --seeds 0:60", "statemachine/test_a.py")
