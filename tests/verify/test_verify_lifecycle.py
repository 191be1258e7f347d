"""``verify``'s topic-lifecycle check (``acked_topic_kept``) on a broker killed with -9.

Run 1 acknowledges PRODUCED records of one topic (acks=all) and is killed with SIGKILL
once its capture holds the acknowledgements. Run 2 starts on the same capture directory
and, with no Fetch at all, asks for the topic's metadata and latest offset and produces
AGAIN more records. On the data that run 1 left the capture passes; on an emptied data
directory (a broker that forgot the topic across the kill) the later answers show a
lower log end, an unknown topic and a new topic id, each reported. A copy of the clean
capture with its second run's topic ids and ListOffsets answers doctored fails too. The
four captures are checked in one Spark job (``verify_many``).
"""

from __future__ import annotations

import shutil
import signal
import time
import uuid
from pathlib import Path
from typing import Any

import attrs
import pytest

pytest.importorskip("pyspark", reason="the verify extra (pyspark) is not installed")
if shutil.which("java") is None:
    pytest.skip("Spark needs a Java runtime (java not on PATH)", allow_module_level=True)

from tests.verify.helpers import CapturingBroker, kinds, read_capture
from trio_broker.protocol.messages import decode_response, encode_response
from trio_broker.verify.job import summary_text, verify_many

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

TOPIC = "lifecycle"
PRODUCED = 6
AGAIN = 2
CAPTURED_TIMEOUT_S = 30.0
#: The topic id the doctored copy's second run names.
OTHER_ID = uuid.UUID("00000000-0000-4000-8000-0000000f0a0f")


def _produce(bootstrap: str, count: int) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0})
    errors: list[Any] = []
    for i in range(count):
        producer.produce(TOPIC, f"v{i}".encode(), on_delivery=lambda e, _m: e and errors.append(e))
        assert producer.flush(10) == 0
    assert not errors, errors


def _ask(bootstrap: str) -> tuple[bool, int]:
    """Whether the topic is known (Metadata, no auto-creation) and its latest offset
    (ListOffsets, read_uncommitted), or -1 when unknown."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "lifecycle",
         "isolation.level": "read_uncommitted"}
    )  # fmt: skip
    try:
        topic = consumer.list_topics(TOPIC, timeout=10).topics[TOPIC]
        if topic.error is not None:
            return False, -1
        return True, consumer.get_watermark_offsets(TopicPartition(TOPIC, 0), timeout=10)[1]
    finally:
        consumer.close()


def _produce_acks(capture_dir: Path) -> int:
    if not list(capture_dir.glob("*.parquet")):
        return 0
    table = read_capture(capture_dir)
    rows = zip(table.column("direction").to_pylist(), table.column("api_key").to_pylist())
    return sum(1 for direction, key in rows if direction == "response" and key == 0)


@attrs.frozen
class Runs:
    kept: Path
    forgotten: Path
    #: (topic known, latest offset) as run 2 answered, per capture.
    answers: dict[str, tuple[bool, int]]


def _second_run(base: Path, name: str, data: Path) -> tuple[Path, tuple[bool, int]]:
    capture = base / name / "capture"
    broker = CapturingBroker(data, capture)
    try:
        before = _ask(broker.bootstrap)
        _produce(broker.bootstrap, AGAIN)
        after = _ask(broker.bootstrap)
    finally:
        code = broker.stop()
    assert code == 0, broker.log()
    assert after[0], broker.log()
    return capture, before


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    base = tmp_path_factory.mktemp("lifecycle")
    first = base / "first"
    first.mkdir()
    broker = CapturingBroker(first / "data", first / "capture")
    try:
        _produce(broker.bootstrap, PRODUCED)
        # The capture is flushed every second: wait until it holds every acknowledgement.
        deadline = time.monotonic() + CAPTURED_TIMEOUT_S
        while _produce_acks(first / "capture") < PRODUCED:
            assert time.monotonic() < deadline, broker.log()
            time.sleep(0.2)
    finally:
        broker.proc.send_signal(signal.SIGKILL)
        broker.proc.wait(20)
    answers = {}
    captures = {}
    for name in ("kept", "forgotten"):
        shutil.copytree(first / "capture", base / name / "capture")
        data = base / name / "data"
        if name == "kept":
            shutil.copytree(first / "data", data)
        else:
            data.mkdir()  # the broker forgot everything, the topic with it
        captures[name], answers[name] = _second_run(base, name, data)
    assert answers["kept"] == (True, PRODUCED), answers
    assert answers["forgotten"] == (False, -1), answers
    return Runs(captures["kept"], captures["forgotten"], answers)


def test_a_broker_that_kept_the_topic_passes(reports: dict[str, Any]) -> None:
    report = reports["kept"]
    text = summary_text(report)
    assert report["ok"], text
    assert report["acknowledged_batches"] == PRODUCED + AGAIN, text
    assert report["facts"].get("list_offsets_answer", 0) >= 2, report["facts"]
    assert not report["facts"].get("fetch_part"), "the check must not need a fetch"


def test_a_broker_that_forgot_the_topic_fails(reports: dict[str, Any]) -> None:
    """No fetch anywhere: only the lifecycle check can see the loss. (Checked in the job
    that also holds ``deleted``, its copy with a DeleteTopics: that request must not
    excuse this capture.)"""
    report = reports["forgotten"]
    text = summary_text(report)
    assert not report["ok"], text
    failed = {name for name, check in report["checks"].items() if check["violations"]}
    assert failed == {"acked_topic_kept"}, text
    assert kinds(report, "acked_topic_kept") == {
        "log_end_below_acked",
        "topic_unknown",
        "topic_id_changed",
    }, text
    examples = report["checks"]["acked_topic_kept"]["examples"]
    lowered: dict[str, set[tuple[int, int]]] = {}
    for e in examples:
        if e["violation"] == "log_end_below_acked":
            lowered.setdefault(e["answer"], set()).add((e["log_end"], e["acked_end"]))
    # Run 2's records were appended at 0 and 1 again, and its log end answered as 2
    # (Produce offsets are not judged: a retry answers with its first copy's offset).
    assert lowered == {"list_offsets": {(AGAIN, PRODUCED)}}, text
    for example in examples:
        assert example["topic"] == TOPIC, text
    (changed,) = [e for e in examples if e["violation"] == "topic_id_changed"]
    assert changed["previous_id"] != changed["topic_id"], text
    assert changed["acked_batches"] == PRODUCED, text


def _doctor(rows: list[dict[str, Any]], key: int, edit: Any) -> int:
    """Apply ``edit(body)`` to the responses of API ``key`` in ``rows``."""
    changed = 0
    for row in rows:
        if row["direction"] != "response" or row["api_key"] != key:
            continue
        corr, body = decode_response(key, row["api_version"], row["frame"])
        if edit(body):
            parts = encode_response(key, row["api_version"], corr, body)
            row["frame"] = b"".join(bytes(p) for p in parts)[4:]
            row["frame_length"] = len(row["frame"])
            changed += 1
    return changed


def _doctored_ids_and_log_ends(runs: Runs, target: Path) -> Path:
    """The clean capture with run 2's Metadata naming another topic id and its
    ListOffsets answering offset 1."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    def new_id(body: Any) -> bool:
        touched = False
        for topic in body.topics:
            if topic.name == TOPIC and topic.topic_id is not None:
                topic.topic_id = OTHER_ID
                touched = True
        return touched

    def lower(body: Any) -> bool:
        touched = False
        for topic in body.topics:
            for part in topic.partitions:
                if topic.name == TOPIC and part.offset > 1:
                    part.offset = 1
                    touched = True
        return touched

    # Each run keeps its own files (connection ids start again in every run).
    files = sorted(runs.kept.glob("*.parquet"))
    second = max(path.name.rsplit("-", 1)[0] for path in files)
    target.mkdir()
    changed = {2: 0, 3: 0}
    for path in files:
        table = pq.read_table(path)
        if path.name.startswith(second):
            rows = table.to_pylist()
            changed[3] += _doctor(rows, 3, new_id)
            changed[2] += _doctor(rows, 2, lower)
            table = pa.Table.from_pylist(rows, schema=table.schema)
        pq.write_table(table, target / path.name)
    assert changed[2] >= 1 and changed[3] >= 1, changed
    return target


def test_doctored_ids_and_log_ends_fail(reports: dict[str, Any]) -> None:
    """Run 2's new topic id and lowered ListOffsets answer: both reported, nothing else."""
    other = f"id:{OTHER_ID}"
    report = reports["doctored"]
    text = summary_text(report)
    failed = {name for name, check in report["checks"].items() if check["violations"]}
    assert failed == {"acked_topic_kept"}, text
    assert kinds(report, "acked_topic_kept") == {"log_end_below_acked", "topic_id_changed"}
    examples = report["checks"]["acked_topic_kept"]["examples"]
    answers = {e["answer"] for e in examples if e["violation"] == "log_end_below_acked"}
    assert answers == {"list_offsets"}, text
    (changed_id,) = [e for e in examples if e["violation"] == "topic_id_changed"]
    assert changed_id["topic_id"] == other, text


def _deleted(runs: Runs, target: Path) -> Path:
    """The forgetful broker's capture with a DeleteTopics request for the topic after the
    first run's acknowledgements."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    import trio_broker.protocol.messages as m
    from trio_broker.protocol.messages import encode_request

    files = sorted(runs.forgotten.glob("*.parquet"))
    first = min(path.name.rsplit("-", 1)[0] for path in files)
    # The request goes into one file: the first run's last (a loaded machine's capture
    # rolls into several files; a copy in each would be several DeleteTopics).
    first_run = [path for path in files if path.name.rsplit("-", 1)[0] == first]
    first_rows = [row for path in first_run for row in pq.read_table(path).to_pylist()]
    target.mkdir()
    for path in files:
        table = pq.read_table(path)
        if path == first_run[-1]:
            rows = table.to_pylist()
            body = m.DeleteTopicsRequest(topics=[], topic_names=[TOPIC], timeout_ms=1000)
            frame = encode_request(20, 4, 1, "admin", body)[4:]
            last = max(r["monotonic_ns"] for r in first_rows)
            rows.append({
                **rows[0], "connection_id": max(r["connection_id"] for r in first_rows) + 1,
                "client_id": "admin", "direction": "request", "api_key": 20, "api_version": 4,
                "correlation_id": 1, "monotonic_ns": last + 1, "wall_ns": rows[0]["wall_ns"],
                "frame": frame, "frame_length": len(frame),
            })  # fmt: skip
            table = pa.Table.from_pylist(rows, schema=table.schema)
        pq.write_table(table, target / path.name)
    return target


@pytest.fixture(scope="module")
def reports(spark: Any, runs: Runs, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The two second runs' captures and two doctored copies, in one Spark job (kept
    apart in it: each verdict is its own capture's)."""
    root = tmp_path_factory.mktemp("lifecycle-doctored")
    captures = {
        "kept": runs.kept,
        "forgotten": runs.forgotten,
        "doctored": _doctored_ids_and_log_ends(runs, root / "doctored"),
        "deleted": _deleted(runs, root / "deleted"),
    }
    return dict(zip(captures, verify_many(spark, list(captures.values())), strict=True))


def test_a_deleted_topic_is_not_judged(reports: dict[str, Any]) -> None:
    """The topic was meant to go: nothing is reported."""
    report = reports["deleted"]
    assert report["facts"].get("delete_topic") == 1, report["facts"]
    assert report["ok"], summary_text(report)
