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

import itertools
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import trio_broker.protocol.messages as m
from tests.verify.helpers import write_rows
from trio_broker.capture.schema import arrow_schema
from trio_broker.protocol.messages import encode_request, encode_response
from trio_broker.protocol.records import build_batch
from trio_broker.verify.job import summary_text, verify_many

pytestmark = pytest.mark.timeout(600)

TOPIC = "multi"
#: One clock for every capture of a test, as CLOCK_MONOTONIC is for brokers on one host.
CLOCK = itertools.count(1000)


class Rows:
    def __init__(self, broker_id: int = 0) -> None:
        self.rows: list[dict[str, Any]] = []
        self.broker_id = broker_id

    def add(self, conn: int, client_id: str, direction: str, key: int, version: int,
            corr: int, frame: bytes) -> None:  # fmt: skip
        self.rows.append({
            "broker_id": self.broker_id, "connection_id": conn,
            "client_address": f"127.0.0.1:{conn}", "client_id": client_id,
            "direction": direction, "monotonic_ns": (now := next(CLOCK)), "wall_ns": now,
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


def batch(
    value: bytes, offset: int = 0, epoch: int = -1, producer_id: int = -1, sequence: int = 0
) -> bytes:
    """A one-record batch; ``epoch``: the partitionLeaderEpoch a leader stamps on it;
    ``producer_id``: an idempotent producer's, with producer epoch 0 and ``sequence``."""
    idempotent = producer_id >= 0
    return bytes(build_batch(
        [(None, value)], base_offset=offset, base_timestamp=0, partition_leader_epoch=epoch,
        producer_id=producer_id, producer_epoch=0 if idempotent else -1,
        base_sequence=sequence if idempotent else -1,
    ))  # fmt: skip


def produce(
    rows: Rows, corr: int, value: bytes, offset: int | None, producer_id: int = -1,
    sequence: int = 0, error: int = 0,
) -> None:  # fmt: skip
    """A Produce of ``value``, acknowledged at ``offset`` (None: no answer captured), or
    answered with ``error``."""
    P, R = m.ProduceRequest, m.ProduceResponse
    records = batch(value, producer_id=producer_id, sequence=sequence)
    rows.request(1, "producer", 0, 9, corr, P(transactional_id=None, acks=-1, timeout_ms=1000,
        topic_data=[P.TopicProduceData(name=TOPIC, partition_data=[
            P.TopicProduceData.PartitionProduceData(index=0, records=records)])]))  # fmt: skip
    if offset is None and not error:
        return
    rows.response(1, "producer", 0, 9, corr, R(throttle_time_ms=0, responses=[
        R.TopicProduceResponse(name=TOPIC, partition_responses=[
            R.TopicProduceResponse.PartitionProduceResponse(
                index=0, error_code=error, base_offset=-1 if error else offset)])]))  # fmt: skip


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


def metadata(rows: Rows, corr: int, leader: int, epoch: int) -> None:
    """A Metadata answer naming ``leader`` the partition's leader in ``epoch``."""
    Q, R = m.MetadataRequest, m.MetadataResponse
    rows.request(3, "admin", 3, 9, corr, Q(topics=None, allow_auto_topic_creation=False,
        include_cluster_authorized_operations=False,
        include_topic_authorized_operations=False))  # fmt: skip
    part = R.MetadataResponseTopic.MetadataResponsePartition(error_code=0, partition_index=0,
        leader_id=leader, leader_epoch=epoch, replica_nodes=[1, 2, 3], isr_nodes=[1, 2, 3],
        offline_replicas=[])  # fmt: skip
    rows.response(3, "admin", 3, 9, corr, R(throttle_time_ms=0, brokers=[], cluster_id="c",
        controller_id=1, topics=[R.MetadataResponseTopic(error_code=0, name=TOPIC,
            is_internal=False, partitions=[part], topic_authorized_operations=0)],
        cluster_authorized_operations=0))  # fmt: skip


def write_run(rows: Rows, target: Path, run: int) -> None:
    """``rows`` as the capture of one run (``run``: its start time in the file name)."""
    target.mkdir(parents=True, exist_ok=True)
    for row in rows.rows:
        row["frame_length"] = len(row["frame"])
    name = f"capture-b{rows.broker_id}-{run}-000000.parquet"
    pq.write_table(pa.Table.from_pylist(rows.rows, schema=arrow_schema()), target / name)


def failover(root: Path, *, doctored: bool) -> list[Path]:
    """Broker 1 leads in epoch 1 (a@0, b@1), broker 2 in epoch 2 (c@3), then broker 2
    restarts still leading in epoch 2. Each states its leadership in its own Metadata
    answers. An idempotent batch sent to broker 1 and unanswered (killed) is resent to
    broker 2, which acknowledges broker 1's copy at offset 2, stamped with epoch 1. Old
    broker 1 later shows a consumer its stale high watermark 2 (an older epoch: allowed).

    ``doctored``: broker 2 stamps c with epoch 1 (two brokers acknowledged writes in
    epoch 1), names broker 3 leader in epoch 1 (two leaders named for it), first shows
    high watermark 1 in epoch 2 (below the 2 epoch 1 showed before: allowed, a new
    leader's HW may lag its predecessor's, as in Kafka), and after its restart shows 3
    (below the 4 its first run showed in the same epoch: a violation)."""
    one, two, two_again = Rows(1), Rows(2), Rows(2)
    metadata(one, 1, leader=1, epoch=1)
    produce(one, 1, b"a", 0)
    produce(one, 2, b"b", 1)
    log = batch(b"a", 0, epoch=1) + batch(b"b", 1, epoch=1)
    fetch(one, 2, "consumer", 1, log, 2)
    produce(one, 3, b"i", None, producer_id=7)
    metadata(two, 1, leader=2, epoch=2)
    if doctored:
        metadata(two, 2, leader=3, epoch=1)
        fetch(two, 2, "consumer", 1, batch(b"a", 0, epoch=1), 1)
    produce(two, 1, b"i", 2, producer_id=7)
    produce(two, 2, b"c", 3)
    log += batch(b"i", 2, epoch=1, producer_id=7) + batch(b"c", 3, epoch=1 if doctored else 2)
    fetch(two, 2, "consumer", 2, log, 4)
    fetch(one, 2, "consumer", 3, log[: len(batch(b"a")) * 2], 2)
    metadata(two_again, 1, leader=2, epoch=2)
    fetch(two_again, 2, "consumer", 1, log, 3 if doctored else 4)
    write_run(one, root / "broker1", 1)
    write_run(two, root / "broker2", 1)
    write_run(two_again, root / "broker2", 2)
    return [root / "broker1", root / "broker2"]


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


def apart(root: Path, *, second: bool) -> Path:
    """One broker alone, clean: idempotent producer 7 (epoch 0, sequence 0) acknowledged
    at offset 0 (``second``: at offset 1, after a plain batch at 0), and a consumer
    fetched the log. Two such captures, ``second`` False and True, are each clean, but
    as one history they hold every kind of clash: two batches at offset 0, the first
    acknowledged batch fetched with another CRC, one sequence at two offsets."""
    rows = Rows(1)
    if second:
        produce(rows, 1, b"x", 0)
        produce(rows, 2, b"b", 1, producer_id=7)
        log = batch(b"x", 0) + batch(b"b", 1, producer_id=7)
    else:
        produce(rows, 1, b"a", 0, producer_id=7)
        log = batch(b"a", 0, producer_id=7)
    fetch(rows, 2, "consumer", 1, log, 2 if second else 1)
    write_run(rows, root, 1)
    return root


def sequence_gap(root: Path, *, sent: bool) -> Path:
    """One broker alone: idempotent producer 9 acknowledged sequence 0 at offset 0 and
    sequence 2 at offset 2; the consumer fetched sequences 0, 1 and 2 at offsets 0-2.
    ``sent``: sequence 1 was sent and answered REQUEST_TIMED_OUT (7), as a leader does
    when acks=all times out and the batch commits later: the gap is excused. Otherwise
    sequence 1 was never sent: a gap within one run that nothing explains."""
    rows = Rows(1)
    produce(rows, 1, b"s0", 0, producer_id=9, sequence=0)
    if sent:
        produce(rows, 2, b"s1", None, producer_id=9, sequence=1, error=7)
    produce(rows, 3, b"s2", 2, producer_id=9, sequence=2)
    log = b"".join(batch(b"s%d" % i, i, producer_id=9, sequence=i) for i in range(3))
    fetch(rows, 2, "consumer", 1, log, 3)
    write_run(rows, root, 1)
    return root


@pytest.fixture(scope="module")
def reports(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every capture of the module, checked in one Spark job (each job costs 15-30 s on a
    busy machine): the separation of captures within one job is itself under test."""
    root = tmp_path_factory.mktemp("multi")
    good = two_brokers(root / "good", overwritten=False)
    bad = two_brokers(root / "bad", overwritten=True)
    first, second = apart(root / "apart-1", second=False), apart(root / "apart-2", second=True)
    captures: dict[str, Any] = {
        # A parent directory with one capture per subdirectory means its subdirectories.
        "good": root / "good",
        "bad": list(bad),
        "bad-1": bad[0],
        "bad-2": bad[1],
        "failover-good": failover(root / "failover-good", doctored=False),
        "failover-bad": failover(root / "failover-bad", doctored=True),
        "apart-1": first,
        "apart-2": second,
        # The same two directories as one capture (one history): what the two above
        # would show if the job mixed them up.
        "apart-merged": [first, second],
        "gap-excused": sequence_gap(root / "gap-excused", sent=True),
        "gap-unexplained": sequence_gap(root / "gap-unexplained", sent=False),
    }
    found = verify_many(spark, list(captures.values()))
    return {"dirs": {"good": good, "bad": bad}} | dict(zip(captures, found, strict=True))


def test_captures_of_several_brokers_are_checked_together(reports: dict[str, Any]) -> None:
    good, bad = reports["dirs"]["good"], reports["dirs"]["bad"]
    report = reports["good"]
    assert report["ok"], summary_text(report)
    assert report["acknowledged_batches"] == 2
    assert report["capture_dirs"] == [str(d) for d in good]

    report = reports["bad"]
    assert report["capture_dirs"] == [str(d) for d in bad]
    found = report["checks"]["acked_produce_fetched"]["by_kind"]
    assert found == {"ack_crc_mismatch": 1}, summary_text(report)
    # Each capture alone holds no violation: only together is the loss visible.
    assert reports["bad-1"]["ok"], summary_text(reports["bad-1"])
    assert reports["bad-2"]["ok"], summary_text(reports["bad-2"])


def test_the_cli_checks_several_directories_and_exits_1_on_a_violation(
    spark: Any, reports: dict[str, Any], tmp_path: Path
) -> None:
    """``trio-broker verify`` in-process (it uses the running session): exit 2 for a
    missing directory, 1 and a report for the bad pair, the same as ``verify_many``'s."""
    import json

    from trio_broker.cli import main

    good, bad = reports["dirs"]["good"], reports["dirs"]["bad"]
    assert main(["verify", str(good[0]), str(tmp_path / "nothing-here")]) == 2
    assert main(["verify", *map(str, bad), "--report", str(tmp_path / "report")]) == 1
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    assert report["capture_dirs"] == [str(d) for d in bad]
    for key in ("checks", "facts", "acknowledged_batches", "frames"):
        assert report[key] == reports["bad"][key], key


def test_leaders_and_high_watermarks_are_checked_per_epoch_across_brokers(
    reports: dict[str, Any],
) -> None:
    report = reports["failover-good"]
    assert report["ok"], summary_text(report)
    assert report["acknowledged_batches"] == 4

    report = reports["failover-bad"]
    checks = report["checks"]
    assert checks["one_leader_per_epoch"]["by_kind"] == {
        "two_brokers_acked_in_epoch": 1,
        "two_leaders_named_in_epoch": 1,
    }, summary_text(report)
    examples = {e["violation"]: e for e in checks["one_leader_per_epoch"]["examples"]}
    assert examples["two_brokers_acked_in_epoch"]["brokers"] == [1, 2]
    assert examples["two_brokers_acked_in_epoch"]["leader_epoch"] == 1
    assert examples["two_leaders_named_in_epoch"]["brokers"] == [1, 3]
    assert checks["high_watermark_monotonic"]["by_kind"] == {
        "high_watermark_backwards_across_brokers": 1
    }, summary_text(report)
    backwards = sorted(
        (e["leader_epoch"], e["high_watermark"], e["earlier_high_watermark"])
        for e in checks["high_watermark_monotonic"]["examples"]
    )
    assert backwards == [(2, 3, 4)]
    others = {name for name, c in checks.items() if c["violations"]}
    assert others == {"one_leader_per_epoch", "high_watermark_monotonic"}, summary_text(report)


def test_captures_in_one_job_are_kept_apart(reports: dict[str, Any]) -> None:
    """One Spark job held eleven captures: each verdict is its capture's own. A violation is
    reported for its capture only (the bad pair's CRC mismatch, the failover's epochs),
    never in a clean one checked beside it, and two clean captures that clash when
    merged (same topic, offsets, producer id and sequence; same connection and
    correlation ids) both pass, while their merge fails every clashing check."""
    assert [name for name in reports if name != "dirs" and not reports[name]["ok"]] == [
        "bad",
        "failover-bad",
        "apart-merged",
        "gap-unexplained",
    ]
    for name in ("apart-1", "apart-2"):
        report = reports[name]
        assert report["acknowledged_batches"] == (1 if name == "apart-1" else 2)
        assert report["facts"]["fetch_batch"] == report["acknowledged_batches"]
        # Statistics are per capture too: every request of this capture, no other's.
        requests = sum(r["requests"] for r in report["stats"]["timeline"])
        assert requests == report["acknowledged_batches"] + 1  # its produces and one fetch
    merged = reports["apart-merged"]
    assert merged["acknowledged_batches"] == 3
    failed = {name: set(c["by_kind"]) for name, c in merged["checks"].items() if c["violations"]}
    assert failed == {
        "acked_produce_fetched": {"ack_crc_mismatch"},
        "fetched_batches_agree": {"fetch_conflict"},
        "producer_sequences": {"sequence_duplicate_other_offset"},
    }, summary_text(merged)


def test_a_sequence_gap_is_excused_only_when_its_batch_was_sent_and_is_in_the_log(
    reports: dict[str, Any],
) -> None:
    """The excuse of ``producer_sequences`` within one run (the gaps are joined alone,
    not every acknowledged batch: the 10M-frame capture needs it)."""
    report = reports["gap-excused"]
    assert report["ok"], summary_text(report)
    assert report["acknowledged_batches"] == 2
    report = reports["gap-unexplained"]
    failed = {name: c["by_kind"] for name, c in report["checks"].items() if c["violations"]}
    assert failed == {"producer_sequences": {"sequence_gap": 1}}, summary_text(report)
    (example,) = report["checks"]["producer_sequences"]["examples"]
    assert (example["base_sequence"], example["expected_sequence"]) == (2, 1)
