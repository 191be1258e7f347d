"""`bench/run_all.py --peer kafka --config FILE`: the prepared copies start both brokers.

The bench gives each broker ``bench/server.properties`` with its per-node keys appended
(bench/kafka_peer.py). trio-broker's copy starts ``trio-broker serve --config`` with no
other flag and answers on the listener and in the data dir the copy names. Kafka's copy
(both variants) is checked by Kafka 4.4's own ``KafkaConfig`` -- what ``kafka.Kafka``
builds from the file before anything else, with the KRaft checks of a combined node --
from the jars the bench resolves, and then a Kafka node is started from it (a few
seconds). No timing is measured.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from bench import kafka_peer
from tests.e2e.conftest import BROKER_EXE, BrokerProcess
from tests.kafka_tools.classpath import FAST_START_JVM
from trio_broker.config import load_config
from trio_broker.config_properties import read_properties_file
from trio_broker.protocol import messages as m

SHARED = Path(__file__).resolve().parents[2] / "bench" / "server.properties"
#: Keys both brokers apply, compared value for value after each has parsed the file.
APPLIED_BY_BOTH = {
    "message.max.bytes": "message_max_bytes",
    "log.segment.bytes": "segment_bytes",
    "num.partitions": "num_partitions",
    "auto.create.topics.enable": "auto_create_topics",
    "group.initial.rebalance.delay.ms": "group_initial_rebalance_delay_ms",
    "socket.request.max.bytes": "socket_request_max_bytes",
}


class SharedConfigBroker(BrokerProcess):
    """``trio-broker serve --config FILE`` and nothing else: the file alone must do."""

    def __init__(self, config: Path, data_dir: Path) -> None:
        super().__init__(data_dir, "pipelined", "file")
        self.config = config

    def command_line(self) -> list[str]:
        return [str(BROKER_EXE), "serve", "--config", str(self.config)]


def test_trio_broker_starts_from_its_copy(tmp_path: Path) -> None:
    data_dir = tmp_path / "trio-data"
    data_dir.mkdir()
    copy = kafka_peer.write_properties(
        tmp_path / "trio.properties", SHARED, kafka_peer.trio_node_keys(data_dir)
    )
    # The shared file is there word for word, the per-node block after it.
    assert copy.read_text().startswith(SHARED.read_text())
    broker = SharedConfigBroker(copy, data_dir)
    broker.start()
    try:
        assert broker.port != 0  # the free port of listeners=...:0
        with broker.connect() as conn:
            answer = conn.request(m.ApiKey.METADATA, 12, m.MetadataRequest(topics=[]))
        assert [(b.host, b.port) for b in answer.brokers] == [("127.0.0.1", broker.port)]
        assert (data_dir / "meta.properties").exists()  # log.dirs of the copy
    finally:
        assert broker.stop() == 0, broker.log_tail()
    log = broker.log_path.read_text()
    # Every key of the shared file is one trio-broker applies (the share coordinator's
    # state topic keys too, since share state is replicated in a cluster): none is named
    # in the warning a key taken for Kafka's sake only gets.
    shared_keys = [
        line.split("=", 1)[0].strip()
        for line in SHARED.read_text().splitlines()
        if "=" in line and not line.lstrip().startswith("#")
    ]
    assert "share.coordinator.state.topic.replication.factor" in shared_keys
    assert not [key for key in shared_keys if f"{key} is accepted for Kafka" in log], log


_CHECK_CONFIG = r"""
import java.util.Properties;
public class CheckConfig {
    public static void main(String[] args) throws Exception {
        Properties props = org.apache.kafka.common.utils.Utils.loadProps(args[0]);
        kafka.server.KafkaConfig config = kafka.server.KafkaConfig.fromProps(props);
        for (int i = 1; i < args.length; i++)
            System.out.println(args[i] + "=" + config.values().get(args[i]));
    }
}
"""


def _kafka_libs() -> Path:
    resolved = (kafka_peer.cache_dir() / "resolved").exists()
    if shutil.which("java") is None or (shutil.which("mvn") is None and not resolved):
        pytest.skip("Java and Maven are needed for Kafka's jars (scripts/install-system-deps.sh)")
    return kafka_peer.resolve()


@pytest.mark.parametrize("variant", ["kafka", "kafka_fsync"])
def test_kafka_accepts_its_copy(tmp_path: Path, variant: str) -> None:
    libs = _kafka_libs()
    keys = kafka_peer.kafka_node_keys(19092, 19093, tmp_path)
    if variant == "kafka_fsync":
        keys = {**keys, **kafka_peer.FSYNC_EVERY_MESSAGE}
    copy = kafka_peer.write_properties(tmp_path / "kafka.properties", SHARED, keys)
    source = tmp_path / "CheckConfig.java"
    source.write_text(_CHECK_CONFIG)
    asked = [*APPLIED_BY_BOTH, "process.roles", "node.id", "log.dirs",
             "log.flush.interval.messages", "offsets.topic.num.partitions"]  # fmt: skip
    run = subprocess.run(
        ["java", *FAST_START_JVM, "-cp", f"{libs}/*", str(source), str(copy), *asked],
        capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    kafka = dict(line.split("=", 1) for line in run.stdout.splitlines() if "=" in line)
    assert kafka["process.roles"] == "[broker, controller]"
    assert (kafka["node.id"], kafka["log.dirs"]) == ("1", f"[{tmp_path / 'logs'}]")
    assert kafka["offsets.topic.num.partitions"] == "1"  # from the shared file
    fsync = "1" if variant == "kafka_fsync" else str(2**63 - 1)
    assert kafka["log.flush.interval.messages"] == fsync
    # The keys both brokers apply mean the same on both: trio-broker's reading of the
    # same file (its own per-node keys aside) against Kafka's.
    trio_copy = kafka_peer.write_properties(
        tmp_path / "trio.properties", SHARED, kafka_peer.trio_node_keys(tmp_path / "trio")
    )
    trio = load_config(trio_copy)
    shared = read_properties_file(SHARED)
    for key, field in APPLIED_BY_BOTH.items():
        ours = getattr(trio, field)
        assert str(ours).lower() == kafka[key].lower() == shared[key].lower(), key


def test_kafka_starts_from_its_copy() -> None:
    """And the real thing, since a single KRaft node starts in seconds: Metadata answers."""
    _kafka_libs()
    kafka = kafka_peer.KafkaProcess(label="shared-config", config=SHARED)
    try:
        written = read_properties_file(kafka.data_dir / "server.properties")
        assert written["offsets.topic.num.partitions"] == "1"
        assert written["listeners"].startswith(f"PLAINTEXT://127.0.0.1:{kafka.port},")
    finally:
        kafka.stop()
