"""One broker process per data directory (storage/data_dir_lock.py).

A second ``trio-broker serve`` on a data dir a running broker uses exits 1 at once with
one line naming the dir, before opening (and recovering) any log; the first broker
keeps serving what it acknowledged. Once the first is killed with -9, the kernel has
dropped its lock and a new broker starts on the same dir with the data intact.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer

from tests.e2e.conftest import BROKER_EXE, BrokerProcess

TOPIC = "locked"


def produce(bootstrap: str, values: list[bytes]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0})
    for value in values:
        producer.produce(TOPIC, value=value)
    assert producer.flush(30) == 0


def read_all(bootstrap: str, count: int) -> list[bytes]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "locked-reader",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})  # fmt: skip
    consumer.subscribe([TOPIC])
    got: list[bytes] = []
    try:
        for _ in range(300):
            if len(got) >= count:
                break
            message = consumer.poll(0.1)
            if message is not None and message.error() is None:
                got.append(message.value())
    finally:
        consumer.close()
    return got


def test_a_second_broker_on_the_same_data_dir_exits_and_the_first_serves_on(
    tmp_path: Path,
) -> None:
    data_dir = tmp_path / "data"
    first = BrokerProcess(data_dir, "pipelined", "file")
    first.start()
    try:
        produce(first.bootstrap, [b"a", b"b"])
        second = subprocess.run(
            [str(BROKER_EXE), "serve", "--listen", "127.0.0.1:0", "--data-dir", str(data_dir)],
            stdin=subprocess.DEVNULL, capture_output=True, timeout=60,
        )  # fmt: skip
        assert second.returncode == 1, second.stderr.decode()
        message = second.stderr.decode()
        assert "in use by another broker process" in message and str(data_dir) in message
        assert "listening on" not in message  # refused before it served anything
        produce(first.bootstrap, [b"c"])
        assert read_all(first.bootstrap, 3) == [b"a", b"b", b"c"]

        first.kill9()  # the kernel drops the lock with the process
        first.start()
        assert read_all(first.bootstrap, 3) == [b"a", b"b", b"c"]
    finally:
        first.stop()


def test_serve_raises_its_open_files_limit_to_the_hard_limit(tmp_path: Path) -> None:
    """Every segment, index and connection is a descriptor: like the JVM under Kafka,
    ``serve`` lifts a low soft limit (started here at 256) to the hard one."""
    import resource

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard <= 256:
        pytest.skip(f"the hard limit on open files is {hard}: nothing to raise")

    def low_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))

    broker = subprocess.Popen(
        [str(BROKER_EXE), "serve", "--listen", "127.0.0.1:0", "--data-dir", str(tmp_path / "d")],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        preexec_fn=low_limit,
    )  # fmt: skip
    try:
        assert broker.stderr is not None
        for line in broker.stderr:  # bounded: the process ends (and EOF) if it cannot start
            if b"listening on" in line:
                break
        limits = Path(f"/proc/{broker.pid}/limits").read_text()
        (row,) = [line for line in limits.splitlines() if line.startswith("Max open files")]
        unlimited = hard == resource.RLIM_INFINITY
        soft_now, hard_now = row.split()[3:5]
        assert (soft_now, hard_now) == (
            str(1 << 20) if unlimited else str(hard),
            "unlimited" if unlimited else str(hard),
        ), row
    finally:
        broker.terminate()
        broker.wait(timeout=30)
