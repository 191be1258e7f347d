"""tools/planted_bugs.py counts a check as catching a slip only when a property fails:
a broker that did not start is the harness's failure, run again and never a catch; a
check a time limit stops is "timed out", neither a catch nor a pass."""

from __future__ import annotations

from pathlib import Path

from tests.load_tool import load_tool

_tool = load_tool("planted_bugs.py")


def _tree_with(tmp_path: Path, body: str) -> Path:
    (tmp_path / "test_check.py").write_text(body)
    return tmp_path


def test_a_failing_property_is_a_catch(tmp_path: Path) -> None:
    tree = _tree_with(
        tmp_path, "def test_property():\n    assert 1 == 2, 'the log lost a record'\n"
    )
    verdict, _ = _tool.run_check(tree, "test_check.py", 120)
    assert verdict == _tool.FAILED


def test_a_passing_check_is_a_miss(tmp_path: Path) -> None:
    tree = _tree_with(tmp_path, "def test_property():\n    assert 1 == 1\n")
    verdict, _ = _tool.run_check(tree, "test_check.py", 120)
    assert verdict == _tool.PASSED


def test_a_broker_that_did_not_start_twice_is_not_a_catch(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    tree = _tree_with(
        tmp_path,
        "from pathlib import Path\n"
        f"RUNS = Path({str(runs)!r})\n"
        "def test_machine():\n"
        "    RUNS.write_text(RUNS.read_text() + 'x' if RUNS.exists() else 'x')\n"
        "    raise RuntimeError('broker subprocess did not start')\n",
    )
    verdict, _ = _tool.run_check(tree, "test_check.py", 120)
    assert verdict == _tool.PASSED
    assert runs.read_text() == "xx"  # run again once before giving up on it


def test_a_broker_that_starts_on_the_second_run_is_judged_by_that_run(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    tree = _tree_with(
        tmp_path,
        "from pathlib import Path\n"
        f"RUNS = Path({str(runs)!r})\n"
        "def test_machine():\n"
        "    if not RUNS.exists():\n"
        "        RUNS.write_text('x')\n"
        "        raise RuntimeError('broker subprocess did not start')\n"
        "    assert False, 'the property broke'\n",
    )
    verdict, _ = _tool.run_check(tree, "test_check.py", 120)
    assert verdict == _tool.FAILED


def test_a_check_the_tools_limit_stops_is_timed_out_not_caught(tmp_path: Path) -> None:
    # The fourteenth round's producer id stand-in retried for ever and the tool's limit
    # counted that as a catch. The test waits on an event nobody sets: it ends only when
    # the tool stops it.
    tree = _tree_with(
        tmp_path,
        "import threading\ndef test_machine():\n    threading.Event().wait()\n",
    )
    verdict, _ = _tool.run_check(tree, "test_check.py", 20)
    assert verdict == _tool.TIMED_OUT


def test_a_check_pytests_guard_stops_is_timed_out_not_passed(tmp_path: Path) -> None:
    # pytest-timeout stopping a machine mid-shrink was counted as a pass.
    tree = _tree_with(
        tmp_path,
        "import threading\n"
        "import pytest\n"
        "@pytest.mark.timeout(1, method='signal')\n"
        "def test_machine():\n"
        "    threading.Event().wait()\n",
    )
    verdict, _ = _tool.run_check(tree, "test_check.py", 120)
    assert verdict == _tool.TIMED_OUT


def _bug(models: tuple[str, ...]) -> object:
    return _tool.Bug("slip", "x.py", "a", "b", "a slip", models, ())


#: A check pytest-timeout stops after a second (the tool's own limit stays generous: a
#: loaded machine takes seconds to start pytest).
_STUCK = (
    "import threading\n"
    "import pytest\n"
    "@pytest.mark.timeout(1, method='signal')\n"
    "def test_stuck():\n"
    "    threading.Event().wait()\n"
)


def test_a_bug_whose_only_model_timed_out_is_counted_apart(tmp_path: Path) -> None:
    (tmp_path / "test_green.py").write_text("def test_ok():\n    assert True\n")
    (tmp_path / "test_stuck.py").write_text(_STUCK)
    models = ("test_green.py", "test_stuck.py")
    verdict, lines = _tool.score_bug(tmp_path, _bug(models), True, 120)
    assert verdict == _tool.TIMED_OUT
    assert lines[0].startswith("test_green.py: missed")
    assert lines[1].startswith("test_stuck.py: timed out")


def test_a_catch_after_a_timed_out_model_is_a_catch(tmp_path: Path) -> None:
    (tmp_path / "test_stuck.py").write_text(_STUCK)
    (tmp_path / "test_red.py").write_text("def test_bad():\n    assert False, 'lost'\n")
    verdict, _ = _tool.score_bug(tmp_path, _bug(("test_stuck.py", "test_red.py")), True, 120)
    assert verdict == _tool.FAILED
