"""``verify`` on transactional traffic: a capturing broker, a confluent-kafka transactional
producer (commits and aborts) and a read_committed consumer, then ``verify`` on the capture
(clean: exit 0, the transaction checks run) and on doctored copies (each check fails).

One broker run for the module, and one Spark job for the clean capture and its doctored
copies (``verify_many``); the Spark session is shared (conftest.py).
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark", reason="the verify extra (pyspark) is not installed")
if shutil.which("java") is None:
    pytest.skip("Spark needs a Java runtime (java not on PATH)", allow_module_level=True)

from tests.verify.helpers import (
    CapturingBroker,
    kinds,
    read_capture,
    write_rows,
)
from trio_broker.protocol.messages import decode_request, decode_response, encode_response
from trio_broker.protocol.records import split_batches
from trio_broker.verify.job import summary_text, verify_many

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

TOPICS = ("txn-a", "txn-b")
#: (tag, commit?) of each transaction, in order; each writes PER_TOPIC records per topic.
TRANSACTIONS = (("c1", True), ("a1", False), ("c2", True), ("a2", False), ("c3", True))
PER_TOPIC = 3
CONSUME_TIMEOUT_S = 40.0
TXN_CHECKS = ("read_committed_no_aborted", "committed_transaction_atomic", "last_stable_offset")


def _produce_transactions(bootstrap: str) -> None:
    from confluent_kafka import Producer

    producer = Producer(
        {"bootstrap.servers": bootstrap, "transactional.id": "verify-txn", "linger.ms": 0}
    )
    producer.init_transactions(20)
    for tag, commit in TRANSACTIONS:
        producer.begin_transaction()
        for topic in TOPICS:
            for i in range(PER_TOPIC):
                producer.produce(topic, f"{tag}-{topic}-{i}".encode())
                producer.flush(10)  # one batch per record: several batches per transaction
        if commit:
            producer.commit_transaction(20)
        else:
            producer.abort_transaction(20)


def _consume_committed(bootstrap: str) -> list[str]:
    from confluent_kafka import Consumer

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap, "group.id": "verify-txn-reader",
            "auto.offset.reset": "earliest", "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )  # fmt: skip
    wanted = sum(commit for _, commit in TRANSACTIONS) * PER_TOPIC * len(TOPICS)
    seen: list[str] = []
    deadline = time.monotonic() + CONSUME_TIMEOUT_S
    try:
        consumer.subscribe(list(TOPICS))
        while len(seen) < wanted and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                seen.append(message.value().decode())
        # A few more polls: fetches past the last marker (the LSO reaches the end).
        for _ in range(4):
            consumer.poll(0.3)
    finally:
        consumer.close()
    return seen


@pytest.fixture(scope="module")
def capture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("verify-txn")
    capture_dir = base / "capture"
    # The default capture (batch headers only): markers keep their header, not their type.
    broker = CapturingBroker(base / "data", capture_dir)
    try:
        _produce_transactions(broker.bootstrap)
        seen = _consume_committed(broker.bootstrap)
    finally:
        code = broker.stop()
    assert code == 0, broker.log()
    committed = {tag for tag, commit in TRANSACTIONS if commit}
    assert sorted(seen) == sorted(
        f"{tag}-{topic}-{i}" for tag in committed for topic in TOPICS for i in range(PER_TOPIC)
    ), broker.log()
    return capture_dir


def test_clean_transactional_capture_passes(reports: dict[str, Any]) -> None:
    report = reports["clean"]
    text = summary_text(report)
    assert report["ok"], text
    facts = report["facts"]
    assert facts.get("end_txn") == facts.get("end_txn_ack") == len(TRANSACTIONS), facts
    assert facts.get("fetch_aborted", 0) >= 1, facts  # the aborted ranges were fetched
    assert facts.get("fetch_isolation", 0) >= 1, facts
    batches = len(TRANSACTIONS) * len(TOPICS) * PER_TOPIC
    assert report["transactional_batches"] == batches, text
    for name in TXN_CHECKS:
        assert report["checks"][name]["violations"] == 0, text
        assert name in text


def _first_transactional_crc(capture: Path, topic: str) -> int:
    """The CRC of the first transactional batch produced to ``topic`` (transaction c1)."""
    table = read_capture(capture)
    for row in table.to_pylist():
        if row["direction"] != "request" or row["api_key"] != 0:
            continue
        _, body = decode_request(row["frame"])
        for t in body.topic_data:
            for part in t.partition_data:
                if t.name != topic or part.records is None:
                    continue
                for batch in split_batches(bytes(part.records))[0]:
                    if batch.is_transactional:
                        return int(batch.crc)
    raise AssertionError(f"no transactional batch for {topic}")


def _doctor_fetch_responses(rows: list[dict[str, Any]], edit: Any) -> int:
    """Apply ``edit(partition)`` to every fetch response partition; re-encode the changed."""
    changed = 0
    for row in rows:
        if row["direction"] != "response" or row["api_key"] != 1:
            continue
        corr, body = decode_response(1, row["api_version"], row["frame"])
        touched = False
        for topic in body.responses:
            for part in topic.partitions:
                touched |= bool(edit(part))
        if touched:
            parts = encode_response(1, row["api_version"], corr, body)
            row["frame"] = b"".join(bytes(p) for p in parts)[4:]
            changed += 1
    return changed


def _doctored(capture: Path, root: Path) -> dict[str, Path]:
    """Six doctored copies of the capture, each meant to fail one transaction check:

    1. ``lost``: the first committed batch of txn-a dropped from every fetch response
       (the consumer read past it): the committed transaction was not visible
       all-or-nothing;
    2. ``lso``: the first positive last stable offset raised past its high watermark:
       above the high watermark there, and the next responses' LSOs then go backwards;
    3. ``late-end``: the last EndTxn (c3's commit) moved after every fetch: the
       consumer's fetches saw an LSO past a transaction that was, by the traffic, still
       open;
    4. ``hidden``: an aborted-transaction entry from offset 0 added to every fetch
       response holding offset 0: the consumer would have dropped transaction c1's
       committed records;
    5. ``past-lso``: the LSO of the first response that returned records lowered to its
       first batch: records handed out at or past the last stable offset;
    6. ``no-aborted``: the aborted-transaction lists removed from every fetch response:
       read_committed consumers would have been handed the aborted records.
    """
    out: dict[str, Path] = {}

    def write(name: str, rows: list[dict[str, Any]]) -> None:
        write_rows(rows, root / name)
        out[name] = root / name

    # 1. A committed batch dropped from every fetch.
    crc = _first_transactional_crc(capture, "txn-a")
    rows = read_capture(capture).to_pylist()

    def drop_committed(part: Any) -> bool:
        if not part.records:
            return False
        batches, _ = split_batches(bytes(part.records))
        kept = [bytes(b.buf[: b.size_in_bytes]) for b in batches if b.crc != crc]
        if len(kept) == len(batches):
            return False
        part.records = b"".join(kept)
        return True

    # By CRC: the fetches name the topic by id (Fetch v13+).
    assert _doctor_fetch_responses(rows, drop_committed) >= 1
    write("lost", rows)

    # 2. LSO above the high watermark in one response, below an earlier one in another.
    rows = read_capture(capture).to_pylist()
    state = {"raised": False}

    def lso_jump(part: Any) -> bool:
        if part.error_code != 0 or part.last_stable_offset <= 0:
            return False
        if not state["raised"]:
            state["raised"] = True
            part.last_stable_offset = part.high_watermark + 5
            return True
        return False

    assert _doctor_fetch_responses(rows, lso_jump) == 1
    write("lso", rows)

    # 3. The last EndTxn exchange received only after everything else.
    rows = read_capture(capture).to_pylist()
    last = max(r["monotonic_ns"] for r in rows)
    end = max(
        (r for r in rows if r["api_key"] == 26 and r["direction"] == "request"),
        key=lambda r: r["monotonic_ns"],
    )
    for row in rows:
        if (row["api_key"], row["connection_id"], row["correlation_id"]) == (
            26, end["connection_id"], end["correlation_id"]
        ):  # fmt: skip
            later = 1000 if row["direction"] == "request" else 2000
            row["monotonic_ns"] = last + later
    write("late-end", rows)

    # 4. Committed c1 marked aborted in the fetch responses that returned it.
    rows = read_capture(capture).to_pylist()

    def hide_first(part: Any) -> bool:
        if not part.records:
            return False
        batches, _ = split_batches(bytes(part.records))
        if not batches or batches[0].base_offset != 0 or not batches[0].is_transactional:
            return False
        entry = type(part).AbortedTransaction(producer_id=batches[0].producer_id, first_offset=0)
        part.aborted_transactions = [entry, *(part.aborted_transactions or [])]
        return True

    assert _doctor_fetch_responses(rows, hide_first) >= 1
    write("hidden", rows)

    # 5. Records returned at or past the LSO.
    rows = read_capture(capture).to_pylist()
    lowered = {"done": False}

    def lso_below_records(part: Any) -> bool:
        if lowered["done"] or not part.records or part.error_code != 0:
            return False
        batches, _ = split_batches(bytes(part.records))
        if not batches:
            return False
        part.last_stable_offset = batches[0].base_offset
        lowered["done"] = True
        return True

    assert _doctor_fetch_responses(rows, lso_below_records) == 1
    write("past-lso", rows)

    # 6. Aborted lists gone.
    rows = read_capture(capture).to_pylist()

    def strip_aborted(part: Any) -> bool:
        if part.aborted_transactions:
            part.aborted_transactions = []
            return True
        return False

    assert _doctor_fetch_responses(rows, strip_aborted) >= 1
    write("no-aborted", rows)
    return out


@pytest.fixture(scope="module")
def reports(spark: Any, capture: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The clean capture and its six doctored copies, checked in one Spark job (the
    captures are kept apart in it: each verdict is its own capture's)."""
    captures = {"clean": capture} | _doctored(capture, tmp_path_factory.mktemp("doctored"))
    return dict(zip(captures, verify_many(spark, list(captures.values())), strict=True))


def test_doctored_captures_fail_each_transaction_check(reports: dict[str, Any]) -> None:
    """Each doctored copy (see _doctored) fails its own check, and only its own."""
    # 1. A committed batch dropped from every fetch.
    report = reports["lost"]
    text = summary_text(report)
    assert kinds(report, "committed_transaction_atomic") == {"committed_batch_missing"}, text
    (example,) = report["checks"]["committed_transaction_atomic"]["examples"]
    assert example["topic"] == "txn-a" and example["transactional_id"] == "verify-txn", text
    assert report["checks"]["read_committed_no_aborted"]["violations"] == 0, text

    # 2. LSO above the high watermark in one response, below an earlier one in another.
    report = reports["lso"]
    text = summary_text(report)
    found = kinds(report, "last_stable_offset")
    assert {"lso_above_high_watermark", "lso_backwards"} <= found, text

    # 3. The last EndTxn exchange received only after everything else.
    report = reports["late-end"]
    text = summary_text(report)
    assert kinds(report, "last_stable_offset") == {"lso_past_open_transaction"}, text
    for example in report["checks"]["last_stable_offset"]["examples"]:
        assert example["topic"] in TOPICS, text
    assert report["checks"]["read_committed_no_aborted"]["violations"] == 0, text
    assert report["checks"]["committed_transaction_atomic"]["violations"] == 0, text

    # 4. Committed c1 marked aborted in the fetch responses that returned it.
    report = reports["hidden"]
    text = summary_text(report)
    assert kinds(report, "committed_transaction_atomic") == {"committed_batch_hidden"}, text
    assert report["checks"]["read_committed_no_aborted"]["violations"] == 0, text

    # 5. Records returned at or past the LSO.
    report = reports["past-lso"]
    text = summary_text(report)
    assert kinds(report, "read_committed_no_aborted") == {"beyond_last_stable_offset"}, text

    # 6. Aborted lists gone.
    report = reports["no-aborted"]
    text = summary_text(report)
    assert kinds(report, "read_committed_no_aborted") == {"aborted_batch_returned"}, text
    assert report["checks"]["committed_transaction_atomic"]["violations"] == 0, text
    assert report["checks"]["last_stable_offset"]["violations"] == 0, text
