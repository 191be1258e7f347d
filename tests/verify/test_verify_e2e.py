"""End to end: a capturing broker, real clients, then ``verify`` on local[2] — and on corrupted copies.

One broker run and one Spark session for the module (Spark starts in ~7 s).
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

pytest.importorskip("pyspark", reason="the verify extra (pyspark) is not installed")
if shutil.which("java") is None:
    pytest.skip("Spark needs a Java runtime (java not on PATH)", allow_module_level=True)

from tests.verify.helpers import (
    CapturingBroker,
    Tcpdump,
    drop_and_duplicate,
    first_multi_batch_crc,
    kinds,
    read_capture,
    rewrite_fetches,
    swap_first_two,
)
from trio_broker.verify.job import spark_session, summary_text, verify, write_report

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

MESSAGES = 12
CONSUME_TIMEOUT_S = 40.0


def _produce(bootstrap: str, topic: str, idempotent: bool) -> None:
    from confluent_kafka import Producer

    conf: dict[str, Any] = {"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0}
    if idempotent:
        conf["enable.idempotence"] = True
    producer = Producer(conf)
    errors: list[Any] = []
    for i in range(MESSAGES):
        producer.produce(
            topic, f"{topic}-{i}".encode(), on_delivery=lambda err, _m: err and errors.append(err)
        )
        assert producer.flush(10) == 0  # one batch per message: several batches per fetch
    assert not errors, errors


def _consume(bootstrap: str, topics: list[str]) -> int:
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(
        *topics,
        bootstrap_servers=bootstrap,
        group_id="verify-group",
        auto_offset_reset="earliest",
        enable_auto_commit=True,
        auto_commit_interval_ms=500,
    )
    seen = 0
    deadline = time.monotonic() + CONSUME_TIMEOUT_S
    try:
        while seen < MESSAGES * len(topics) and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                seen += len(records)
        consumer.commit()
    finally:
        consumer.close()
    return seen


@attrs.frozen
class Traffic:
    capture_dir: Path
    port: int
    #: The same traffic as seen by tcpdump on loopback, or why there is none.
    pcap: Path | None
    no_pcap_reason: str


@pytest.fixture(scope="module")
def traffic(tmp_path_factory: pytest.TempPathFactory) -> Traffic:
    base = tmp_path_factory.mktemp("verify")
    capture_dir = base / "capture"
    broker = CapturingBroker(base / "data", capture_dir)
    tcpdump: Tcpdump | None = None
    reason = ""
    try:
        try:
            tcpdump = Tcpdump(broker.port, base / "traffic.pcap")
        except (RuntimeError, OSError) as exc:
            reason = str(exc)
        _produce(broker.bootstrap, "verify-plain", idempotent=False)
        _produce(broker.bootstrap, "verify-idem", idempotent=True)
        seen = _consume(broker.bootstrap, ["verify-plain", "verify-idem"])
    finally:
        code = broker.stop()
        if tcpdump is not None:
            tcpdump.stop()
    assert seen == 2 * MESSAGES, broker.log()
    assert code == 0, broker.log()
    assert list(capture_dir.glob("*.parquet")), broker.log()
    pcap = tcpdump.path if tcpdump is not None else None
    return Traffic(capture_dir, broker.port, pcap, reason)


@pytest.fixture(scope="module")
def capture(traffic: Traffic) -> Path:
    return traffic.capture_dir


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    # Tiny data: interpreted plans start faster than whole-stage code generation.
    session = spark_session("local[2]", {"spark.sql.codegen.wholeStage": "false"})
    yield session
    session.stop()


def test_clean_capture_passes(spark: Any, capture: Path, tmp_path: Path) -> None:
    report = verify(spark, capture)
    print(summary_text(report))
    assert report["ok"], summary_text(report)
    assert report["acknowledged_batches"] >= 2 * MESSAGES
    assert report["facts"].get("fetch_batch", 0) >= 2 * MESSAGES
    assert report["facts"].get("sync_assign", 0) >= 2
    assert not report["facts"].get("undecodable")
    assert report["frames_dropped_by_capture"] == 0
    write_report(report, tmp_path / "report")
    assert (tmp_path / "report" / "report.json").exists()
    assert "PASS" in (tmp_path / "report" / "report.html").read_text()


def test_pcap_import_matches_the_tap_and_verifies(
    spark: Any, traffic: Traffic, tmp_path: Path
) -> None:
    """tcpdump saw the same connections: the import must yield the tap's frames, byte for byte."""
    if traffic.pcap is None:
        pytest.skip(f"no loopback capture in this sandbox: {traffic.no_pcap_reason}")
    from trio_broker.capture.pcap import import_pcap

    summary = import_pcap(traffic.pcap, {traffic.port}, tmp_path / "pcap")
    assert summary.requests > 0 and summary.unpaired_responses == 0, summary.describe()

    def frames(directory: Path) -> list[tuple[str, int, int, bytes]]:
        t = read_capture(directory)
        cols = [t.column(c).to_pylist() for c in ("direction", "api_key", "correlation_id")]
        return sorted(zip(*cols, t.column("frame").to_pylist()))

    assert frames(tmp_path / "pcap") == frames(traffic.capture_dir)
    report = verify(spark, tmp_path / "pcap")
    assert report["ok"], summary_text(report)
    assert report["acknowledged_batches"] >= 2 * MESSAGES


def test_corrupted_capture_reports_each_violation(
    spark: Any, capture: Path, tmp_path: Path
) -> None:
    """One corrupted copy, one corruption per topic; checked through the CLI (exit code 1).

    verify-plain: an acknowledged batch dropped from every fetch response, and the first
    batch duplicated at a new offset; verify-idem: two batches' offsets swapped in place.
    """
    from trio_broker.cli import main

    crc = first_multi_batch_crc(capture, "verify-plain")
    edits = {
        "verify-plain": (drop_and_duplicate(crc), False),
        "verify-idem": (swap_first_two, True),
    }
    assert rewrite_fetches(capture, tmp_path / "bad", edits) >= 1
    assert main(["verify", str(tmp_path / "nothing-here")]) == 2
    # run_verify stops the shared session: this test runs last in the module.
    assert main(["verify", str(tmp_path / "bad"), "--report", str(tmp_path / "report")]) == 1
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    assert "FAIL" in (tmp_path / "report" / "report.html").read_text()
    assert not report["ok"]
    text = summary_text(report)

    def topics(check: str, kind: str) -> set[str]:
        return {e["topic"] for e in report["checks"][check]["examples"] if e["violation"] == kind}

    acked = "acked_produce_fetched"
    contiguous = "fetch_response_contiguous"
    assert kinds(report, acked) == {"ack_missing", "ack_duplicated", "ack_moved"}, text
    assert report["checks"][acked]["by_kind"]["ack_missing"] == 1, text
    assert report["checks"][acked]["by_kind"]["ack_duplicated"] == 1, text
    assert topics(acked, "ack_missing") == {"verify-plain"}, text
    assert topics(acked, "ack_duplicated") == {"verify-plain"}, text
    assert topics(acked, "ack_moved") == {"verify-idem"}, text
    assert kinds(report, contiguous) == {"fetch_gap", "fetch_out_of_order"}, text
    assert "verify-plain" in topics(contiguous, "fetch_gap"), text  # idem: after the swap
    assert topics(contiguous, "fetch_out_of_order") == {"verify-idem"}, text
    for check in ("producer_sequences", "group_assignment_exclusive", "high_watermark_monotonic"):
        assert report["checks"][check]["violations"] == 0, text
