"""Child processes that do not outlive the process that started them (Linux).

``cluster up`` runs ZooKeeper and its brokers as children, and so do the tests. A clean
stop ends them by PID; a parent killed with SIGKILL (or an ``os._exit``) cannot. For that
case the child asks the kernel, between fork and exec, for a death signal: SIGTERM when
its parent dies (``prctl(PR_SET_PDEATHSIG)``, kept across exec). SIGTERM, not SIGKILL: a
broker then stops as cleanly as on a Ctrl-C, and ZooKeeper's JVM exits.

The kernel sends it when the *thread* that forked the child ends, not the process, so it
is only asked for from the main thread: a child started from a worker thread (one of
Trio's, say, which exits when idle) would otherwise be killed under its owner's feet.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
from collections.abc import Callable

__all__ = ["die_with_parent"]

PR_SET_PDEATHSIG = 1

_prctl: Callable[..., int] | None = None


def _load_prctl() -> Callable[..., int] | None:
    global _prctl
    if _prctl is None and sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            _prctl = ctypes.CDLL(None, use_errno=True).prctl
    return _prctl


def die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` for :class:`subprocess.Popen`: the child gets SIGTERM when this
    process dies. None (no ``preexec_fn``) off Linux or off the main thread.

    The library is resolved here, in the parent: between fork and exec the child runs
    only the prctl call (no dlopen, whose lock another thread may have held at the fork).
    """
    if threading.current_thread() is not threading.main_thread():
        return None
    prctl = _load_prctl()
    if prctl is None:
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM))
        if os.getppid() != parent:  # the parent died before the prctl: no signal will come
            os._exit(1)

    return preexec
