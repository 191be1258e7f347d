"""Helpers for the verification tests: a capturing broker subprocess and capture corruptions."""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from tests.broker_fork import start_broker
from trio_broker.protocol import message_types as messages
from trio_broker.protocol.messages import (
    decode_request,
    decode_response,
    encode_request,
    encode_response,
)
from trio_broker.protocol.records import RecordBatchView, split_batches

BROKER_EXE = Path(sys.executable).with_name("trio-broker")
LISTENING = re.compile(r"listening on (\S+):(\d+)")
METRICS = re.compile(r"metrics on (\S+):(\d+)")
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 60.0
#: tcpdump stop: wait for the pcap to stop growing for SETTLE_QUIET_S (at most SETTLE_TIMEOUT_S).
SETTLE_QUIET_S = 1.5
SETTLE_TIMEOUT_S = 10.0


class CapturingBroker:
    """``trio-broker serve --capture DIR`` on an ephemeral port (stopped with SIGTERM)."""

    def __init__(self, data_dir: Path, capture_dir: Path, extra: list[str] | None = None) -> None:
        self.log_path = data_dir.parent / "broker.log"
        argv = [
            str(BROKER_EXE), "serve", "--listen", "127.0.0.1:0", "--data-dir", str(data_dir),
            "--capture", str(capture_dir), *(extra or []),
        ]  # fmt: skip
        self.proc = start_broker(argv)  # forked: tests/broker_fork.py
        self.port = 0
        #: The --metrics-listen port, once the broker logged it (0 without the flag).
        self.metrics_port = 0
        listening = threading.Event()
        self._drainer = threading.Thread(target=self._drain, args=(listening,), daemon=True)
        self._drainer.start()
        try:
            if not listening.wait(START_TIMEOUT_S) or not self.port:
                raise AssertionError(f"broker did not start:\n{self.log()}")
        except BaseException:  # that too, or an interrupted wait: no broker left behind
            self._kill()
            raise

    def _kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(STOP_TIMEOUT_S)

    def _drain(self, listening: threading.Event) -> None:
        assert self.proc.stderr is not None
        with open(self.log_path, "ab") as out:
            for raw in iter(self.proc.stderr.readline, b""):
                out.write(raw)
                out.flush()
                metrics = METRICS.search(raw.decode(errors="replace"))
                if metrics:
                    self.metrics_port = int(metrics.group(2))
                match = LISTENING.search(raw.decode(errors="replace"))
                if match and not listening.is_set():
                    self.port = int(match.group(2))
                    listening.set()
        listening.set()

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self._kill()
            raise AssertionError(f"broker did not stop on SIGTERM:\n{self.log()}") from None
        except BaseException:  # an interrupted wait
            self._kill()
            raise
        self._drainer.join(STOP_TIMEOUT_S)
        return code


# --------------------------------------------------------------------------- corruptions

#: Rewrites one fetch partition's batches (list of writable views); returns the new list.
BatchEdit = Callable[[list[RecordBatchView]], list[RecordBatchView] | None]


def read_capture(capture_dir: Path) -> pa.Table:
    return pa.concat_tables(pq.read_table(p) for p in sorted(capture_dir.glob("*.parquet")))


def rewrite_fetches(source: Path, target: Path, edits: dict[str, tuple[BatchEdit, bool]]) -> int:
    """Copy a capture, editing fetch response partitions; returns how many responses changed.

    ``edits`` maps a topic name to (edit, once): a ``once`` edit changes only the first
    response partition it applies to, the others every one.
    """
    table = read_capture(source)
    frames = table.column("frame").to_pylist()
    directions = table.column("direction").to_pylist()
    keys = table.column("api_key").to_pylist()
    versions = table.column("api_version").to_pylist()
    done: set[str] = set()
    changed = 0
    for i, frame in enumerate(frames):
        if directions[i] != "response" or keys[i] != 1:
            continue
        corr, body = decode_response(1, versions[i], frame)
        touched = False
        for topic in body.responses:
            name = topic.topic or str(topic.topic_id)
            if name not in edits or name in done:
                continue
            edit, once = edits[name]
            for part in topic.partitions:
                if part.records is None or len(part.records) == 0:
                    continue
                batches, _ = split_batches(bytearray(bytes(part.records)))
                new = edit(batches)
                if new is None:
                    continue
                part.records = b"".join(bytes(b.buf[: b.size_in_bytes]) for b in new)
                touched = True
                if once:
                    done.add(name)
                    break
        if touched:
            parts = encode_response(1, versions[i], corr, body)
            frames[i] = b"".join(bytes(p) for p in parts)[4:]
            changed += 1
    target.mkdir(parents=True, exist_ok=True)
    lengths = pa.array([len(f) for f in frames], pa.int64())
    out = table.set_column(
        table.schema.get_field_index("frame"), "frame", pa.array(frames, pa.binary())
    )
    out = out.set_column(out.schema.get_field_index("frame_length"), "frame_length", lengths)
    pq.write_table(out, target / "capture-b0-1-000000.parquet")
    return changed


def drop_batch(crc: int) -> BatchEdit:
    def edit(batches: list[RecordBatchView]) -> list[RecordBatchView] | None:
        kept = [b for b in batches if b.crc != crc]
        return kept if len(kept) != len(batches) else None

    return edit


def drop_and_duplicate(crc: int) -> BatchEdit:
    """Drop the batch with ``crc`` (everywhere) and, once, append a copy of the first batch."""
    dropped = drop_batch(crc)
    duplicated = False

    def edit(batches: list[RecordBatchView]) -> list[RecordBatchView] | None:
        nonlocal duplicated
        new = dropped(batches)
        if not duplicated:
            again = duplicate_first_batch(new if new is not None else batches)
            if again is not None:
                duplicated = True
                return again
        return new

    return edit


def duplicate_first_batch(batches: list[RecordBatchView]) -> list[RecordBatchView] | None:
    """Append a copy of the first batch right after the last one (a new offset)."""
    if len(batches) < 2:
        return None
    copy = RecordBatchView(memoryview(bytearray(bytes(batches[0].buf[: batches[0].size_in_bytes]))))
    copy.set_base_offset(batches[-1].last_offset + 1)
    return [*batches, copy]


def swap_first_two(batches: list[RecordBatchView]) -> list[RecordBatchView] | None:
    """Exchange the offsets of the first two batches, leaving them in place (a reorder)."""
    if len(batches) < 2:
        return None
    a, b = batches[0], batches[1]
    offset_a, offset_b = a.base_offset, b.base_offset
    a.set_base_offset(offset_b)
    b.set_base_offset(offset_a)
    return batches


def first_multi_batch_crc(capture_dir: Path, topic_name: str) -> int:
    """The CRC of the second batch in the first fetch of ``topic_name`` holding >= 3 batches."""
    table = read_capture(capture_dir)
    for row in table.to_pylist():
        if row["direction"] != "response" or row["api_key"] != 1:
            continue
        _, body = decode_response(1, row["api_version"], row["frame"])
        for topic in body.responses:
            if (topic.topic or str(topic.topic_id)) != topic_name:
                continue
            for part in topic.partitions:
                if part.records is None:
                    continue
                batches, _ = split_batches(part.records)
                if len(batches) >= 3:
                    return batches[1].crc
    raise AssertionError("no fetch response with three batches in the capture")


def kinds(report: dict[str, Any], check: str) -> set[str]:
    return set(report["checks"][check]["by_kind"])


# --------------------------------------------------------------------------- tcpdump


class Tcpdump:
    """``tcpdump -i lo`` writing a classic pcap of one TCP port (stopped with SIGINT)."""

    def __init__(self, port: int, path: Path) -> None:
        self.path = path
        exe = shutil.which("tcpdump")
        if exe is None:
            raise RuntimeError("tcpdump is not installed (scripts/install-system-deps.sh)")
        self.proc = subprocess.Popen(
            [exe, "-i", "lo", "-U", "-s", "0", "-Z", "root", "-w", str(path), f"tcp port {port}"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            start_new_session=True,
        )  # fmt: skip
        self.stderr: list[str] = []
        ready = threading.Event()
        self._drainer = threading.Thread(target=self._drain, args=(ready,), daemon=True)
        self._drainer.start()
        if not ready.wait(START_TIMEOUT_S) or self.proc.poll() is not None:
            self.stop()
            raise RuntimeError("tcpdump could not capture: " + " ".join(self.stderr)[-500:])

    def _drain(self, ready: threading.Event) -> None:
        assert self.proc.stderr is not None
        for raw in iter(self.proc.stderr.readline, b""):
            line = raw.decode(errors="replace").strip()
            self.stderr.append(line)
            if "listening on" in line:
                ready.set()
        ready.set()

    def stop(self) -> None:
        # SIGINT drops what tcpdump has not read from the kernel yet: first wait (bounded)
        # until the file has stopped growing for a while.
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        size, stable_since = -1, time.monotonic()
        while self.proc.poll() is None and time.monotonic() < deadline:
            now_size = self.path.stat().st_size if self.path.exists() else 0
            if now_size != size:
                size, stable_since = now_size, time.monotonic()
            elif time.monotonic() - stable_since >= SETTLE_QUIET_S:
                break
            time.sleep(0.1)
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(STOP_TIMEOUT_S)
        self._drainer.join(STOP_TIMEOUT_S)


# --------------------------------------------------------------------------- row-level corruptions
# Each takes and returns the capture as a list of row dicts (pyarrow's to_pylist()).

Row = dict[str, Any]


def write_rows(rows: list[Row], target: Path) -> None:
    """Replace the capture in ``target`` with ``rows`` (one file, one run)."""
    from trio_broker.capture.schema import arrow_schema

    for old in target.glob("*.parquet"):
        old.unlink()
    target.mkdir(parents=True, exist_ok=True)
    for row in rows:
        row["frame_length"] = len(row["frame"])
    pq.write_table(
        pa.Table.from_pylist(rows, schema=arrow_schema()), target / "capture-b0-1-000000.parquet"
    )


def _pair(rows: list[Row], request: Row) -> Row:
    """The response row of ``request`` (same connection and correlation id)."""
    for row in rows:
        if (
            row["direction"] == "response"
            and row["connection_id"] == request["connection_id"]
            and row["correlation_id"] == request["correlation_id"]
        ):
            return row
    raise AssertionError(f"no response to {request['api_key']}/{request['correlation_id']}")


def _requests(rows: list[Row], api_key: int) -> list[tuple[Row, Any]]:
    out = []
    for row in rows:
        if row["direction"] == "request" and row["api_key"] == api_key:
            out.append((row, decode_request(row["frame"])[1]))
    return out


def _reencode(row: Row, body: Any, corr: int | None = None) -> Row:
    header, _ = decode_request(row["frame"])
    corr = header.correlation_id if corr is None else corr
    frame = encode_request(header.api_key, header.api_version, corr, header.client_id, body)[4:]
    return {**row, "frame": frame, "correlation_id": corr}


def drop_idempotent_batch(rows: list[Row], topic: str, sequence: int) -> list[Row]:
    """Remove the Produce request (and its response) carrying ``sequence`` for ``topic``:
    acknowledged sequences then have a gap."""
    for row, body in _requests(rows, 0):
        for t in body.topic_data:
            if t.name != topic:
                continue
            for part in t.partition_data:
                batches, _ = split_batches(part.records)
                if any(b.base_sequence == sequence for b in batches):
                    response = _pair(rows, row)
                    return [r for r in rows if r is not row and r is not response]
    raise AssertionError(f"no produce request with sequence {sequence} on {topic}")


def _later(rows: list[Row], row: Row, nanos: int) -> Row:
    last = max(r["monotonic_ns"] for r in rows)
    return {**row, "monotonic_ns": last + nanos, "wall_ns": row["wall_ns"] + nanos}


def offset_fetch_stale(rows: list[Row], older: int = 5) -> list[Row]:
    """Append, after everything, accepted commits of ``older`` and then of the offset the
    capture's first accepted commit had, and an OffsetFetch answering ``older`` for that
    commit's first partition: an offset the later accepted commit had replaced (as a
    coordinator with a stale table would answer)."""
    row, body = _requests(rows, 8)[0]
    topic = body.topics[0]
    part = topic.partitions[0]
    latest = part.committed_offset
    assert latest != older, "pick another planted offset"
    rows = recommit(recommit(rows, older), latest)
    return [*rows, *offset_fetch_exchange(rows, row, body.group_id, topic.name,
                                          part.partition_index, older)]  # fmt: skip


def fetch_last_commit(rows: list[Row]) -> list[Row]:
    """Append an OffsetFetch exchange answering, for the first partition of the capture's
    last OffsetCommit request, that request's offset: correct whatever came before."""
    row, body = _requests(rows, 8)[-1]
    topic = body.topics[0]
    part = topic.partitions[0]
    return [*rows, *offset_fetch_exchange(rows, row, body.group_id, topic.name,
                                          part.partition_index, part.committed_offset)]  # fmt: skip


def offset_fetch_exchange(
    rows: list[Row], template: Row, group_id: str, topic: str, partition: int, offset: int
) -> list[Row]:
    """An OffsetFetch v7 request and its answer (``offset`` for ``topic``-``partition``)
    on a new connection, after every row of the capture."""
    version = 7
    request_type, response_type = messages.OffsetFetchRequest, messages.OffsetFetchResponse
    request = request_type(
        group_id=group_id,
        topics=[request_type.OffsetFetchRequestTopic(name=topic, partition_indexes=[partition])],
        require_stable=False,
    )
    answer = response_type(
        topics=[
            response_type.OffsetFetchResponseTopic(
                name=topic,
                partitions=[
                    response_type.OffsetFetchResponseTopic.OffsetFetchResponsePartition(
                        partition_index=partition,
                        committed_offset=offset,
                        committed_leader_epoch=-1,
                        metadata="",
                        error_code=0,
                    )
                ],
            )
        ],
    )
    corr = max(r["correlation_id"] for r in rows) + 1000
    connection = max(r["connection_id"] for r in rows) + 2
    request_frame = encode_request(9, version, corr, "planted", request)[4:]
    response_frame = b"".join(bytes(p) for p in encode_response(9, version, corr, answer))[4:]
    base = {**template, "connection_id": connection, "api_key": 9, "api_version": version,
            "correlation_id": corr}  # fmt: skip
    return [
        _later(rows, {**base, "direction": "request", "frame": request_frame}, 1000),
        _later(rows, {**base, "direction": "response", "frame": response_frame}, 2000),
    ]


def recommit(rows: list[Row], offset: int) -> list[Row]:
    """Append, after everything, a copy of an accepted offset commit (same group,
    generation and member) with every partition's offset set to ``offset``, and its
    answer (accepted)."""
    for row, body in _requests(rows, 8):
        parts = [p for t in body.topics for p in t.partitions if p.committed_offset > 0]
        if not parts or body.generation_id_or_member_epoch < 0:
            continue
        response = _pair(rows, row)
        for part in parts:
            part.committed_offset = offset
        corr = max(r["correlation_id"] for r in rows) + 1000
        request = _later(rows, _reencode(row, body, corr), 1000)
        answer = _later(rows, {**response, "correlation_id": corr}, 2000)
        answer["frame"] = corr.to_bytes(4, "big") + response["frame"][4:]
        return [*rows, request, answer]
    raise AssertionError("no accepted offset commit in the capture")


def commit_backwards(rows: list[Row]) -> list[Row]:
    """An accepted commit going back to offset 0 within its generation (:func:`recommit`),
    which Kafka allows (a client may commit any offset) and verify must not flag."""
    return recommit(rows, 0)


def assign_twice(rows: list[Row]) -> list[Row]:
    """Copy a SyncGroup exchange that carried an assignment onto a new connection, for a
    made-up member of the same generation: its partitions are then assigned twice."""
    for row, body in _requests(rows, 14):
        response = _pair(rows, row)
        if len(response["frame"]) <= 16:  # no assignment bytes
            continue
        body.member_id = "intruder-" + body.member_id
        connection = max(r["connection_id"] for r in rows) + 1
        request = {**_reencode(row, body), "connection_id": connection}
        return [*rows, request, {**response, "connection_id": connection}]
    raise AssertionError("no SyncGroup exchange in the capture")


def high_watermark_backwards(rows: list[Row], topic: str) -> list[Row]:
    """Append, after everything, a copy of the last fetch exchange naming ``topic``, without
    records and with that topic's high watermark lowered to 1: a later fetch going back."""
    fetches = [r for r in rows if r["direction"] == "response" and r["api_key"] == 1]
    for row in sorted(fetches, key=lambda r: r["monotonic_ns"], reverse=True):
        corr, body = decode_response(1, row["api_version"], row["frame"])
        lowered = False
        for t in body.responses:
            for part in t.partitions:
                part.records = b""
                if (t.topic or str(t.topic_id)) == topic and part.high_watermark > 1:
                    part.high_watermark = 1
                    lowered = True
        if not lowered:
            continue
        request = next(
            r for r in rows
            if r["direction"] == "request" and r["connection_id"] == row["connection_id"]
            and r["correlation_id"] == corr
        )  # fmt: skip
        new_corr = max(r["correlation_id"] for r in rows) + 2000
        parts = encode_response(1, row["api_version"], new_corr, body)
        answer = _later(rows, {**row, "correlation_id": new_corr}, 4000)
        answer["frame"] = b"".join(bytes(p) for p in parts)[4:]
        again = _later(rows, {**request, "correlation_id": new_corr}, 3000)
        frame = bytearray(request["frame"])
        frame[4:8] = new_corr.to_bytes(4, "big")  # the request header's correlation id
        again["frame"] = bytes(frame)
        return [*rows, again, answer]
    raise AssertionError(f"no fetch response for {topic}")
