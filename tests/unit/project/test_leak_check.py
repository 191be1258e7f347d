"""tests/leak_check.py: a pytest run whose tests leave processes behind fails at its end,
naming each one and the test that started it, and kills them; a clean run passes.

The runs are pytest subprocesses (pytester) with the plugin loaded by ``-p``, on small
test files that start ``sleep`` processes the way the leaks it is for happened: a child
nobody stops, and an orphan whose parent exited without stopping it (what a ``cluster
up`` killed with SIGKILL left: its brokers)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from tests.leak_check import GRACE_ENV, descendants, kill_tree

pytest_plugins = ["pytester"]

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc")

LEAKY = """
import subprocess

def test_clean():
    subprocess.run(["true"], check=True)

def test_leaves_a_child(tmp_path):
    # Its own session, as the brokers of the fixtures: a terminal's Ctrl-C misses it.
    child = subprocess.Popen(["sleep", "600"], start_new_session=True)
    (tmp_path.parent.parent / "child.pid").write_text(str(child.pid))

def test_leaves_an_orphan(tmp_path):
    # The shell starts sleep in the background and exits: sleep's parent is gone.
    out = subprocess.run(["sh", "-c", "sleep 600 >/dev/null 2>&1 & echo $!"],
                         capture_output=True, text=True, check=True).stdout
    (tmp_path.parent.parent / "orphan.pid").write_text(out.strip())
"""


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state == "Z"


REPO = Path(__file__).resolve().parents[3]


def _run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    pytester.makeini("[pytest]\n")  # not the project's: no timeout, no other plugins' options
    # The plugin is tests.leak_check, imported from this repository.
    path = os.environ.get("PYTHONPATH")
    pytester._monkeypatch.setenv("PYTHONPATH", f"{REPO}{os.pathsep}{path}" if path else str(REPO))
    pytester._monkeypatch.setenv(GRACE_ENV, "2")
    return pytester.runpytest_subprocess(
        "-p", "tests.leak_check", "-p", "no:xdist", "-p", "no:cacheprovider", *args,
        timeout=180,
    )  # fmt: skip


def test_a_run_that_leaves_processes_fails_and_kills_them(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_leaky=LEAKY)
    result = _run(pytester)
    pids = {}
    try:
        for name in ("child", "orphan"):
            pids[name] = int((pytester.path / f"{name}.pid").read_text())
        result.assert_outcomes(passed=3, errors=1)
        out = result.stdout.str()
        assert "2 process(es) started by this test run outlived it (now killed)" in out, out
        for name, test in (("child", "test_leaves_a_child"), ("orphan", "test_leaves_an_orphan")):
            line = f"pid {pids[name]}, started in test_leaky.py::{test} (call): sleep 600"
            assert line in out, (name, out)
        for pid in pids.values():
            assert _gone(pid), f"survivor {pid} was not killed"
    finally:
        for pid in pids.values():
            if not _gone(pid):
                kill_tree(pid)  # ours: never leave it running


def test_a_clean_run_passes(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_clean="""
        import subprocess

        def test_stops_its_child():
            child = subprocess.Popen(["sleep", "600"])
            child.kill()
            child.wait()

        def test_its_orphan_exits_by_itself():
            subprocess.run(["sh", "-c", "sleep 0.2 &"], check=True)
        """
    )
    result = _run(pytester)
    result.assert_outcomes(passed=2)
    assert "outlived" not in result.stdout.str()


def test_kill_tree_reaches_a_child_in_another_session(tmp_path: Path) -> None:
    """The helper the tests kill a ``cluster up`` with: its brokers run in sessions of
    their own, so killing its process group misses them; killing its tree does not."""
    import subprocess

    parent = subprocess.Popen(
        [sys.executable, "-c",
         "import subprocess, sys; c = subprocess.Popen(['sleep', '600'], "
         "start_new_session=True); print(c.pid, flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    try:
        assert descendants(parent.pid) == [child]
        kill_tree(parent.pid)
        parent.wait(30)
        deadline = time.monotonic() + 30
        while not _gone(child):
            assert time.monotonic() < deadline, f"child {child} outlived kill_tree"
            time.sleep(0.05)  # polling: the child is not ours to wait for
    finally:
        for pid in (parent.pid, child):  # ours: never leave them running
            if not _gone(pid):
                kill_tree(pid)
        parent.wait(30)
