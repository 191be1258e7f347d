"""Reliability fixtures: the e2e broker subprocess, started with a TOML config.

:class:`ConfiguredBroker` is :class:`tests.e2e.conftest.BrokerProcess` plus a
``--config`` file written from a dict of Kafka-style keys, so that tests can
run the real CLI with short limits (``connections.max.idle.ms``,
``max.connections.per.ip``, ...). Helpers measure the broker's RSS and open
file descriptors through ``/proc``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import (
    BrokerProcess,
    RawConnection,
    pytest_runtest_makereport,  # noqa: F401  (attach broker log tails to failures)
)

__all__ = ["ConfiguredBroker", "RawConnection", "open_fds", "rss_bytes"]


def rss_bytes(pid: int) -> int:
    """Resident set size of ``pid`` in bytes (VmRSS in /proc/PID/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


def open_fds(pid: int) -> int:
    return len(list(Path(f"/proc/{pid}/fd").iterdir()))


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


class ConfiguredBroker(BrokerProcess):
    """A broker subprocess started with ``--config`` (Kafka key names)."""

    def __init__(
        self,
        data_dir: Path,
        processing_model: str = "pipelined",
        storage: str = "file",
        config: dict[str, Any] | None = None,
        config_path: Path | None = None,
    ) -> None:
        """``config_path``: where to write the TOML file (default: next to the data dir)."""
        super().__init__(data_dir, processing_model, storage)
        self.config_path = config_path or data_dir.parent / f"{data_dir.name}-broker.toml"
        self.config_path.write_text(
            "".join(f'"{k}" = {_toml_value(v)}\n' for k, v in (config or {}).items())
        )

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def rss(self) -> int:
        return rss_bytes(self.pid)

    def command_line(self) -> list[str]:
        return [*super().command_line(), "--config", str(self.config_path)]

    def finish(self) -> None:
        """Teardown: SIGTERM must give exit code 0; an unplanned death fails the test."""
        if self.running:
            code = self.stop()
            if code != 0:
                pytest.fail(f"broker exited with {code} on SIGTERM\n{self.log_tail()}")
        elif not self.down_on_purpose and self.proc is not None:
            self._join_drainer()
            pytest.fail(
                f"broker died by itself (exit code {self.proc.returncode})\n{self.log_tail()}"
            )


BrokerFactory = Callable[..., ConfiguredBroker]


@pytest.fixture
def make_broker(tmp_path: Path) -> Iterator[BrokerFactory]:
    """``make_broker(config={...}, data_dir=None, storage="file")`` -> a started broker."""
    brokers: list[ConfiguredBroker] = []

    def factory(
        config: dict[str, Any] | None = None,
        data_dir: Path | None = None,
        storage: str = "file",
        processing_model: str = "pipelined",
    ) -> ConfiguredBroker:
        directory = data_dir or tmp_path / f"data{len(brokers)}"
        broker = ConfiguredBroker(directory, processing_model, storage, config)
        brokers.append(broker)
        broker.start()
        return broker

    yield factory
    errors: list[BaseException] = []
    for broker in brokers:
        try:
            broker.finish()
        except BaseException as exc:  # stop every broker before reporting
            errors.append(exc)
    if errors:
        raise errors[0]


@contextlib.contextmanager
def many_sockets(port: int, count: int, timeout: float = 10.0) -> Iterator[list[Any]]:
    """``count`` plain TCP connections to the broker, closed on exit."""
    import socket

    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            socks.append(socket.create_connection(("127.0.0.1", port), timeout=timeout))
        yield socks
    finally:
        for sock in socks:
            sock.close()
