"""Differential fixtures: one Apache Kafka 4.4 node and one trio-broker for a whole module.

Both start from the one ``bench/server.properties`` the side-by-side bench uses (each
with its per-node keys: bench/kafka_peer.py): topic auto-creation off, so that Metadata
for an unknown topic has one right answer, and no initial rebalance delay for groups. Kafka comes from ``bench/kafka_peer.py`` (Maven-resolved into
``~/.cache/trio-broker``); without Java, or without Maven and that cache, the module is
skipped, not failed.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.differential.harness import Broker
from tests.reliability.conftest import ConfiguredBroker
from trio_broker.config_properties import read_properties_file

SHARED_CONFIG = Path(__file__).resolve().parents[2] / "bench" / "server.properties"


def start_kafka() -> object:
    from bench.kafka_peer import KafkaProcess

    return KafkaProcess(label="differential", config=SHARED_CONFIG)


def start_trio(tmp: Path) -> ConfiguredBroker:
    data_dir = tmp / "trio-data"
    data_dir.mkdir()
    # The same keys, as the TOML file ConfiguredBroker writes (listener and data dir are
    # its command line's).
    config = read_properties_file(SHARED_CONFIG)
    broker = ConfiguredBroker(data_dir, "pipelined", "file", config=config)
    broker.start()
    return broker


@pytest.fixture(scope="module")
def brokers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Broker, Broker]]:
    from bench.kafka_peer import cache_dir

    resolved = (cache_dir() / "resolved").exists()  # then Maven is not needed
    if shutil.which("java") is None or (shutil.which("mvn") is None and not resolved):
        pytest.skip(
            "Java and Maven are needed to run Apache Kafka (scripts/install-system-deps.sh)"
        )
    trio = start_trio(tmp_path_factory.mktemp("differential"))
    try:
        kafka = start_kafka()
    except BaseException:
        trio.stop()
        raise
    kafka_side = Broker("kafka", kafka.port)  # type: ignore[attr-defined]
    trio_side = Broker("trio-broker", trio.port)
    try:
        yield kafka_side, trio_side
    finally:
        kafka_side.close()
        trio_side.close()
        kafka.stop()  # type: ignore[attr-defined]
        code = trio.stop()
        assert code == 0, f"trio-broker exited with {code}\n{trio.log_tail()}"
