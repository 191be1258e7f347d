"""Unit tests of the capture tap and the pcap importer (no broker, no Spark)."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import attrs
import pytest

pytest.importorskip("pyarrow", reason="the verify extra (pyarrow) is not installed")

from tests.verify.helpers import read_capture
from trio_broker.capture.pcap import import_pcap
from trio_broker.capture.tap import CaptureTap
from trio_broker.protocol.codec import RecordsChunks
from trio_broker.protocol.messages import (
    FetchResponse,
    RequestHeader,
    decode_response,
    encode_response,
)
from trio_broker.protocol.records import build_batch, split_batches
from trio_broker.storage.log import FileRegion

CLIENT, SERVER = bytes([10, 0, 0, 1]), bytes([10, 0, 0, 2])


@attrs.define
class Region:
    fd: int
    position: int
    length: int


def _request(api_key: int, version: int, corr: int, body: bytes) -> bytes:
    frame = struct.pack(">hhih", api_key, version, corr, 3) + b"cid" + body
    return struct.pack(">i", len(frame)) + frame


def _response(corr: int, body: bytes) -> bytes:
    return struct.pack(">ii", 4 + len(body), corr) + body


async def test_tap_drops_when_full_and_redacts_sasl(tmp_path: Path) -> None:
    tap = CaptureTap(tmp_path, 3, max_rows=2)
    for corr in range(4):
        header = RequestHeader(36 if corr == 0 else 3, 1, corr, "c")
        tap.request(
            1, "127.0.0.1:5", header, bytearray(_request(header.api_key, 1, corr, b"secret")[4:])
        )
    assert (tap.captured, tap.dropped) == (2, 2)
    tap.close()
    rows = read_capture(tmp_path).to_pylist()
    assert [r["correlation_id"] for r in rows] == [0, 1]
    assert rows[0]["frame"] == _request(36, 1, 0, b"")[4:12]  # SASL: ids only
    assert rows[0]["frame_length"] > len(rows[0]["frame"])
    assert rows[1]["frame"].endswith(b"secret") and rows[1]["broker_id"] == 3


async def test_tap_reads_file_regions_in_the_writer(tmp_path: Path) -> None:
    log = tmp_path / "log"
    log.write_bytes(b"xxxxRECORDSyyyy")
    fd = os.open(log, os.O_RDONLY)
    tap = CaptureTap(tmp_path / "cap", 0)
    head = struct.pack(">ii", 4 + 3 + 7, 9) + b"abc"
    parts = [bytearray(head), Region(fd, 4, 7)]
    tap.sent(tap.stage_response(2, "h:1", RequestHeader(1, 12, 9, None), 12, parts))
    os.close(fd)  # the tap holds its own descriptor until the writer has read the region
    tap.close()
    (row,) = read_capture(tmp_path / "cap").to_pylist()
    assert row["direction"] == "response" and row["api_version"] == 12
    assert row["frame"] == struct.pack(">i", 9) + b"abcRECORDS"
    assert row["frame_length"] == len(row["frame"])


@pytest.mark.parametrize("full_records", [False, True])
async def test_tap_keeps_fetch_batch_headers_only(tmp_path: Path, full_records: bool) -> None:
    """By default a Fetch response is captured as batch headers, read from the log through
    the tap's own descriptor; ``--capture-records full`` keeps it whole."""
    batches = [
        bytes(build_batch([(None, b"r" * 300)] * n, base_offset=n, base_timestamp=0))
        for n in (1, 4)
    ]
    log = tmp_path / "log"
    log.write_bytes(b"pad" + b"".join(batches))
    fd = os.open(log, os.O_RDONLY)
    PD = FetchResponse.FetchableTopicResponse.PartitionData
    region = FileRegion(fd, 3, sum(map(len, batches)))
    part = PD(partition_index=0, high_watermark=5, records=RecordsChunks([region]))
    topic = FetchResponse.FetchableTopicResponse(topic="t", partitions=[part])
    message = FetchResponse(throttle_time_ms=0, error_code=0, session_id=0, responses=[topic])
    parts = encode_response(1, 11, 9, message)
    whole = b"".join(region.read_bytes() if p is region else bytes(p) for p in parts)[4:]
    tap = CaptureTap(tmp_path / "cap", 0, full_records=full_records)
    tap.sent(tap.stage_response(2, "h:1", RequestHeader(1, 11, 9, None), 11, parts, message))
    os.close(fd)  # the tap holds its own descriptor until the writer has read the headers
    tap.close()
    (row,) = read_capture(tmp_path / "cap").to_pylist()
    assert row["frame_length"] == len(whole)
    if full_records:
        assert row["frame"] == whole
        return
    assert part.records.parts == [region]  # the broker's message is left alone
    _, compact = decode_response(1, 11, row["frame"])
    (got,) = compact.responses[0].partitions
    views, tail = split_batches(got.records)
    assert not tail.nbytes and len(row["frame"]) < len(whole) - 1000
    assert [(v.base_offset, v.crc, v.record_count) for v in views] == [
        (v.base_offset, v.crc, v.record_count) for v in split_batches(b"".join(batches))[0]
    ]


def _tcp(
    src: bytes, dst: bytes, sport: int, dport: int, seq: int, flags: int, data: bytes
) -> bytes:
    tcp = struct.pack(">HHIIBBHHH", sport, dport, seq, 0, 5 << 4, flags, 65535, 0, 0) + data
    ip = struct.pack(">BBHHHBBH4s4s", 0x45, 0, 20 + len(tcp), 0, 0x4000, 64, 6, 0, src, dst)
    return ip + tcp


def _pcap(path: Path, linktype: int, packets: list[bytes]) -> None:
    out = bytearray(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, linktype))
    for i, ip in enumerate(packets):
        if linktype == 1:
            frame = b"\0" * 12 + b"\x08\x00" + ip
        else:  # Linux cooked (SLL)
            frame = b"\0" * 14 + b"\x08\x00" + ip
        out += struct.pack("<IIII", 1000 + i, 0, len(frame), len(frame)) + frame
    path.write_bytes(bytes(out))


@pytest.mark.parametrize("linktype", [1, 113])
def test_pcap_reassembles_reordered_and_retransmitted_segments(
    tmp_path: Path, linktype: int
) -> None:
    req1 = _request(3, 4, 7, b"\x00\x00\x00\x00")
    req2 = _request(18, 0, 8, b"")
    resp1, resp2 = _response(7, b"metadata!"), _response(8, b"versions")
    c, s = 40000, 9092
    isn, sisn = 1000, 5000
    stream = req1 + req2
    a, b = stream[:5], stream[5:]
    packets = [
        _tcp(CLIENT, SERVER, c, s, isn, 0x02, b""),  # SYN
        _tcp(SERVER, CLIENT, s, c, sisn, 0x12, b""),  # SYN+ACK
        _tcp(CLIENT, SERVER, c, s, isn + 1 + len(a), 0x18, b),  # arrives first
        _tcp(CLIENT, SERVER, c, s, isn + 1, 0x18, a),
        _tcp(CLIENT, SERVER, c, s, isn + 1, 0x18, a),  # retransmitted
        _tcp(SERVER, CLIENT, s, c, sisn + 1, 0x18, resp1 + resp2[:3]),
        _tcp(SERVER, CLIENT, s, c, sisn + 1 + len(resp1) + 3, 0x18, resp2[3:]),
        _tcp(CLIENT, SERVER, 1, 2, 1, 0x18, b"not kafka"),  # another port
    ]
    _pcap(tmp_path / "t.pcap", linktype, packets)
    summary = import_pcap(tmp_path / "t.pcap", {s}, tmp_path / "out", broker_id=4)
    assert (summary.requests, summary.responses, summary.unpaired_responses) == (2, 2, 0)
    rows = read_capture(tmp_path / "out").to_pylist()
    got = [
        (r["direction"], r["api_key"], r["api_version"], r["correlation_id"], r["frame"])
        for r in rows
    ]
    assert got == [
        ("request", 3, 4, 7, req1[4:]),
        ("request", 18, 0, 8, req2[4:]),
        ("response", 3, 4, 7, resp1[4:]),
        ("response", 18, 0, 8, resp2[4:]),
    ]
    assert {r["client_address"] for r in rows} == {"10.0.0.1:40000"}
    assert {r["client_id"] for r in rows} == {"cid"} and {r["broker_id"] for r in rows} == {4}
    assert rows[0]["wall_ns"] == 1003 * 10**9  # the packet with the request's first byte


def test_capture_import_cli(tmp_path: Path) -> None:
    from trio_broker.cli import main

    req = _request(18, 0, 1, b"")
    packets = [
        _tcp(CLIENT, SERVER, 40001, 9092, 10, 0x02, b""),
        _tcp(CLIENT, SERVER, 40001, 9092, 11, 0x18, req),
        _tcp(SERVER, CLIENT, 9092, 40001, 20, 0x18, _response(1, b"ok")),
    ]
    _pcap(tmp_path / "t.pcap", 1, packets)
    out = tmp_path / "out"
    assert (
        main(["capture", "import", str(tmp_path / "t.pcap"), "--port", "9092", "--out", str(out)])
        == 0
    )
    assert read_capture(out).num_rows == 2
    assert (
        main(["capture", "import", str(tmp_path / "t.pcap"), "--port", "1", "--out", str(out)]) == 1
    )
    (tmp_path / "bad.pcap").write_bytes(b"\x0a\x0d\x0d\x0a" + b"\0" * 40)  # pcapng
    assert (
        main(["capture", "import", str(tmp_path / "bad.pcap"), "--port", "1", "--out", str(out)])
        == 2
    )
