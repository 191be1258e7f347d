"""tools/planted_bugs.py counts a check as catching a slip only when a property fails:
a broker that did not start is the harness's failure, run again and never a catch."""

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
    failed, _ = _tool.run_check(tree, "test_check.py", 120)
    assert failed


def test_a_passing_check_is_a_miss(tmp_path: Path) -> None:
    tree = _tree_with(tmp_path, "def test_property():\n    assert 1 == 1\n")
    failed, _ = _tool.run_check(tree, "test_check.py", 120)
    assert not failed


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
    failed, _ = _tool.run_check(tree, "test_check.py", 120)
    assert not failed
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
    failed, _ = _tool.run_check(tree, "test_check.py", 120)
    assert failed
