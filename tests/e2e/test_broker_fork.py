"""The tests' forked brokers (tests/broker_fork.py) behave as exec'd ``trio-broker serve``
processes do: the same output and exit status for the same command line, signals and
``kill -9`` by PID, the working directory of the test that started them."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from tests.broker_fork import FORK_ENV, ForkedProcess, start_broker
from tests.e2e.conftest import BROKER_EXE, STOP_TIMEOUT_S, BrokerProcess


def _listening(proc: subprocess.Popen[bytes] | ForkedProcess) -> str:
    assert proc.stderr is not None
    for raw in iter(proc.stderr.readline, b""):
        line = raw.decode(errors="replace")
        if "listening on" in line:
            return line
    raise AssertionError(f"no 'listening on' before exit {proc.wait(STOP_TIMEOUT_S)}")


def _run(argv: list[str], *, fork: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[int, bytes]:
    monkeypatch.setenv(FORK_ENV, "1" if fork else "0")
    proc = start_broker(argv)
    assert isinstance(proc, ForkedProcess) is fork
    assert proc.stderr is not None
    err = proc.stderr.read()
    return proc.wait(STOP_TIMEOUT_S), err


def test_a_refused_command_line_exits_as_the_console_script_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for argv in (
        [str(BROKER_EXE), "serve", "--listen", "no-port-here"],
        [str(BROKER_EXE), "serve", "--no-such-flag"],
    ):
        forked = _run(argv, fork=True, monkeypatch=monkeypatch)
        execd = _run(argv, fork=False, monkeypatch=monkeypatch)
        assert forked == execd
        assert forked[0] == 2, forked


def test_sigterm_kill_9_and_signals_after_the_exit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(FORK_ENV, "1")  # whatever the run's setting
    proc = start_broker(
        [str(BROKER_EXE), "serve", "--listen", "127.0.0.1:0", "--data-dir", str(tmp_path / "a")]
    )
    assert isinstance(proc, ForkedProcess)
    _listening(proc)
    assert proc.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(0.05)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(STOP_TIMEOUT_S) == 0
    proc.kill()  # exited and reported: nothing is signalled, as with Popen

    again = start_broker(
        [str(BROKER_EXE), "serve", "--listen", "127.0.0.1:0", "--data-dir", str(tmp_path / "a")]
    )
    _listening(again)
    os.kill(again.pid, signal.SIGKILL)  # by PID, as a test's kill -9 does
    assert again.wait(STOP_TIMEOUT_S) == -signal.SIGKILL
    assert again.poll() == -signal.SIGKILL


def test_a_relative_data_dir_is_in_the_tests_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(FORK_ENV, "1")
    monkeypatch.chdir(tmp_path)
    broker = BrokerProcess(Path("relative-data"), "pipelined", "file")
    broker.start()
    try:
        assert isinstance(broker.proc, ForkedProcess)
        assert (tmp_path / "relative-data").is_dir()
    finally:
        assert broker.stop() == 0
