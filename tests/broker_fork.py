"""Broker processes forked from a parent that has already imported the broker.

Every ``trio-broker serve`` the suite starts is a new Python process that imports trio,
attrs and a few hundred of the broker's modules before it listens: most of its start's
CPU, paid some 500 times a run (docs/testing-time.md). Here each pytest process keeps
one *fork server*: a child that imports those modules once, then, asked for a broker,
``os.fork()``s and runs in the new process exactly what the console script runs,
``trio_broker.cli.main(argv[1:])``, in its own session, with the test's stdin, stdout
and stderr, working directory and environment.

A forked broker is a real process: its own PID, signals, ``kill -9``, exit status, files
and sockets; :class:`ForkedProcess` answers like the :class:`subprocess.Popen` it stands
for (``pid``, ``poll``, ``wait``, ``send_signal``, ``terminate``, ``kill``,
``returncode``, ``stderr``). Signals go through a pidfd, so a PID the kernel reused is
never signalled. It differs from an exec'd ``trio-broker`` in what happened before the
fork: its modules were imported under the fork server's environment (the broker reads
none at import), its ``str`` hash seed is the fork server's (the brokers of one pytest
process iterate sets of strings in the same order), and ``/proc/PID/cmdline`` and
``environ`` show the fork server's. The fork server reaps its children and reports each
exit status; it dies with its pytest process, and its brokers with it (their death
signal, as :func:`~trio_broker.cluster.child_process.die_with_parent` gives an exec'd
one).

Only ``serve`` command lines are forked. ``TRIO_BROKER_TEST_FORK=0`` starts every broker
with exec instead (the console script's own start-up path is also run by the tests of
``cluster up`` and of the pytest plugin, whose brokers are always exec'd).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

__all__ = ["FORK_ENV", "ForkedProcess", "fork_server_pid", "forked_cpu", "start_broker"]

FORK_ENV = "TRIO_BROKER_TEST_FORK"
#: The largest message either side sends (a request carries the environment).
MAX_MESSAGE = 1 << 20
PR_SET_PDEATHSIG = 1


# --------------------------------------------------------------------------- the test side


def start_broker(argv: list[str]) -> subprocess.Popen[bytes] | ForkedProcess:
    """``argv`` (the ``trio-broker`` executable, then its arguments) running with stdin
    and stdout on /dev/null and stderr a pipe, in a session of its own, dying with this
    process: forked from the fork server for ``serve``, exec'd otherwise."""
    if len(argv) < 2 or argv[1] != "serve" or os.environ.get(FORK_ENV, "1") == "0":
        from trio_broker.cluster.child_process import die_with_parent

        return subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE, start_new_session=True, preexec_fn=die_with_parent(),
        )  # fmt: skip
    return _server().spawn(argv)


def fork_server_pid() -> int | None:
    """The fork server's PID while it runs (tests/leak_check.py lets it outlive the
    session's tests: it ends with this process)."""
    server = _the_server
    return None if server is None or server.process.poll() is not None else server.process.pid


def forked_cpu() -> float:
    """CPU seconds (user + sys) of the brokers forked for this process that have exited:
    what ``RUSAGE_CHILDREN`` would have counted of exec'd ones (tools/test_cpu.py adds it)."""
    return _forked_cpu


_forked_cpu = 0.0
_the_server: _ForkServer | None = None
_the_server_lock = threading.Lock()


def _server() -> _ForkServer:
    global _the_server
    with _the_server_lock:
        if _the_server is None or _the_server.dead:
            _the_server = _ForkServer()
            atexit.register(_the_server.close)
        return _the_server


class ForkedProcess:
    """A broker forked by the fork server, answering like :class:`subprocess.Popen`."""

    def __init__(
        self, server: _ForkServer, pid: int, pidfd: int, stderr_fd: int, args: list[str]
    ) -> None:
        self.args, self.pid = args, pid
        self.returncode: int | None = None
        self.stderr = open(stderr_fd, "rb")  # noqa: SIM115 - the reader closes it, as Popen's
        self._server, self._pidfd = server, pidfd
        self._pidfd_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<ForkedProcess pid {self.pid} returncode {self.returncode}>"

    def poll(self) -> int | None:
        if self.returncode is None:
            self._set(self._server.exit_status(self.pid, timeout=0))
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            code = self._server.exit_status(self.pid, timeout=timeout)
            if code is None:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            self._set(code)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        """As Popen's: nothing once the exit status is known."""
        with self._pidfd_lock:
            if self.poll() is None and self._pidfd >= 0:
                with contextlib.suppress(ProcessLookupError):  # exited, not yet reported
                    signal.pidfd_send_signal(self._pidfd, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def _set(self, code: int | None) -> None:
        if code is None or self.returncode is not None:
            return
        self.returncode = code
        with self._pidfd_lock:
            if self._pidfd >= 0:
                os.close(self._pidfd)
                self._pidfd = -1

    def __del__(self) -> None:
        if getattr(self, "_pidfd", -1) >= 0:
            with contextlib.suppress(OSError):
                os.close(self._pidfd)


class _ForkServer:
    """The test side of one fork server: a socket to it (requests out; spawn answers and
    exit statuses in, read by a thread) and its process."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.log = Path(tempfile.mkstemp(prefix="broker-fork-server-", suffix=".log")[1])
        from trio_broker.cluster.child_process import die_with_parent

        with theirs, self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "tests.broker_fork", str(theirs.fileno()), str(self.log)],
                cwd=Path(__file__).resolve().parent.parent, pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=log, start_new_session=True,
                preexec_fn=die_with_parent(),
            )  # fmt: skip
        self._socket = ours
        self._spawn_lock = threading.Lock()  # one request and its answer at a time
        self._changed = threading.Condition()
        self._answer: tuple[dict[str, Any], list[int]] | None = None
        self._exits: dict[int, int] = {}
        self.dead = False
        threading.Thread(target=self._read, name="broker-fork-server", daemon=True).start()

    def spawn(self, argv: list[str]) -> ForkedProcess:
        read_end, write_end = os.pipe2(os.O_CLOEXEC)
        request = {"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ)}
        with self._spawn_lock, open(os.devnull, "rb") as devnull_in:
            with open(os.devnull, "wb") as devnull_out:
                try:
                    socket.send_fds(
                        self._socket, [json.dumps(request).encode()],
                        [devnull_in.fileno(), devnull_out.fileno(), write_end],
                    )  # fmt: skip
                finally:
                    os.close(write_end)  # the broker holds the only write end now
            with self._changed:
                self._changed.wait_for(lambda: self._answer is not None or self.dead, 60.0)
                answer, self._answer = self._answer, None
        if answer is None:
            os.close(read_end)
            raise RuntimeError(f"the broker fork server did not answer\n{self._log_tail()}")
        message, fds = answer
        if "error" in message:
            os.close(read_end)
            raise OSError(message["error"])
        (pidfd,) = fds
        return ForkedProcess(self, message["spawned"], pidfd, read_end, argv)

    def close(self) -> None:
        """End the fork server and reap it (its CPU then counts as this process's
        children's, as an exec'd broker's does)."""
        with contextlib.suppress(OSError):
            self._socket.shutdown(socket.SHUT_RDWR)
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
        if self.process.returncode == 0:  # kept when it ended otherwise, to be read
            self.log.unlink(missing_ok=True)

    def exit_status(self, pid: int, timeout: float | None) -> int | None:
        """The exit status (Popen's: -N for signal N) once reported; None if not within
        ``timeout`` seconds."""
        with self._changed:
            self._changed.wait_for(lambda: pid in self._exits or self.dead, timeout)
            if pid in self._exits:
                return self._exits[pid]
            if self.dead:
                raise RuntimeError(
                    f"the broker fork server died; pid {pid}'s exit status is unknown\n"
                    f"{self._log_tail()}"
                )
            return None

    def _read(self) -> None:
        global _forked_cpu
        while True:
            try:
                data, fds, _flags, _address = socket.recv_fds(self._socket, MAX_MESSAGE, 1)
            except OSError:
                data, fds = b"", []
            if not data:
                with self._changed:
                    self.dead = True
                    self._changed.notify_all()
                return
            message = json.loads(data)
            with self._changed:
                if "exited" in message:
                    self._exits[message["exited"]] = message["code"]
                    _forked_cpu += message["cpu"]
                else:
                    self._answer = (message, fds)
                self._changed.notify_all()

    def _log_tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-4000:]
        except OSError:
            return ""


# --------------------------------------------------------------------------- the fork server


def _preload() -> None:
    """What ``trio-broker serve`` imports before it listens (cli.py's ``_serve``)."""
    import trio  # noqa: F401

    import trio_broker.cli
    import trio_broker.cluster.coordination
    import trio_broker.cluster.membership
    import trio_broker.config
    import trio_broker.server.broker  # noqa: F401


def _serve_forks(channel: socket.socket) -> tuple[dict[str, Any], list[int]] | None:
    """Fork a broker for each request until the test side closes the socket (None).
    Returns in a forked child, with its request and its stdio descriptors."""
    wake_read, wake_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    signal.set_wakeup_fd(wake_write)
    selector = selectors.DefaultSelector()
    selector.register(channel, selectors.EVENT_READ)
    selector.register(wake_read, selectors.EVENT_READ)

    def send(message: dict[str, Any], fds: list[int] | None = None) -> None:
        socket.send_fds(channel, [json.dumps(message).encode()], fds or [])

    while True:
        for key, _events in selector.select():
            if key.fileobj == wake_read:
                with contextlib.suppress(BlockingIOError):
                    while os.read(wake_read, 4096):
                        pass
                while True:  # reap every child that exited, and say so
                    try:
                        pid, status, usage = os.wait4(-1, os.WNOHANG)
                    except ChildProcessError:
                        break
                    if pid == 0:
                        break
                    code, cpu = os.waitstatus_to_exitcode(status), usage.ru_utime + usage.ru_stime
                    send({"exited": pid, "code": code, "cpu": cpu})
                continue
            data, fds, _flags, _address = socket.recv_fds(channel, MAX_MESSAGE, 3)
            if not data:
                return None
            request = json.loads(data)
            try:
                pid = os.fork()
            except OSError as exc:
                for fd in fds:
                    os.close(fd)
                send({"error": f"fork: {exc}"})
                continue
            if pid == 0:  # the broker: leave the server's loop and its descriptors behind
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                selector.close()
                os.close(wake_read)
                os.close(wake_write)
                channel.close()
                return request, fds
            pidfd = os.pidfd_open(pid)  # before any reap: the PID is still this child's
            try:
                send({"spawned": pid}, [pidfd])
            finally:
                os.close(pidfd)
                for fd in fds:
                    os.close(fd)


def _become_broker(request: dict[str, Any], fds: list[int], server_pid: int) -> int:
    """In the forked child: become what ``subprocess.Popen`` of the console script would
    have started, then run it."""
    os.setsid()
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM))
    if os.getppid() != server_pid:  # the server died before the prctl: no signal will come
        os._exit(1)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    os.closerange(3, 1 << 16)  # as Popen's close_fds
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.argv = list(request["argv"])
    sys.path[0] = os.path.dirname(sys.argv[0])  # the console script's, not the repo's
    from trio_broker.cli import main

    return main(sys.argv[1:])


def _fork_server_main() -> None:
    channel = socket.socket(fileno=int(sys.argv[1]))
    _preload()
    server_pid = os.getpid()
    forked = _serve_forks(channel)
    if forked is None:  # the test side closed (an xdist worker ends without atexit hooks)
        log = Path(sys.argv[2])
        if log.is_file() and log.stat().st_size == 0:
            log.unlink(missing_ok=True)
        return
    request, fds = forked
    sys.exit(_become_broker(request, fds, server_pid))


if __name__ == "__main__":
    _fork_server_main()
