"""The Spark job's compact facts: the decoder's facts with kind, run and topic as numbers."""

from __future__ import annotations

from typing import Any

import pytest

pa = pytest.importorskip("pyarrow")
pytest.importorskip("numpy")

from trio_broker.verify.compact import (  # noqa: E402
    KIND_CODE,
    KINDS,
    compact,
    compact_schema,
    topic_hash,
)
from trio_broker.verify.decode import fact_schema  # noqa: E402

FACTS: list[dict[str, Any]] = [
    {"run": "3", "conn": 1, "corr": 7, "ts": 10, "kind": "produce_batch", "topic": "orders",
     "partition": 0, "idx": 0, "crc": 99, "record_count": 2, "producer_id": 5,
     "producer_epoch": 0, "base_sequence": 4},
    {"run": "3", "conn": 1, "corr": 7, "ts": 11, "kind": "produce_ack", "topic": "orders",
     "partition": 0, "error": 0, "offset": 40},
    {"run": "0", "conn": 2, "corr": 1, "ts": 12, "kind": "fetch_part", "topic": "id:abc",
     "partition": 1, "error": 0, "offset": 3},
    {"run": "0", "conn": 2, "corr": 1, "ts": 13, "kind": "undecodable", "note": "why"},
    {"run": "0", "conn": 3, "corr": 2, "ts": 14, "kind": "sync_request", "group_id": "g",
     "generation": 4, "member_id": "m-1"},
]  # fmt: skip


def _batch(facts: list[dict[str, Any]]) -> Any:
    schema = fact_schema()
    return pa.RecordBatch.from_pylist(
        [{f.name: fact.get(f.name) for f in schema} for fact in facts], schema=schema
    )


def test_kinds_runs_and_topics_become_numbers_and_nothing_else_changes() -> None:
    out = compact(_batch(FACTS))
    assert all(b.schema == compact_schema() for b in out)
    rows = out[0].to_pylist()
    assert len(rows) == len(FACTS)
    for fact, row in zip(FACTS, rows, strict=True):
        assert row["kind"] == KIND_CODE[fact["kind"]]
        assert KINDS[row["kind"]] == fact["kind"]
        assert row["run"] == int(fact["run"])
        topic = fact.get("topic")
        assert row["topic"] == (None if topic is None else topic_hash(topic))
        for name, value in fact.items():
            if name not in ("kind", "run", "topic"):
                assert row[name] == value, name


def test_each_distinct_topic_key_is_named_once() -> None:
    out = compact(_batch(FACTS))
    assert len(out) == 2
    names = out[1].to_pylist()
    assert all(r["kind"] == KIND_CODE["topic_name"] for r in names)
    assert {r["topic"]: r["note"] for r in names} == {
        topic_hash("orders"): "orders",
        topic_hash("id:abc"): "id:abc",
    }
    assert len(names) == 2


def test_no_topics_no_names_and_empty_batches_vanish() -> None:
    out = compact(_batch([FACTS[3], FACTS[4]]))
    assert len(out) == 1 and out[0].num_rows == 2
    assert compact(_batch([])) == []


def test_topic_hash_is_a_stable_signed_64_bit_key() -> None:
    keys = [f"topic-{i}" for i in range(2000)] + ["", "id:00000000-0000-0000-0000-000000000001"]
    hashes = [topic_hash(k) for k in keys]
    assert len(set(hashes)) == len(keys)
    assert all(-(2**63) <= h < 2**63 for h in hashes)
    assert hashes == [topic_hash(k) for k in keys]


def test_driver_memory_grows_with_the_capture_unless_the_caller_chose(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from trio_broker.verify.job import driver_memory

    monkeypatch.delenv("PYSPARK_SUBMIT_ARGS", raising=False)
    assert driver_memory(None, {}) is None
    assert driver_memory(80_000, {}) == "1g"  # Spark's default, for CI-sized captures
    chosen = driver_memory(1_300_000, {})  # a 30-minute Jepsen run's: 5g (half the RAM at most)
    assert chosen is not None and 1 < int(chosen.rstrip("g")) <= 5
    assert driver_memory(1_300_000, {"spark.driver.memory": "2g"}) is None
    monkeypatch.setenv("PYSPARK_SUBMIT_ARGS", "--driver-memory 6g pyspark-shell")
    assert driver_memory(1_300_000, {}) is None
