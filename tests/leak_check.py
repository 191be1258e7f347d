"""No process a test starts outlives the test session (a pytest plugin; root conftest.py
loads it for every suite).

A broker or ZooKeeper left running holds ports, disk and CPU on a shared machine and
slows every later run; fixtures must stop their children on every path (a failure, a
pytest-timeout, Ctrl-C). This finds the ones that did not, at the end of the session of
each pytest process (each xdist worker), by two marks that survive whatever the test did:

* the environment: each pytest process sets :data:`RUN_ENV` to a value of its own, and
  every child inherits it, grandchildren too (``cluster up``'s brokers, ZooKeeper's JVM),
  whatever session or process group they moved to;
* the process tree: pytest makes itself a child subreaper (``PR_SET_CHILD_SUBREAPER``),
  so a descendant whose parent dies (the brokers of a ``cluster up`` killed with
  SIGKILL) becomes pytest's child instead of init's, and is still found below it.

pyspark's gateway JVM is exempt: it lives exactly as long as the Python process that
started it, by pyspark's design. Survivors get a grace period (a child told to stop by a death signal may be on its way
out), then each is killed by its PID and the session fails at the last teardown,
naming each survivor's command line and the test that started it (the
``PYTEST_CURRENT_TEST`` it inherited). Linux only (/proc); elsewhere it does nothing.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import secrets
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest

__all__ = ["RUN_ENV", "Survivor", "descendants", "kill_tree", "survivors"]

#: Set by each pytest process to a value of its own; its children inherit it.
RUN_ENV = "TRIO_BROKER_TEST_RUN"
#: How long survivors may take to exit (SIGTERM from a death signal) before they count;
#: the environment variable overrides it.
GRACE_S = 20.0
GRACE_ENV = "TRIO_BROKER_LEAK_GRACE_S"
PR_SET_CHILD_SUBREAPER = 36

_PROC = Path("/proc")


@attrs.frozen
class Survivor:
    pid: int
    cmdline: str
    #: PYTEST_CURRENT_TEST when it (or its first ancestor below pytest) was started.
    started_by: str

    def __str__(self) -> str:
        return f"pid {self.pid}, started in {self.started_by}: {self.cmdline[:300]}"


def _stat(pid: int) -> tuple[int, str] | None:
    """(parent pid, state letter), or None when it is gone."""
    try:
        text = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # the name in parentheses may hold spaces
    return int(fields[1]), fields[0]


def _pids() -> list[int]:
    return [int(p.name) for p in _PROC.iterdir() if p.name.isdigit()]


def _environ(pid: int) -> dict[bytes, bytes]:
    try:
        raw = (_PROC / str(pid) / "environ").read_bytes()
    except OSError:
        return {}
    return dict(kv.split(b"=", 1) for kv in raw.split(b"\0") if b"=" in kv)


def _cmdline(pid: int) -> str:
    try:
        return (_PROC / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return "?"


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (children first), zombies left out."""
    children: dict[int, list[int]] = {}
    for p in _pids():
        stat = _stat(p)
        if stat is not None and stat[1] != "Z":
            children.setdefault(stat[0], []).append(p)
    found, queue = [], list(children.get(pid, []))
    while queue:
        p = queue.pop(0)
        found.append(p)
        queue.extend(children.get(p, []))
    return found


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and every process below it, each by its PID. The tree is listed
    first: once ``pid`` is gone its children are no longer found below it."""
    for p in [pid, *descendants(pid)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)


def _meant_to_live_with_us() -> set[int]:
    """Processes that live exactly as long as this one by design: pyspark's gateway JVM
    (``trio-broker verify`` in-process), which ``SparkSession.stop()`` leaves running for
    the next session and which exits when this process does (its stdin pipe closes); and
    the brokers' fork server."""
    exempt: set[int] = set()
    for module in ("pyspark.core.context", "pyspark.context"):
        context = sys.modules.get(module)
        gateway = getattr(getattr(context, "SparkContext", None), "_gateway", None)
        proc = getattr(gateway, "proc", None)
        if proc is not None and proc.poll() is None:
            exempt.update([proc.pid, *descendants(proc.pid)])
    # The brokers' fork server (tests/broker_fork.py) ends with this process; the brokers
    # it forked are its children, and they are not exempt.
    fork = sys.modules.get("tests.broker_fork")
    fork_server = getattr(fork, "fork_server_pid", lambda: None)()
    if fork_server is not None:
        exempt.add(fork_server)
    return exempt


def survivors(run: str) -> list[Survivor]:
    """The live processes of this pytest process's run, other than itself: those that
    inherited ``RUN_ENV=run`` and those below it in the process tree."""
    me = os.getpid()
    pids = set(descendants(me))
    mark = run.encode()
    for p in _pids():
        stat = _stat(p)
        if (
            p != me
            and stat is not None
            and stat[1] != "Z"
            and _environ(p).get(RUN_ENV.encode()) == mark
        ):
            pids.add(p)
    found = []
    for p in sorted(pids - _meant_to_live_with_us()):
        env = _environ(p)
        started_by = env.get(b"PYTEST_CURRENT_TEST", b"?").decode(errors="replace")
        found.append(Survivor(p, _cmdline(p), started_by))
    return [s for s in found if _stat(s.pid) is not None]


def _reap_zombies() -> None:
    """Reap the exited orphans this process inherited as a subreaper (only zombies, by
    PID: a live child's exit status is its Popen's)."""
    me = os.getpid()
    for p in _pids():
        stat = _stat(p)
        if stat is not None and stat == (me, "Z"):
            with contextlib.suppress(ChildProcessError):
                os.waitpid(p, os.WNOHANG)


def _become_subreaper() -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1)


def pytest_configure(config: pytest.Config) -> None:
    if not sys.platform.startswith("linux"):
        return
    # Our own value, not an inherited one: an xdist worker, or pytest run by a test,
    # checks its own children only.
    os.environ[RUN_ENV] = f"{os.getpid()}-{secrets.token_hex(4)}"
    _become_subreaper()


@pytest.fixture(scope="session", autouse=True)
def no_process_outlives_the_session() -> Iterator[None]:
    """Set up first and torn down last (autouse, session scope, in the root conftest):
    every other fixture has stopped what it started by then."""
    yield
    run = os.environ.get(RUN_ENV)
    if run is None:
        return
    _reap_zombies()
    deadline = time.monotonic() + float(os.environ.get(GRACE_ENV, GRACE_S))
    while (left := survivors(run)) and time.monotonic() < deadline:
        time.sleep(0.2)  # polling processes we cannot wait for (not our children)
        _reap_zombies()
    if not left:
        return
    for survivor in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(survivor.pid, signal.SIGKILL)
    _reap_zombies()
    pytest.fail(
        f"{len(left)} process(es) started by this test run outlived it (now killed):\n"
        + "\n".join(f"  {s}" for s in left),
        pytrace=False,
    )
