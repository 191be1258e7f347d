"""End to end: a capturing broker, real clients, then ``verify`` on local[2] — and on corrupted copies.

One broker run for the module, and one Spark job for every capture it verifies
(``verify_many``); the Spark session is shared by every verify module (conftest.py).
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import attrs
import pytest

pytest.importorskip("pyspark", reason="the verify extra (pyspark) is not installed")
if shutil.which("java") is None:
    pytest.skip("Spark needs a Java runtime (java not on PATH)", allow_module_level=True)

from tests.kafka_python_groups import knows_its_topics
from tests.verify.helpers import (
    CapturingBroker,
    Tcpdump,
    assign_twice,
    commit_backwards,
    drop_and_duplicate,
    drop_idempotent_batch,
    fetch_last_commit,
    first_multi_batch_crc,
    high_watermark_backwards,
    kinds,
    offset_fetch_stale,
    read_capture,
    rewrite_fetches,
    swap_first_two,
    write_rows,
)
from trio_broker.protocol.messages import decode_request, decode_response
from trio_broker.replay.ids import fetch_session_handed_out
from trio_broker.verify.job import summary_text, verify_many, write_report

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

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

    consumer = knows_its_topics(
        KafkaConsumer(
            *topics,
            bootstrap_servers=bootstrap,
            group_id="verify-group",
            auto_offset_reset="earliest",
            enable_auto_commit=True,
            auto_commit_interval_ms=500,
        )
    )
    seen = 0
    deadline = time.monotonic() + CONSUME_TIMEOUT_S
    try:
        while seen < MESSAGES * len(topics) and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                seen += len(records)
        for _ in range(3):  # incremental fetches in its fetch session (nothing new to read)
            consumer.poll(timeout_ms=200)
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
    # Whole Produce records: the pcap comparison and replay need them.
    broker = CapturingBroker(base / "data", capture_dir, ["--capture-records", "full"])
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
def replayed(capture: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run replayed into a fresh broker B, recorded client-side."""
    from trio_broker.cli import main

    base = tmp_path_factory.mktemp("replay")
    target = CapturingBroker(base / "data-b", base / "unused", ["--capture-paused"])
    try:
        code = main(
            ["replay", str(capture), "--to", target.bootstrap, "--speed", "0",
             "--capture", str(base / "replay")]
        )  # fmt: skip
    finally:
        assert target.stop() == 0, target.log()
    assert code == 0
    return base / "replay"


@pytest.fixture(scope="module")
def pcap_import(traffic: Traffic, tmp_path_factory: pytest.TempPathFactory) -> Path | None:
    """tcpdump's view of the traffic imported as a capture (None: no loopback capture)."""
    if traffic.pcap is None:
        return None
    from trio_broker.capture.pcap import import_pcap

    target = tmp_path_factory.mktemp("pcap") / "pcap"
    summary = import_pcap(traffic.pcap, {traffic.port}, target)
    assert summary.requests > 0 and summary.unpaired_responses == 0, summary.describe()
    return target


@pytest.fixture(scope="module")
def reports(
    spark: Any,
    capture: Path,
    replayed: Path,
    pcap_import: Path | None,
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, Any]:
    """Every capture the module verifies, in one Spark job (each job costs 15-30 s on a
    busy machine; the captures are kept apart in it, each verdict its own)."""
    root = tmp_path_factory.mktemp("verify-many")
    _by_id_capture(root / "by-id-good", lose_first=False)
    _by_id_capture(root / "by-id-bad", lose_first=True)
    captures = {
        "clean": capture,
        "replay": replayed,
        "by-id-good": root / "by-id-good",
        "by-id-bad": root / "by-id-bad",
        "corrupted": _corrupted(capture, root / "corrupted"),
    }
    if pcap_import is not None:
        captures["pcap"] = pcap_import
    return dict(zip(captures, verify_many(spark, list(captures.values())), strict=True))


@pytest.fixture(scope="module")
def clean_report(reports: dict[str, Any]) -> dict[str, Any]:
    return reports["clean"]


def test_clean_capture_passes(clean_report: dict[str, Any], capture: Path, tmp_path: Path) -> None:
    report = clean_report
    print(summary_text(report))
    assert report["ok"], summary_text(report)
    assert report["acknowledged_batches"] >= 2 * MESSAGES
    assert report["facts"].get("fetch_batch", 0) >= 2 * MESSAGES
    assert report["facts"].get("sync_assign", 0) >= 2
    assert not report["facts"].get("undecodable")
    assert report["frames_dropped_by_capture"] == 0
    assert report["facts"].get("commit_request", 0) >= 2
    stats = report["stats"]
    by_api = {row["api"]: row for row in stats["latency_by_api"]}
    assert {"PRODUCE", "FETCH", "OFFSET_COMMIT", "SYNC_GROUP"} <= set(by_api)
    for row in by_api.values():
        assert 0 <= row["p50_ms"] <= row["p99_ms"] <= row["p999_ms"] <= row["max_ms"]
    assert by_api["PRODUCE"]["requests"] >= 2 * MESSAGES
    directions = read_capture(capture).column("direction").to_pylist()
    assert sum(row["requests"] for row in stats["timeline"]) == directions.count("request")
    produced = sum(row["produce_bytes"] for row in stats["timeline"])
    assert produced > 2 * MESSAGES * len("verify-plain-0")
    assert {c["client_id"] for c in stats["latency_by_client"]} >= {"rdkafka"}
    write_report(report, tmp_path / "report")
    assert (tmp_path / "report" / "report.json").exists()
    page = (tmp_path / "report" / "report.html").read_text()
    assert "PASS" in page and page.count("<svg") >= 1 + len(by_api)


def test_compacted_capture_gives_the_same_facts(capture: Path) -> None:
    """The default capture keeps only the batch headers of Produce requests and Fetch
    responses: the verifier's decoder (what the Spark job runs on each row) yields
    exactly the facts of the whole frames."""
    from trio_broker.capture.compact import (
        compact_fetch_response,
        compact_produce_request,
        fetch_records,
    )
    from trio_broker.protocol.messages import decode_response
    from trio_broker.verify.decode import NEEDED_COLUMNS, decode_rows

    def read(part: Any, position: int, n: int) -> bytes:
        return bytes(memoryview(part)[position : position + n])

    table = read_capture(capture)
    columns = {n: table.column(n).to_pylist() for n in NEEDED_COLUMNS if n != "run"}
    columns["run"] = ["run"] * table.num_rows
    compacted = dict(columns, frame=list(columns["frame"]))
    count = fetches = 0
    for i, (key, direction) in enumerate(zip(columns["api_key"], columns["direction"])):
        if key == 0 and direction == "request":
            compacted["frame"][i] = compact_produce_request(columns["frame"][i])
            assert len(compacted["frame"][i]) < columns["frame_length"][i]
            count += 1
        if key == 1 and direction == "response":
            version = columns["api_version"][i]
            corr, message = decode_response(1, version, columns["frame"][i])
            frame = compact_fetch_response(version, corr, message, fetch_records(message), read)
            assert len(frame) <= columns["frame_length"][i]
            compacted["frame"][i] = frame
            fetches += len(frame) < columns["frame_length"][i]
    assert count >= 2 * MESSAGES and fetches >= 1
    full, compact = decode_rows(columns), decode_rows(compacted)
    assert compact == full
    assert full["kind"].count("produce_batch") >= 2 * MESSAGES
    assert "undecodable" not in full["kind"]


def fetch_error_code(version: int, frame: bytes) -> int:
    """A Fetch response's top-level error code, from the head of the frame (v7+)."""
    return int.from_bytes(frame[8 + (version >= 12) : 10 + (version >= 12)], "big", signed=True)


def test_replay_into_a_fresh_broker_verifies(reports: dict[str, Any], replayed: Path) -> None:
    """Replay the run into broker B, recording client-side; the recording verifies."""
    report = reports["replay"]
    original = reports["clean"]
    assert report["ok"], summary_text(report)
    # The same produce traffic was acknowledged again, and fetched back.
    assert report["acknowledged_batches"] == original["acknowledged_batches"]
    assert report["facts"]["fetch_batch"] >= 2 * MESSAGES
    # The consumer group's traffic means the same on the target: member ids and
    # generations were mapped, so its SyncGroup and OffsetCommit requests succeed.
    errors: dict[int, list[int]] = {8: [], 14: []}
    rows = read_capture(replayed).to_pylist()
    # kafka-python fetched through a session: the replayed incremental fetches name the
    # session the target opened (mapped from the capture's), so none is refused.
    fetch_heads = [
        (r["api_version"], r["frame"]) for r in rows
        if r["direction"] == "response" and r["api_key"] == 1
    ]  # fmt: skip
    assert any(fetch_session_handed_out(v, f) for v, f in fetch_heads)
    assert all(fetch_error_code(v, f) == 0 for v, f in fetch_heads)
    incremental = [
        body for r in rows
        if r["direction"] == "request" and r["api_key"] == 1
        and (body := decode_request(r["frame"])[1]).session_epoch > 0
    ]  # fmt: skip
    assert incremental, "the replayed traffic has no incremental fetch"
    for row in rows:
        if row["direction"] == "response" and row["api_key"] in errors:
            body: Any = decode_response(row["api_key"], row["api_version"], row["frame"])[1]
            if row["api_key"] == 14:
                errors[14].append(body.error_code)
            else:
                errors[8] += [p.error_code for t in body.topics for p in t.partitions]
    assert errors[14] and errors[8], errors
    assert set(errors[14]) == set(errors[8]) == {0}, errors
    assert report["facts"]["commit_ack"] >= 1 and report["facts"]["sync_assign"] >= 1, report[
        "facts"
    ]


def test_replay_says_which_requests_it_could_not_send(
    capture: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A default capture keeps Produce batches as headers: replay skips those requests
    and says how to capture so that they can be replayed."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from trio_broker.capture.compact import compact_produce_request
    from trio_broker.capture.schema import arrow_schema
    from trio_broker.cli import main

    rows = read_capture(capture).to_pylist()
    compacted = 0
    for row in rows:
        if row["api_key"] == 0 and row["direction"] == "request":
            row["frame"] = compact_produce_request(row["frame"])
            compacted += 1
    assert compacted >= 2 * MESSAGES
    headers_only = tmp_path / "headers-only"
    headers_only.mkdir()
    table = pa.Table.from_pylist(rows, schema=arrow_schema())
    pq.write_table(table, headers_only / "capture-b0-1-000000.parquet")
    target = CapturingBroker(tmp_path / "data", tmp_path / "unused", ["--capture-paused"])
    try:
        code = main(["replay", str(headers_only), "--to", target.bootstrap, "--speed", "0"])
    finally:
        assert target.stop() == 0, target.log()
    assert code == 0
    out, err = capsys.readouterr()
    assert f"{compacted} skipped" in out
    assert f"{compacted} requests were captured only in part" in err
    assert "--capture-records full" in err


def _log_end_offsets(bootstrap: str, topics: list[str]) -> dict[str, int]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "log-end-offsets"})
    try:
        ends = {}
        for topic in topics:
            partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
            ends[topic] = sum(
                consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                for p in partitions
            )
        return ends
    finally:
        consumer.close()


def test_a_second_replay_into_one_broker_appends_idempotent_batches_again(
    capture: Path, tmp_path: Path
) -> None:
    """Replayed twice into one broker, the second replay's idempotent producers get new
    producer ids from the target and their batches carry them: they are appended again,
    not answered as duplicates of the first replay's batches under the captured ids."""
    from trio_broker.cli import main

    topics = ["verify-plain", "verify-idem"]
    target = CapturingBroker(tmp_path / "data", tmp_path / "unused", ["--capture-paused"])
    ends = []
    try:
        for _ in range(2):
            code = main(["replay", str(capture), "--to", target.bootstrap, "--speed", "0"])
            assert code == 0
            ends.append(_log_end_offsets(target.bootstrap, topics))
    finally:
        assert target.stop() == 0, target.log()
    assert ends == [dict.fromkeys(topics, MESSAGES), dict.fromkeys(topics, 2 * MESSAGES)]


def test_pcap_import_matches_the_tap_and_verifies(
    reports: dict[str, Any], traffic: Traffic, pcap_import: Path | None
) -> None:
    """tcpdump saw the same connections: the import must yield the tap's frames, byte for byte."""
    if pcap_import is None:
        pytest.skip(f"no loopback capture in this sandbox: {traffic.no_pcap_reason}")

    def frames(directory: Path) -> list[tuple[str, int, int, bytes]]:
        t = read_capture(directory)
        cols = [t.column(c).to_pylist() for c in ("direction", "api_key", "correlation_id")]
        return sorted(zip(*cols, t.column("frame").to_pylist()))

    assert frames(pcap_import) == frames(traffic.capture_dir)
    report = reports["pcap"]
    assert report["ok"], summary_text(report)
    assert report["acknowledged_batches"] >= 2 * MESSAGES


def _by_id_capture(target: Path, *, lose_first: bool) -> None:
    """A hand-made capture naming its topic by id (Produce v13, Fetch v16) and by name
    (Fetch v12), with the Metadata response that pairs the two: two batches acknowledged
    at offsets 0 and 1, each fetch returning both (or, ``lose_first``, only the second)."""
    import uuid

    import trio_broker.protocol.messages as m
    from trio_broker.protocol.messages import encode_request, encode_response
    from trio_broker.protocol.records import build_batch

    topic_id = uuid.UUID("00000000-0000-4000-8000-00000000abcd")
    rows: list[dict[str, Any]] = []

    def add(direction: str, key: int, version: int, corr: int, frame: bytes) -> None:
        rows.append({
            "broker_id": 0, "connection_id": 1, "client_address": "127.0.0.1:1",
            "client_id": "hand-made", "direction": direction, "monotonic_ns": 1000 + len(rows),
            "wall_ns": 1000 + len(rows), "api_key": key, "api_version": version,
            "correlation_id": corr, "frame": frame,
        })  # fmt: skip

    def response(key: int, version: int, corr: int, body: Any) -> None:
        parts = encode_response(key, version, corr, body)
        add("response", key, version, corr, b"".join(bytes(p) for p in parts)[4:])

    M, P, R, F = m.MetadataResponse, m.ProduceRequest, m.ProduceResponse, m.FetchResponse
    response(3, 12, 1, M(throttle_time_ms=0, brokers=[], cluster_id=None, controller_id=0,
        cluster_authorized_operations=0, topics=[M.MetadataResponseTopic(
            error_code=0, name="by-id", topic_id=topic_id, is_internal=False, partitions=[],
            topic_authorized_operations=0)]))  # fmt: skip
    stored = b""
    for offset, value in enumerate((b"first", b"second")):
        batch = bytes(build_batch([(None, value)], base_timestamp=0))
        produce = P(transactional_id=None, acks=-1, timeout_ms=1000, topic_data=[
            P.TopicProduceData(name=None, topic_id=topic_id, partition_data=[
                P.TopicProduceData.PartitionProduceData(index=0, records=batch)])])  # fmt: skip
        add("request", 0, 13, 2 + offset, encode_request(0, 13, 2 + offset, "x", produce)[4:])
        response(0, 13, 2 + offset, R(throttle_time_ms=0, responses=[R.TopicProduceResponse(
            name=None, topic_id=topic_id, partition_responses=[
                R.TopicProduceResponse.PartitionProduceResponse(
                    index=0, error_code=0, base_offset=offset)])]))  # fmt: skip
        if not (lose_first and offset == 0):
            stored += bytes(build_batch([(None, value)], base_offset=offset, base_timestamp=0))
    for corr, version, by_id in ((4, 16, True), (5, 12, False)):
        part = F.FetchableTopicResponse.PartitionData(partition_index=0, error_code=0,
            high_watermark=2, last_stable_offset=2, log_start_offset=0, records=stored)  # fmt: skip
        topic = F.FetchableTopicResponse(
            topic=None if by_id else "by-id",
            topic_id=topic_id if by_id else None,
            partitions=[part],
        )
        response(1, version, corr, F(throttle_time_ms=0, error_code=0, session_id=0,
            responses=[topic], node_endpoints=[]))  # fmt: skip
    write_rows(rows, target)


def test_topics_named_by_id_are_matched_to_their_names(reports: dict[str, Any]) -> None:
    """Produce v13 and Fetch v16 name the topic by id, Fetch v12 by name: the job names
    every fact through the Metadata response, so the batches acknowledged by id are found
    by both fetches; a batch neither fetch returns is reported missing, under its name.
    (Both captures name the topic by the same id, in one job: each by its own Metadata.)"""
    report = reports["by-id-good"]
    assert report["ok"], summary_text(report)
    assert report["acknowledged_batches"] == 2
    assert report["facts"]["fetch_batch"] == 4
    report = reports["by-id-bad"]
    assert kinds(report, "acked_produce_fetched") == {"ack_missing"}, summary_text(report)
    (example,) = report["checks"]["acked_produce_fetched"]["examples"]
    assert example["topic"] == "by-id" and example["base_offset"] == 0


def _corrupted(capture: Path, target: Path) -> Path:
    """One corrupted copy of ``capture``, one corruption per topic (see
    test_corrupted_capture_reports_each_violation)."""
    crc = first_multi_batch_crc(capture, "verify-plain")
    edits = {
        "verify-plain": (drop_and_duplicate(crc), False),
        "verify-idem": (swap_first_two, True),
    }
    assert rewrite_fetches(capture, target, edits) >= 1
    rows = read_capture(target).to_pylist()
    rows = drop_idempotent_batch(rows, "verify-idem", 5)
    rows = high_watermark_backwards(rows, "verify-plain")
    rows = offset_fetch_stale(rows)
    rows = fetch_last_commit(commit_backwards(rows))  # allowed: must add no violation
    rows = assign_twice(rows)
    write_rows(rows, target)
    return target


def test_corrupted_capture_reports_each_violation(reports: dict[str, Any], tmp_path: Path) -> None:
    """One corrupted copy, one corruption per topic (the CLI's exit codes are
    test_verify_multi.py's).

    verify-plain: an acknowledged batch dropped from every fetch response, the first
    batch duplicated at a new offset, the last high watermark lowered; verify-idem: two
    batches' offsets swapped in place, the Produce with sequence 5 removed (a gap); the
    group: an OffsetFetch answering an offset later commits replaced (then a commit going
    backwards and an OffsetFetch answering it: Kafka allows both, verify must not flag them), a SyncGroup exchange copied
    for a made-up member of the same generation.
    """
    from trio_broker.cli import main

    assert main(["verify", str(tmp_path / "nothing-here")]) == 2
    report = reports["corrupted"]
    write_report(report, tmp_path / "report")
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
    assert kinds(report, "producer_sequences") == {"sequence_gap"}, text
    assert topics("producer_sequences", "sequence_gap") == {"verify-idem"}, text
    assert kinds(report, "high_watermark_monotonic") == {"high_watermark_backwards"}, text
    assert topics("high_watermark_monotonic", "high_watermark_backwards") == {"verify-plain"}
    # That HW of 1 is also a log end below what verify-plain acknowledged.
    assert kinds(report, "acked_topic_kept") == {"log_end_below_acked"}, text
    assert topics("acked_topic_kept", "log_end_below_acked") == {"verify-plain"}, text
    assert kinds(report, "offset_fetch_current") == {"offset_fetch_stale"}, text
    assert report["checks"]["offset_fetch_current"]["violations"] == 1, text
    assert kinds(report, "group_assignment_exclusive") == {"partition_assigned_twice"}, text
    for example in report["checks"]["group_assignment_exclusive"]["examples"]:
        assert any(m.startswith("intruder-") for m in example["members"]), text
    assert report["checks"]["fetched_batches_agree"]["violations"] == 0, text
