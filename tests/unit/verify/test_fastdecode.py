"""The vectorized verify decoder (trio_broker/verify/fastdecode.py) against the reference.

Frames are built with our codec; both ``decode_rows`` (per row, the reference) and
``decode_batches`` (the vectorized path the Spark job runs) decode them, and must
yield the same multiset of facts. No Spark needed.
"""

from __future__ import annotations

import importlib.util
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

pa = pytest.importorskip("pyarrow")
pytest.importorskip("numpy")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import trio_broker.protocol.messages as m  # noqa: E402
from trio_broker.capture.compact import (  # noqa: E402
    compact_fetch_response,
    compact_produce_request,
    fetch_records,
)
from trio_broker.protocol.codec import RecordsChunks  # noqa: E402
from trio_broker.protocol.messages import encode_request, encode_response  # noqa: E402
from trio_broker.protocol.records import build_batch  # noqa: E402
from trio_broker.protocol.schema import SCHEMAS, Field, uses_topic_ids  # noqa: E402
from trio_broker.verify import fastdecode as fd  # noqa: E402
from trio_broker.verify.decode import (  # noqa: E402
    NEEDED_COLUMNS,
    decode_rows,
    fact_schema,
)
from trio_broker.verify.fastdecode import decode_batch, decode_batches  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
Row = dict[str, Any]

P = m.ProduceRequest
PR = m.ProduceResponse
F = m.FetchResponse


# ------------------------------------------------------------------ comparing


def _arrow(rows: list[Row]) -> Any:
    types = {
        "run": pa.string(), "connection_id": pa.int64(), "monotonic_ns": pa.int64(),
        "direction": pa.string(), "api_key": pa.int16(), "api_version": pa.int16(),
        "correlation_id": pa.int32(), "frame_length": pa.int64(), "frame": pa.binary(),
    }  # fmt: skip
    return pa.RecordBatch.from_arrays(
        [pa.array([r[n] for r in rows], types[n]) for n in NEEDED_COLUMNS], names=NEEDED_COLUMNS
    )


def _reference(batch: Any) -> Counter[tuple[Any, ...]]:
    facts = decode_rows({n: batch.column(n).to_pylist() for n in NEEDED_COLUMNS})
    names = list(facts)
    return Counter(tuple(facts[n][i] for n in names) for i in range(len(facts["run"])))


def _fast(batch: Any) -> Counter[tuple[Any, ...]]:
    out: Counter[tuple[Any, ...]] = Counter()
    for facts in decode_batches(iter([batch])):
        assert facts.schema == fact_schema()  # what mapInArrow was promised (FACT_DDL)
        out.update(tuple(row.values()) for row in facts.to_pylist())
    return out


def _same_facts(rows: list[Row]) -> dict[str, int]:
    # A slice, as Spark may hand over: the columns start at an offset into their buffers.
    batch = _arrow([_row("request", 0, 9, b"\x00\x00\x00\x09skipped"), *rows]).slice(1)
    expected = _reference(batch)
    assert _fast(batch) == expected
    stats: dict[str, int] = {}
    decode_batch(batch, stats)
    return stats


# ------------------------------------------------------------------ frames


def _join(parts: list[Any]) -> bytes:
    return b"".join(bytes(p) for p in parts)


def _row(direction: str, key: int, version: int, frame: bytes | None, corr: int = 1) -> Row:
    return {
        "run": "run-1", "connection_id": 3, "monotonic_ns": 10, "direction": direction,
        "api_key": key, "api_version": version, "correlation_id": corr,
        "frame_length": len(frame) if frame is not None else 0, "frame": frame,
    }  # fmt: skip


names = st.sampled_from(["a", "orders", "t-1", "verify.x", "tøpic", ""])
int32 = st.integers(-(2**31), 2**31 - 1)
int64 = st.integers(-(2**63), 2**63 - 1)


@st.composite
def record_blobs(draw: Any) -> bytes | None:
    """None, or 0-3 batches, maybe cut to headers (compacted) or with a partial tail."""
    if draw(st.integers(0, 5)) == 0:
        return None
    blob = b""
    for _ in range(draw(st.integers(0, 3))):
        batch = build_batch(
            [(None, b"v" * draw(st.integers(0, 30))) for _ in range(draw(st.integers(1, 3)))],
            base_timestamp=0,
            base_offset=draw(st.integers(0, 2**40)),
            producer_id=draw(st.sampled_from([-1, 0, 7, 2**40])),
            producer_epoch=draw(st.integers(-1, 5)),
            base_sequence=draw(st.sampled_from([-1, 0, 5, 2**31 - 1])),
        )
        batch[17:21] = draw(st.binary(min_size=4, max_size=4))  # any crc
        if draw(st.integers(0, 2)) == 0:  # compacted, as capture/compact.py does
            batch = batch[:61]
            batch[8:12] = (49).to_bytes(4, "big")
        elif draw(st.integers(0, 15)) == 0:  # a length below the minimum: split_batches raises
            batch[8:12] = draw(st.sampled_from([-1, 0, 48])).to_bytes(4, "big", signed=True)
        blob += bytes(batch)
    tail = draw(st.sampled_from([0, 0, 0, 5, 12, 40, 70]))
    if tail:
        batch = build_batch([(None, b"x" * 20)], base_timestamp=0)
        blob += bytes(batch[:tail])
    return blob


@st.composite
def produce_request(draw: Any, version: int) -> bytes:
    topics = []
    for _ in range(draw(st.integers(0, 3))):
        parts = [
            P.TopicProduceData.PartitionProduceData(index=draw(int32), records=draw(record_blobs()))
            for _ in range(draw(st.integers(0, 3)))
        ]
        topics.append(
            P.TopicProduceData(name=draw(names), topic_id=draw(st.uuids()),
                               partition_data=parts)
        )  # fmt: skip
    body = P(
        transactional_id=draw(st.sampled_from([None, "tx", "tx-é"])), acks=-1, timeout_ms=30000,
        topic_data=topics,
    )  # fmt: skip
    client = draw(st.sampled_from([None, "rdkafka", "clïent"]))
    return encode_request(0, version, draw(int32), client, body)[4:]


@st.composite
def produce_response(draw: Any, version: int) -> bytes:
    PPR = PR.TopicProduceResponse.PartitionProduceResponse
    topics = []
    for _ in range(draw(st.integers(0, 3))):
        parts = []
        for _ in range(draw(st.integers(0, 3))):
            part = PPR(
                index=draw(int32), error_code=draw(st.sampled_from([0, 0, 6, -1])),
                base_offset=draw(int64), log_append_time_ms=draw(int64),
                log_start_offset=draw(int64),
                error_message=draw(st.sampled_from([None, None, "bad", "ünicode"])),
            )  # fmt: skip
            if draw(st.integers(0, 6)) == 0:
                part.record_errors = [PPR.BatchIndexAndErrorMessage(batch_index=0)]
            if draw(st.integers(0, 6)) == 0:  # a tagged field (v10+)
                part.current_leader = PPR.LeaderIdAndEpoch(leader_id=1, leader_epoch=2)
            parts.append(part)
        topics.append(
            PR.TopicProduceResponse(name=draw(names), topic_id=draw(st.uuids()),
                                    partition_responses=parts)
        )  # fmt: skip
    body = PR(responses=topics, throttle_time_ms=draw(st.integers(0, 100)))
    return _join(encode_response(0, version, draw(int32), body))[4:]


@st.composite
def fetch_response(draw: Any, version: int) -> bytes:
    PD = F.FetchableTopicResponse.PartitionData
    topics = []
    for _ in range(draw(st.integers(0, 3))):
        parts = []
        for _ in range(draw(st.integers(0, 3))):
            aborted = draw(st.sampled_from([None, 0, 1, 2]))
            part = PD(
                partition_index=draw(int32), error_code=draw(st.sampled_from([0, 0, 0, 1])),
                high_watermark=draw(int64), last_stable_offset=draw(int64),
                log_start_offset=draw(int64), preferred_read_replica=draw(st.integers(-1, 3)),
                records=draw(record_blobs()),
                aborted_transactions=None if aborted is None else [
                    PD.AbortedTransaction(producer_id=i, first_offset=draw(int64))
                    for i in range(aborted)
                ],
            )  # fmt: skip
            if draw(st.integers(0, 8)) == 0:  # a tagged field (v12+)
                part.current_leader = PD.LeaderIdAndEpoch(leader_id=1, leader_epoch=2)
            parts.append(part)
        topics.append(
            F.FetchableTopicResponse(topic=draw(names), topic_id=draw(st.uuids()),
                                     partitions=parts)
        )  # fmt: skip
    body = F(throttle_time_ms=0, error_code=0, session_id=draw(int32), responses=topics)
    return _join(encode_response(1, version, draw(int32), body))[4:]


@st.composite
def fetch_request(draw: Any, version: int) -> bytes:
    body = m.FetchRequest(
        replica_id=-1, max_wait_ms=draw(int32), min_bytes=1, max_bytes=draw(int32),
        isolation_level=draw(st.sampled_from([0, 1])), topics=[],
    )  # fmt: skip
    client = draw(st.sampled_from([None, "rdkafka", "clïent"]))
    return encode_request(1, version, draw(int32), client, body)[4:]


def metadata_response(version: int) -> bytes:
    T = m.MetadataResponse.MetadataResponseTopic
    body = m.MetadataResponse(
        topics=[T(name="orders", topic_id=uuid.UUID(int=5)), T(name="x", topic_id=uuid.UUID(int=0))]
    )
    return _join(encode_response(3, version, 9, body))[4:]


@st.composite
def mangled(draw: Any, frame: bytes) -> tuple[bytes, int]:
    """(frame, frame_length): whole, cut short, a byte changed, or trailing bytes."""
    how = draw(st.sampled_from(["whole"] * 12 + ["cut", "cut-plain", "flip", "trail"]))
    if how == "cut" and frame:  # a prefix capture: frame_length says more
        return frame[: draw(st.integers(0, len(frame) - 1))], len(frame)
    if how == "cut-plain" and frame:  # cut, and frame_length agrees: an undecodable row
        cut = frame[: draw(st.integers(0, len(frame) - 1))]
        return cut, len(cut)
    if how == "flip" and frame:
        at = draw(st.integers(0, len(frame) - 1))
        value = draw(st.sampled_from([0, 0x7F, 0x80, 0xFF]))
        changed = frame[:at] + bytes([value]) + frame[at + 1 :]
        return changed, len(changed)
    if how == "trail":
        changed = frame + draw(st.binary(min_size=1, max_size=3))
        return changed, len(changed)
    return frame, len(frame)


KINDS = [
    *[("request", 0, v) for v in fd.PRODUCE_VERSIONS],
    *[("response", 0, v) for v in fd.PRODUCE_VERSIONS],
    *[("response", 1, v) for v in fd.FETCH_RESPONSE_VERSIONS],
]
FETCH_REQUESTS = [("request", 1, v) for v in fd.FETCH_REQUEST_VERSIONS]


@st.composite
def captures(draw: Any) -> list[Row]:
    """A batch of rows: a few (direction, key, version) groups of several frames each."""
    groups = draw(st.lists(st.sampled_from(KINDS + FETCH_REQUESTS), min_size=1, max_size=3))
    rows: list[Row] = []
    for direction, key, version in groups:
        for _ in range(draw(st.integers(1, 5))):
            if direction == "request" and key == 1:
                frame = draw(fetch_request(version))
            elif direction == "request":
                frame = draw(produce_request(version))
            elif key == 0:
                frame = draw(produce_response(version))
            else:
                frame = draw(fetch_response(version))
            frame, length = draw(mangled(frame))
            row = _row(direction, key, version, frame)
            row["frame_length"] = length
            row["connection_id"] = draw(st.integers(0, 3))
            rows.append(row)
    extra = draw(st.sampled_from(["none", "none", "metadata", "fetch-request", "null", "noise"]))
    if extra == "metadata":
        rows.append(_row("response", 3, draw(st.sampled_from([10, 12])), metadata_response(12)))
    elif extra == "fetch-request":
        rows.append(_row("request", 1, 12, b"\x00\x01\x00\x0c"))
    elif extra == "null":
        rows.append(_row("response", 0, 9, None))
    elif extra == "noise":
        direction, key, version = draw(st.sampled_from(KINDS))
        rows.append(_row(direction, key, version, draw(st.binary(max_size=40))))
    for row in draw(st.lists(st.sampled_from(rows), max_size=4)):
        # The same frame again with another correlation id (a periodic request, say).
        frame, at = row["frame"], 4 if row["direction"] == "request" else 0
        if frame is not None and len(frame) >= at + 4:
            corr = draw(int32)
            frame = frame[:at] + corr.to_bytes(4, "big", signed=True) + frame[at + 4 :]
            rows.append(
                dict(row, frame=frame, correlation_id=corr, connection_id=9, monotonic_ns=11)
            )
    return draw(st.permutations(rows))


# ------------------------------------------------------------------ the tests


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(captures())
def test_same_facts_as_the_reference(rows: list[Row]) -> None:
    _same_facts(rows)


@pytest.mark.parametrize(("direction", "key", "version"), KINDS)
def test_plain_frames_take_the_fast_path(direction: str, key: int, version: int) -> None:
    """Every supported version is decoded without the reference (so the equivalence
    above is not the reference compared with itself)."""
    batch = build_batch([(None, b"a"), (None, b"b")], base_offset=40, producer_id=9,
                        producer_epoch=1, base_sequence=3, base_timestamp=0)  # fmt: skip
    records = bytes(batch) * 2
    topic_id = uuid.UUID("12345678-9abc-def0-1234-56789abcdef0")
    if direction == "request":
        body = P(acks=1, timeout_ms=5, topic_data=[
            P.TopicProduceData(name="orders", topic_id=topic_id, partition_data=[
                P.TopicProduceData.PartitionProduceData(index=i, records=records)
                for i in range(3)])])  # fmt: skip
        frame = encode_request(0, version, 77, "client", body)[4:]
    elif key == 0:
        PPR = PR.TopicProduceResponse.PartitionProduceResponse
        acks = [PPR(index=i, base_offset=10 * i) for i in range(3)]
        body = PR(responses=[PR.TopicProduceResponse(
            name="orders", topic_id=topic_id, partition_responses=acks)])  # fmt: skip
        frame = _join(encode_response(0, version, 77, body))[4:]
    else:
        PD = F.FetchableTopicResponse.PartitionData
        body = F(responses=[F.FetchableTopicResponse(topic="orders", topic_id=topic_id,
                 partitions=[PD(partition_index=i, high_watermark=99, records=records,
                                aborted_transactions=[PD.AbortedTransaction(producer_id=1)])
                             for i in range(3)])])  # fmt: skip
        frame = _join(encode_response(1, version, 77, body))[4:]
    rows = [_row(direction, key, version, frame, corr=77) for _ in range(3)]
    # Without its last byte (the body's tagged fields or, in older versions, a field):
    # a prefix capture gives nothing, a whole frame of that length is undecodable.
    short = dict(rows[0], frame=frame[:-1])
    _same_facts([short, dict(short, frame_length=len(frame) - 1)])
    assert Counter(f[4] for f in _fast(_arrow([short]))) == {}
    assert Counter(f[4] for f in _fast(_arrow([dict(short, frame_length=len(frame) - 1)]))) == {
        "undecodable": 1
    }
    # Every prefix, as a prefix capture and as a whole (undecodable) frame.
    prefixes = [dict(rows[0], frame=frame[:k]) for k in range(len(frame))]
    _same_facts(prefixes + [dict(r, frame_length=len(r["frame"])) for r in prefixes])
    stats = _same_facts(rows)
    assert stats == {"rows": 3, "fast": 3, "reference": 0}
    facts = [f for b in decode_batches(iter([_arrow(rows)])) for f in b.to_pylist()]
    topic = f"id:{topic_id}" if version >= 13 else "orders"
    assert {f["topic"] for f in facts} == {topic}
    assert {f["corr"] for f in facts} == {77}
    kinds = Counter(f["kind"] for f in facts)
    if direction == "request":
        assert kinds == {"produce_batch": 3 * 3 * 2}
    elif key == 0:
        assert kinds == {"produce_ack": 3 * 3}
    else:
        assert kinds == {"fetch_part": 3 * 3, "fetch_batch": 3 * 3 * 2, "fetch_aborted": 3 * 3}
        assert {f["last_offset"] for f in facts if f["kind"] == "fetch_batch"} == {41}
        assert {f["producer_id"] for f in facts if f["kind"] == "fetch_aborted"} == {1}


def test_compacted_produce_requests_decode_like_whole_ones() -> None:
    """capture/compact.py cuts every batch to its header; frame_length stays the original."""
    records = b"".join(
        bytes(
            build_batch(
                [(None, b"v" * 50)] * n,
                producer_id=5,
                producer_epoch=0,
                base_sequence=n,
                base_timestamp=0,
            )
        )
        for n in (1, 3)
    )
    rows, compact_rows = [], []
    for version in (3, 9, 13):
        part = P.TopicProduceData.PartitionProduceData(index=0, records=records)
        body = P(acks=-1, timeout_ms=5, topic_data=[P.TopicProduceData(
            name="t", topic_id=uuid.UUID(int=1), partition_data=[part])])  # fmt: skip
        frame = encode_request(0, version, version, "c", body)[4:]
        compact = compact_produce_request(frame)
        assert len(compact) < len(frame)
        rows.append(_row("request", 0, version, frame, corr=version))
        compact_rows.append(dict(rows[-1], frame=compact))
    assert _same_facts(compact_rows)["reference"] == 0
    assert _fast(_arrow(compact_rows)) == _fast(_arrow(rows))
    assert sum(_fast(_arrow(rows)).values()) == 3 * 2


def test_compacted_fetch_responses_decode_like_whole_ones() -> None:
    """The tap compacts a Fetch response from its message, reading only batch headers;
    a batch may straddle two records parts, and a partial trailing batch is left out."""
    batches = [
        bytes(
            build_batch(
                [(None, b"v" * 50)] * n,
                producer_id=5,
                producer_epoch=0,
                base_sequence=n,
                base_timestamp=0,
            )
        )
        for n in (1, 3, 2)
    ]
    records = batches[0] + batches[1] + batches[2][:70]  # a fetch cut at its byte limit
    split = len(batches[0]) + 30  # inside the second batch's header

    def read(part: Any, position: int, n: int) -> bytes:
        return bytes(part[position : position + n])

    PD = F.FetchableTopicResponse.PartitionData
    rows, compact_rows = [], []
    for version in (4, 11, 12, 16):

        def response(value: Any) -> Any:
            part = PD(partition_index=0, high_watermark=9, records=value)
            topic = F.FetchableTopicResponse(
                topic="t", topic_id=uuid.UUID(int=1), partitions=[part, PD(partition_index=1)]
            )
            return F(throttle_time_ms=0, error_code=0, session_id=0, responses=[topic])

        frame = _join(encode_response(1, version, version, response(records)))[4:]
        chunks = RecordsChunks([records[:split], records[split:]])
        message = response(chunks)
        compact = compact_fetch_response(version, version, message, fetch_records(message), read)
        assert message.responses[0].partitions[0].records is chunks  # not changed
        assert len(compact) < len(frame)
        rows.append(_row("response", 1, version, frame, corr=version))
        compact_rows.append(dict(rows[-1], frame=compact))
    assert _same_facts(compact_rows)["reference"] == 0
    assert _fast(_arrow(compact_rows)) == _fast(_arrow(rows))
    facts = decode_rows({n: [row[n] for row in rows] for n in NEEDED_COLUMNS})
    assert facts["kind"].count("fetch_batch") == 4 * 2


def test_bench_capture_decodes_on_the_fast_path(tmp_path: Path) -> None:
    """A capture from bench/verify.py's generator: same facts, and no row falls back."""
    import pyarrow.parquet as pq

    spec = importlib.util.spec_from_file_location("bench_verify", ROOT / "bench" / "verify.py")
    assert spec is not None and spec.loader is not None
    bench_verify = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench_verify)
    written = bench_verify.write_capture(3000, tmp_path)
    table = pq.read_table(sorted(tmp_path.glob("*.parquet")))
    table = table.append_column("run", pa.array(["capture-b0-1"] * table.num_rows))
    batch = table.select(list(NEEDED_COLUMNS)).combine_chunks().to_batches()[0]
    assert batch.num_rows == written
    expected = _reference(batch)
    assert _fast(batch) == expected
    kinds = Counter(fact[4] for fact in expected.elements())
    assert kinds["produce_batch"] == kinds["produce_ack"] > 1000
    assert kinds["fetch_batch"] > 1000
    stats: dict[str, int] = {}
    decode_batch(batch, stats)
    # Spark may hand over large_string / large_binary columns (64-bit offsets).
    large = pa.schema(
        [
            (f.name, pa.large_binary() if f.name == "frame" else pa.large_string())
            if f.type in (pa.binary(), pa.string())
            else f
            for f in batch.schema
        ]
    )
    assert _fast(pa.Table.from_batches([batch]).cast(large).to_batches()[0]) == expected
    assert stats["reference"] == 0 and stats["fast"] == written


def test_rows_the_reference_must_decode() -> None:
    """Metadata responses, unknown versions and garbage go to the reference, row by row."""
    body = P(acks=1, timeout_ms=5, topic_data=[])
    rows = [
        _row("response", 3, 12, metadata_response(12)),
        _row("request", 0, 2, encode_request(0, 3, 1, None, body)[4:]),  # column says v2
        _row("request", 0, 9, b"\x00\x00\x00\x09garbage"),
        _row("response", 1, 12, b"\x00"),
        _row("response", 0, 9, None),
    ]
    stats = _same_facts(rows)
    assert stats == {"rows": 5, "fast": 0, "reference": 4, "copied": 0}
    kinds = Counter(fact[4] for fact in _reference(_arrow(rows)).elements())
    assert kinds == {"topic_id": 1, "undecodable": 2}


def _flexible_produce_request(count: bytes) -> bytes:
    """A Produce v9 request with no topics, its topic count encoded as given."""
    header = (0).to_bytes(2, "big") + (9).to_bytes(2, "big") + (7).to_bytes(4, "big")
    header += b"\xff\xff\x00"  # null client id, no tagged fields
    return header + b"\x00" + bytes(6) + count + b"\x00"


def test_varints_longer_than_five_bytes_are_the_references() -> None:
    """The codec refuses a 6-byte varint (a non-minimal count of 0 here): undecodable,
    while the same 0 in 1 or 5 bytes decodes (to no facts)."""
    rows = [
        _row("request", 0, 9, _flexible_produce_request(b"\x01")),
        _row("request", 0, 9, _flexible_produce_request(b"\x81\x80\x80\x80\x00")),
        _row("request", 0, 9, _flexible_produce_request(b"\x81\x80\x80\x80\x80\x00")),
    ]
    stats = _same_facts(rows)
    assert stats == {"rows": 3, "fast": 2, "reference": 1, "copied": 0}
    kinds = Counter(fact[4] for fact in _reference(_arrow(rows)).elements())
    assert kinds == {"undecodable": 1}


def test_a_record_count_overflowing_int32_fails_both_paths() -> None:
    """lastOffsetDelta = 2**31 - 1: the reference's record count does not fit the fact
    column and building the batch raises; the fast path must not wrap it silently."""
    batch = build_batch(
        [(None, b"v")], producer_id=1, producer_epoch=0, base_sequence=0, base_timestamp=0
    )
    batch[23:27] = (2**31 - 1).to_bytes(4, "big")
    body = P(acks=1, timeout_ms=5, topic_data=[P.TopicProduceData(name="t", partition_data=[
        P.TopicProduceData.PartitionProduceData(index=0, records=bytes(batch))])])  # fmt: skip
    frame = encode_request(0, 9, 1, "c", body)[4:]
    batch_rows = _arrow([_row("request", 0, 9, frame)])
    facts = decode_rows({n: batch_rows.column(n).to_pylist() for n in NEEDED_COLUMNS})
    assert facts["record_count"] == [2**31]
    with pytest.raises((OverflowError, pa.ArrowInvalid)):  # as decode_batches did before
        pa.RecordBatch.from_pydict(facts, schema=fact_schema())
    with pytest.raises((OverflowError, pa.ArrowInvalid)):
        _fast(batch_rows)


@pytest.mark.parametrize(("partitions", "batches"), [(40, 1), (1, 40), (3, 3)])
def test_a_few_long_arrays_go_to_the_reference(partitions: int, batches: int) -> None:
    """Walking 40 partitions (or batches) of two frames in lock-step costs more than the
    reference; such frames are handed to it (the short ones stay on the fast path)."""
    PD = F.FetchableTopicResponse.PartitionData
    records = bytes(build_batch([(None, b"x" * 10)], base_timestamp=0)) * batches
    body = F(responses=[F.FetchableTopicResponse(topic="t", partitions=[
        PD(partition_index=i, records=records) for i in range(partitions)])])  # fmt: skip
    frame = _join(encode_response(1, 12, 5, body))[4:]
    stats = _same_facts([_row("response", 1, 12, frame)] * 2)
    assert stats["reference"] == (0 if partitions == batches else 2)


@pytest.mark.parametrize("path", sorted((ROOT / "tests" / "golden").glob("*-produce-*.bin")))
def test_real_client_produce_requests(path: Path) -> None:
    """Produce requests as confluent-kafka, kafka-python and aiokafka sent them."""
    frame = path.read_bytes()[4:]
    version = int.from_bytes(frame[2:4], "big")
    stats = _same_facts([_row("request", 0, version, frame)])
    assert stats == {"rows": 1, "fast": 1, "reference": 0}
    kinds = Counter(fact[4] for fact in _fast(_arrow([_row("request", 0, version, frame)])))
    assert kinds["produce_batch"] >= 1


def test_invalid_utf8_and_mismatched_headers_go_to_the_reference() -> None:
    """Strings that are not UTF-8 (the codec refuses them), and request frames whose own
    header disagrees with their row (decode_request trusts the frame)."""
    records = bytes(
        build_batch(
            [(None, b"x")], producer_id=4, producer_epoch=0, base_sequence=0, base_timestamp=0
        )
    )
    body = P(acks=1, timeout_ms=5, topic_data=[P.TopicProduceData(name="tZ", partition_data=[
        P.TopicProduceData.PartitionProduceData(index=0, records=records)])])  # fmt: skip
    v3 = encode_request(0, 3, 1, "c", body)[4:]
    bad_name = v3.replace(b"tZ", b"t\xff")
    fetch_request = bytearray(v3)
    fetch_request[0:2] = (1).to_bytes(2, "big")  # the frame says Fetch
    PPR = PR.TopicProduceResponse.PartitionProduceResponse
    ack = _join(encode_response(0, 9, 1, PR(responses=[PR.TopicProduceResponse(
        name="tZ", partition_responses=[PPR(index=0)])])))[4:]  # fmt: skip
    # A v12 frame read as v13 would take the 15-byte name and its length for a topic id.
    body.topic_data[0].name = "fifteen-letters"
    v12 = encode_request(0, 12, 1, "c", body)[4:]
    rows = [
        _row("request", 0, 9, v3),  # the row says v9, the frame v3: decoded as v3
        _row("request", 0, 13, v12),
        _row("request", 0, 3, bad_name),
        _row("request", 0, 3, bytes(fetch_request)),
        _row("response", 0, 9, ack.replace(b"tZ", b"\xc3\x28")),
        _row("response", 0, 9, ack.replace(b"tZ", "é".encode())),  # valid UTF-8: decodes
    ]
    stats = _same_facts(rows)
    assert stats == {"rows": 6, "fast": 0, "reference": 6, "copied": 0}
    kinds = Counter(fact[4] for fact in _reference(_arrow(rows)).elements())
    assert kinds == {"produce_batch": 2, "undecodable": 3, "produce_ack": 1}


def _with_corr(row: Row, corr: int, conn: int) -> Row:
    at = 4 if row["direction"] == "request" else 0
    frame = row["frame"][:at] + corr.to_bytes(4, "big", signed=True) + row["frame"][at + 4 :]
    return dict(row, frame=frame, correlation_id=corr + 1, connection_id=conn, monotonic_ns=conn)


def test_repeated_frames_are_decoded_once_by_the_reference() -> None:
    """Rows the reference decodes and that repeat a frame but for its correlation id
    (Metadata refreshes, garbage) get that frame's facts with their own ids."""
    metadata = _row("response", 3, 12, metadata_response(12))
    garbage = _row("request", 0, 9, b"\x00\x00\x00\x09\x00\x00\x00\x01junk")
    cut = dict(_row("response", 3, 12, metadata_response(12)[:30]), frame_length=99)
    rows = [_with_corr(r, corr, conn) for r in (metadata, garbage, cut) for corr, conn in
            ((1, 1), (2, 2), (2, 3))]  # fmt: skip
    # Not copies: the frame is whole (undecodable, not a prefix); a byte after the id differs.
    tagged = metadata["frame"][:4] + b"\x01" + metadata["frame"][5:]
    others = [dict(rows[-1], frame_length=30), dict(rows[0], frame=tagged)]
    assert _same_facts(others + rows) == {"rows": 11, "fast": 0, "reference": 11, "copied": 6}
    stats = _same_facts(rows)
    assert stats == {"rows": 9, "fast": 0, "reference": 9, "copied": 6}
    facts = _fast(_arrow(rows))
    assert {(f[1], f[2]) for f in facts if f[4] == "topic_id"} == {(1, 1), (2, 2), (3, 2)}
    # An undecodable fact carries the row's correlation id, not the frame's.
    assert {(f[1], f[2]) for f in facts if f[4] == "undecodable"} == {(1, 2), (2, 3), (3, 3)}
    with_null = [*rows, dict(metadata, connection_id=None)]
    assert _same_facts(with_null)["copied"] == 0  # a null id anywhere: no copies


# ------------------------------------------------------------------ layouts vs the schema table

_FIXED_WIDTHS = {
    "bool": 1, "int8": 1, "int16": 2, "uint16": 2, "int32": 4, "uint32": 4, "int64": 8,
    "float64": 8, "uuid": 16,
}  # fmt: skip
#: An array whose entries the fast path does not walk (it accepts only empty ones).
NOT_WALKED = "not walked"


def _schema_layout(fields: tuple[Field, ...], version: int, flex: bool) -> list[Any]:
    """A version's wire layout from the schema table, with runs of fixed-width fields
    merged: ("fixed", width, names), ("array", nullable, entries), (type, nullable).
    Tagged fields are left out: the fast path takes only frames without any."""
    out: list[Any] = []
    for f in fields:
        if not f.present_in(version) or (flex and f.tagged_in(version)):
            continue
        if f.is_array:
            entries = _schema_layout(f.fields, version, flex) if f.fields else [f.type]
            out.append(("array", f.nullable_in(version), entries))
        elif f.fields is None and f.type in _FIXED_WIDTHS:
            if out and out[-1][0] == "fixed":
                _, width, names = out.pop()
                out.append(("fixed", width + _FIXED_WIDTHS[f.type], (*names, f.name)))
            else:
                out.append(("fixed", _FIXED_WIDTHS[f.type], (f.name,)))
        else:
            assert f.fields is None, f"{f.name}: a single struct; the fast path walks none"
            out.append((f.type, f.nullable_in(version)))
    return out


def _widths_only(layout: list[Any]) -> list[Any]:
    """The layout as the fast path sees it: fixed runs by width; unwalked entries hidden."""
    out: list[Any] = []
    for item in layout:
        if item[0] == "fixed":
            out.append(("fixed", item[1]))
        elif item[0] == "array":
            out.append(
                ("array", item[1], item[2] if item[2] == NOT_WALKED else _widths_only(item[2]))
            )
        else:
            out.append(item)
    return out


def _topic_key(api_key: int, version: int) -> tuple[Any, ...]:
    # By id: 16 bytes; by name: a non-null string (_Topics.read).
    return ("fixed", 16) if uses_topic_ids(api_key, version) else ("string", False)


def _walked_produce_request(version: int) -> list[Any]:
    partition = [("fixed", 4), ("records", True)]  # index, records (_records_field)
    topic = [_topic_key(0, version), ("array", False, partition)]
    return [("string", True), ("fixed", fd.PRODUCE_REQUEST_FIXED), ("array", False, topic)]


def _walked_produce_response(version: int) -> list[Any]:
    partition: list[Any] = [("fixed", fd.produce_ack_width(version))]
    if version >= fd.PRODUCE_RECORD_ERRORS_VERSION:
        partition += [("array", False, NOT_WALKED), ("string", True)]
    topic = [_topic_key(0, version), ("array", False, partition)]
    return [("array", False, topic), ("fixed", fd.PRODUCE_RESPONSE_TRAILER)]


def _walked_fetch_response(version: int) -> list[Any]:
    aborted = ("array", True, [("fixed", fd.ABORTED_TRANSACTION_SIZE)])
    after = fd.fetch_after_aborted_width(version)
    partition = [
        ("fixed", fd.fetch_partition_width(version)), aborted,
        *([("fixed", after)] if after else []), ("records", True),
    ]  # fmt: skip
    topic = [_topic_key(1, version), ("array", False, partition)]
    return [("fixed", fd.fetch_header_width(version)), ("array", False, topic)]


LAYOUTS = [
    ("ProduceRequest", fd.PRODUCE_VERSIONS, fd.PRODUCE_FIRST_FLEXIBLE, _walked_produce_request),
    ("ProduceResponse", fd.PRODUCE_VERSIONS, fd.PRODUCE_FIRST_FLEXIBLE, _walked_produce_response),
    ("FetchResponse", fd.FETCH_RESPONSE_VERSIONS, fd.FETCH_FIRST_FLEXIBLE, _walked_fetch_response),
]


@pytest.mark.parametrize(("name", "versions", "first_flexible", "walked"), LAYOUTS,
                         ids=[layout[0] for layout in LAYOUTS])  # fmt: skip
def test_layouts_match_the_schema_table(
    name: str, versions: range, first_flexible: int, walked: Any
) -> None:
    """fastdecode's hand-written walks agree with the schema table, version by version.

    A new version in the table fails here until fastdecode is taught it (until then it
    would go to the reference: right, but slow); a changed layout fails at its version.
    """
    schema = SCHEMAS[name]
    assert versions == range(schema.min_version, schema.max_version + 1)
    assert schema.first_flexible == first_flexible
    for version in versions:
        layout = _schema_layout(schema.fields, version, schema.is_flexible(version))
        partitions = _partitions(layout)
        if name == "ProduceResponse":  # record errors: only an empty array is accepted
            partitions[:] = [
                ("array", item[1], NOT_WALKED) if item[0] == "array" else item
                for item in partitions
            ]
        assert _widths_only(layout) == walked(version), f"{name} v{version}"
        # The fields the fast path reads out of a partition's fixed run, at its offsets.
        assert partitions[0][2][: len(READ[name])] == READ[name], f"{name} v{version}"


#: The leading fields of a partition entry that the fast path reads (by byte offset).
READ = {
    "ProduceRequest": ("Index",),
    "ProduceResponse": ("Index", "ErrorCode", "BaseOffset"),
    "FetchResponse": ("PartitionIndex", "ErrorCode", "HighWatermark", "LastStableOffset"),
}

_FIXED_WIDTH = {"int8": 1, "int16": 2, "int32": 4, "int64": 8}


@pytest.mark.parametrize("version", fd.FETCH_REQUEST_VERSIONS)
def test_fetch_request_prefix_matches_the_schema_table(version: int) -> None:
    """The bytes _fetch_requests skips before the isolation level: the body's untagged
    fixed-width fields that come before it, for every version it walks."""
    schema = SCHEMAS["FetchRequest"]
    assert range(4, schema.max_version + 1) == fd.FETCH_REQUEST_VERSIONS
    assert schema.first_flexible == fd.FETCH_FIRST_FLEXIBLE_REQUEST
    skipped = 0
    for field in schema.fields:
        if not field.present_in(version) or field.tagged_in(version):
            continue
        if field.name == "IsolationLevel":
            assert field.type == "int8"
            break
        assert not field.is_array and field.type in _FIXED_WIDTH, field.name
        skipped += _FIXED_WIDTH[field.type]
    else:
        raise AssertionError("no IsolationLevel")
    assert skipped == (12 if version >= fd.FETCH_NO_REPLICA_ID_VERSION else 16)


def _partitions(layout: list[Any]) -> list[Any]:
    """The entries of a partition: the array inside the (first) topic array's entries."""
    topics = next(item for item in layout if item[0] == "array")[2]
    result: list[Any] = next(item for item in topics if item[0] == "array")[2]
    return result
