"""verify over several captures at once: the brokers of a cluster checked as one history.

Hand-made captures of two "brokers" (same file names, same connection and correlation
ids, so runs that were not kept apart would pair one broker's request with the other's
response): broker 1 acknowledged two batches at offsets 0 and 1, a consumer fetched the
partition from broker 2. Alone, neither capture shows a violation (no fetch on one, no
acknowledgement on the other); together they must be checked against each other. A
replica fetcher's connection (shown a batch above the high watermark that was later
truncated) is not what clients were told and must not count as a conflicting fetch.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import trio_broker.protocol.messages as m
from tests.verify.helpers import write_rows
from trio_broker.protocol.messages import encode_request, encode_response
from trio_broker.protocol.records import build_batch
from trio_broker.verify.job import spark_session, summary_text, verify

pytestmark = pytest.mark.timeout(600)

TOPIC = "multi"


class Rows:
    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def add(self, conn: int, client_id: str, direction: str, key: int, version: int,
            corr: int, frame: bytes) -> None:  # fmt: skip
        self.rows.append({
            "broker_id": 0, "connection_id": conn, "client_address": f"127.0.0.1:{conn}",
            "client_id": client_id, "direction": direction,
            "monotonic_ns": 1000 + len(self.rows), "wall_ns": 1000 + len(self.rows),
            "api_key": key, "api_version": version, "correlation_id": corr, "frame": frame,
        })  # fmt: skip

    def request(self, conn: int, client_id: str, key: int, version: int, corr: int,
                body: Any) -> None:  # fmt: skip
        frame = encode_request(key, version, corr, client_id, body)[4:]
        self.add(conn, client_id, "request", key, version, corr, frame)

    def response(self, conn: int, client_id: str, key: int, version: int, corr: int,
                 body: Any) -> None:  # fmt: skip
        parts = encode_response(key, version, corr, body)
        frame = b"".join(bytes(p) for p in parts)[4:]
        self.add(conn, client_id, "response", key, version, corr, frame)


def batch(value: bytes, offset: int = 0) -> bytes:
    return bytes(build_batch([(None, value)], base_offset=offset, base_timestamp=0))


def produce(rows: Rows, corr: int, value: bytes, offset: int) -> None:
    P, R = m.ProduceRequest, m.ProduceResponse
    rows.request(1, "producer", 0, 9, corr, P(transactional_id=None, acks=-1, timeout_ms=1000,
        topic_data=[P.TopicProduceData(name=TOPIC, partition_data=[
            P.TopicProduceData.PartitionProduceData(index=0, records=batch(value))])]))  # fmt: skip
    rows.response(1, "producer", 0, 9, corr, R(throttle_time_ms=0, responses=[
        R.TopicProduceResponse(name=TOPIC, partition_responses=[
            R.TopicProduceResponse.PartitionProduceResponse(
                index=0, error_code=0, base_offset=offset)])]))  # fmt: skip


def fetch(rows: Rows, conn: int, client_id: str, corr: int, records: bytes, hw: int) -> None:
    Q, F = m.FetchRequest, m.FetchResponse
    rows.request(conn, client_id, 1, 12, corr, Q(replica_id=-1, max_wait_ms=0, min_bytes=1,
        max_bytes=1 << 20, isolation_level=0, session_id=0, session_epoch=-1, topics=[
            Q.FetchTopic(topic=TOPIC, partitions=[Q.FetchTopic.FetchPartition(
                partition=0, current_leader_epoch=-1, fetch_offset=0, last_fetched_epoch=-1,
                log_start_offset=-1, partition_max_bytes=1 << 20)])],
        forgotten_topics_data=[], rack_id=""))  # fmt: skip
    part = F.FetchableTopicResponse.PartitionData(partition_index=0, error_code=0,
        high_watermark=hw, last_stable_offset=hw, log_start_offset=0, records=records)  # fmt: skip
    rows.response(conn, client_id, 1, 12, corr, F(throttle_time_ms=0, error_code=0,
        session_id=0, responses=[F.FetchableTopicResponse(topic=TOPIC, partitions=[part])]))  # fmt: skip


def two_brokers(root: Path, *, overwritten: bool) -> tuple[Path, Path]:
    """Broker 1 acknowledged b"a" at 0 and b"b" at 1 and showed its follower (broker 2's
    replica fetcher) b"x" at offset 2, above its high watermark; the consumer read
    broker 2 (leader after a failover), where offset 2 holds b"y". ``overwritten``:
    broker 2 returned b"c" at offset 0 instead of the acknowledged b"a"."""
    first, second = Rows(), Rows()
    produce(first, 1, b"a", 0)
    produce(first, 2, b"b", 1)
    fetch(first, 2, "replica-fetcher-2", 1, batch(b"a", 0) + batch(b"b", 1) + batch(b"x", 2), 2)
    at_zero = b"c" if overwritten else b"a"
    fetch(second, 1, "consumer", 1, batch(at_zero, 0) + batch(b"b", 1) + batch(b"y", 2), 3)
    write_rows(first.rows, root / "broker1")
    write_rows(second.rows, root / "broker2")
    return root / "broker1", root / "broker2"


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    session = spark_session("local[2]")
    yield session
    session.stop()


def test_captures_of_several_brokers_are_checked_together(spark: Any, tmp_path: Path) -> None:
    good = two_brokers(tmp_path / "good", overwritten=False)
    report = verify(spark, list(good))
    assert report["ok"], summary_text(report)
    assert report["acknowledged_batches"] == 2
    assert report["capture_dirs"] == [str(d) for d in good]
    # A parent directory with one capture per subdirectory means the same.
    assert verify(spark, tmp_path / "good")["ok"]

    bad = two_brokers(tmp_path / "bad", overwritten=True)
    report = verify(spark, list(bad))
    found = report["checks"]["acked_produce_fetched"]["by_kind"]
    assert found == {"ack_crc_mismatch": 1}, summary_text(report)
    # Each capture alone holds no violation: only together is the loss visible.
    assert all(verify(spark, d)["ok"] for d in bad)


def test_the_cli_takes_several_directories_and_keeps_its_exit_codes(tmp_path: Path) -> None:
    from trio_broker.cli import main

    good = two_brokers(tmp_path / "good", overwritten=False)
    two_brokers(tmp_path / "bad", overwritten=True)
    assert main(["verify", str(good[0]), str(tmp_path / "nothing-here")]) == 2
    # The good pair passes through verify() above; the CLI (one Spark start) must fail
    # the bad one, given as a parent directory.
    assert main(["verify", str(tmp_path / "bad"), "--report", str(tmp_path / "report")]) == 1
