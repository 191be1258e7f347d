"""Quotas end to end through the real processes: ``trio-broker serve --config`` with a
``[quotas]`` table, and ``trio-broker quotas set|list`` changing them live (kept across a
restart in client-quotas.json)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.reliability.conftest import ConfiguredBroker

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

CONFIG = """\
[quotas."client-id=bench"]
producer_byte_rate = 1048576

[quotas.default]
consumer_byte_rate = 2097152
"""


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[ConfiguredBroker]:
    broker = ConfiguredBroker(tmp_path / "data")
    broker.config_path.write_text(CONFIG)
    broker.start()
    try:
        yield broker
    finally:
        broker.finish()


def cli(broker: ConfiguredBroker, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trio_broker.cli", "quotas", *args,
         "--bootstrap", f"127.0.0.1:{broker.port}"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def rows(output: str) -> set[tuple[str, ...]]:
    return {tuple(line.split()) for line in output.splitlines()[1:] if line.strip()}


def test_quotas_cli_against_a_configured_broker(broker: ConfiguredBroker) -> None:
    done = cli(broker, "list")
    assert done.returncode == 0, done.stderr
    assert rows(done.stdout) == {
        ("client-id=bench", "producer_byte_rate", "1.04858e+06"),
        ("client-id=<default>", "consumer_byte_rate", "2.09715e+06"),
    }
    done = cli(broker, "set", "--entity", "user=alice,client-id=live", "producer_byte_rate=5000")
    assert done.returncode == 0, done.stderr
    done = cli(broker, "set", "--entity", "default", "--remove", "consumer_byte_rate")
    assert done.returncode == 0, done.stderr
    # Refused with the reason, exit code 1.
    done = cli(broker, "set", "--entity", "client-id=x", "producer_rate=50")
    assert done.returncode == 1 and "producer_rate" in done.stderr
    done = cli(broker, "set", "--entity", "client-id=x", "request_percentage=200")
    assert done.returncode == 0, done.stderr
    expected = {
        ("client-id=bench", "producer_byte_rate", "1.04858e+06"),
        ("user=alice,client-id=live", "producer_byte_rate", "5000"),
        ("client-id=x", "request_percentage", "200"),
    }
    assert rows(cli(broker, "list").stdout) == expected
    broker.restart()  # runtime changes are kept in the data dir
    assert rows(cli(broker, "list").stdout) == expected
    done = cli(broker, "list", "--entity", "user=alice,client-id=live")
    assert rows(done.stdout) == {("user=alice,client-id=live", "producer_byte_rate", "5000")}
