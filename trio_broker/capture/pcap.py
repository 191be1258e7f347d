"""``trio-broker capture import``: a tcpdump capture to capture Parquet rows.

Reads classic libpcap files (micro- or nanosecond timestamps, either byte
order) with Ethernet, Linux cooked (SLL, SLL2), BSD loopback or raw IP link
layers; IPv4 and IPv6 (without extension headers) carrying TCP. Each TCP
connection to one of the Kafka ports is reassembled per direction by sequence
number (retransmissions and reordering are handled; a gap that never fills
ends that direction), cut into Kafka frames, and responses are paired with
their requests by correlation id — the request's API key and version are
written on the response row, which is what decoding it needs.

A request row's timestamps are those of the packet carrying the frame's first
byte, a response row's those of the packet carrying its last byte: the broker's
work lies between the two.
"""

from __future__ import annotations

import ipaddress
import logging
import struct
from collections.abc import Iterator
from pathlib import Path

import attrs

from trio_broker.capture.schema import REQUEST, RESPONSE, CaptureRow, redact
from trio_broker.capture.writer import ParquetRotator

log = logging.getLogger("trio_broker.capture.pcap")

#: Frames larger than this mean the stream is not (or no longer) Kafka framing.
MAX_FRAME = 512 * 1024 * 1024
ROWS_PER_FILE = 50_000

LINKTYPE_NULL = 0
LINKTYPE_ETHERNET = 1
LINKTYPE_RAW = (12, 14, 101)
LINKTYPE_LOOP = 108
LINKTYPE_LINUX_SLL = 113
LINKTYPE_LINUX_SLL2 = 276

TCP_FIN, TCP_SYN, TCP_RST = 0x01, 0x02, 0x04


class PcapError(ValueError):
    """Not a pcap file this importer reads."""


@attrs.define
class Packet:
    ts_ns: int
    src: str
    dst: str
    sport: int
    dport: int
    seq: int
    flags: int
    payload: bytes


def read_packets(path: Path) -> Iterator[Packet]:
    """TCP segments of a classic pcap file, in file order."""
    with open(path, "rb") as f:
        header = f.read(24)
        if len(header) < 24:
            raise PcapError(f"{path}: too short for a pcap header")
        magic = header[:4]
        formats = {
            b"\xd4\xc3\xb2\xa1": ("<", 1000), b"\xa1\xb2\xc3\xd4": (">", 1000),
            b"\x4d\x3c\xb2\xa1": ("<", 1), b"\xa1\xb2\x3c\x4d": (">", 1),
        }  # fmt: skip
        if magic not in formats:
            if magic == b"\x0a\x0d\x0d\x0a":
                raise PcapError(
                    f"{path}: pcapng; write classic pcap (tcpdump -w, or editcap -F pcap)"
                )
            raise PcapError(f"{path}: not a pcap file (magic {magic.hex()})")
        order, frac_ns = formats[magic]
        linktype = struct.unpack(order + "I", header[20:24])[0] & 0x0FFFFFFF
        record = struct.Struct(order + "IIII")
        while True:
            head = f.read(16)
            if len(head) < 16:
                return
            sec, frac, incl, _orig = record.unpack(head)
            data = f.read(incl)
            if len(data) < incl:
                return  # a capture cut mid-packet
            packet = _parse_link(linktype, data, sec * 1_000_000_000 + frac * frac_ns)
            if packet is not None:
                yield packet


def _parse_link(linktype: int, data: bytes, ts_ns: int) -> Packet | None:
    if linktype == LINKTYPE_ETHERNET:
        if len(data) < 14:
            return None
        ethertype, pos = struct.unpack_from(">H", data, 12)[0], 14
        while ethertype in (0x8100, 0x88A8) and len(data) >= pos + 4:  # VLAN tags
            ethertype, pos = struct.unpack_from(">H", data, pos + 2)[0], pos + 4
    elif linktype == LINKTYPE_LINUX_SLL:
        if len(data) < 16:
            return None
        ethertype, pos = struct.unpack_from(">H", data, 14)[0], 16
    elif linktype == LINKTYPE_LINUX_SLL2:
        if len(data) < 20:
            return None
        ethertype, pos = struct.unpack_from(">H", data, 0)[0], 20
    elif linktype in (LINKTYPE_NULL, LINKTYPE_LOOP):
        if len(data) < 4:
            return None
        family = struct.unpack_from("<I" if linktype == LINKTYPE_NULL else ">I", data, 0)[0]
        if linktype == LINKTYPE_NULL and family > 0xFFFF:
            family = struct.unpack_from(">I", data, 0)[0]  # written on a big-endian host
        ethertype = 0x0800 if family == 2 else 0x86DD if family in (10, 24, 28, 30) else 0
        pos = 4
    elif linktype in LINKTYPE_RAW:
        if not data:
            return None
        ethertype, pos = (0x0800 if data[0] >> 4 == 4 else 0x86DD), 0
    else:
        raise PcapError(f"unsupported link type {linktype}")
    if ethertype == 0x0800:
        return _parse_ipv4(data, pos, ts_ns)
    if ethertype == 0x86DD:
        return _parse_ipv6(data, pos, ts_ns)
    return None


def _parse_ipv4(data: bytes, pos: int, ts_ns: int) -> Packet | None:
    if len(data) < pos + 20 or data[pos] >> 4 != 4:
        return None
    ihl = (data[pos] & 0x0F) * 4
    total = struct.unpack_from(">H", data, pos + 2)[0]
    frag = struct.unpack_from(">H", data, pos + 6)[0]
    if data[pos + 9] != 6 or frag & 0x1FFF or frag & 0x2000:
        return None  # not TCP, or a fragment (not reassembled)
    src = str(ipaddress.IPv4Address(data[pos + 12 : pos + 16]))
    dst = str(ipaddress.IPv4Address(data[pos + 16 : pos + 20]))
    end = pos + total if total else len(data)  # TSO captures may say 0
    return _parse_tcp(data[pos + ihl : min(end, len(data))], src, dst, ts_ns)


def _parse_ipv6(data: bytes, pos: int, ts_ns: int) -> Packet | None:
    if len(data) < pos + 40 or data[pos + 6] != 6:
        return None
    length = struct.unpack_from(">H", data, pos + 4)[0]
    src = str(ipaddress.IPv6Address(data[pos + 8 : pos + 24]))
    dst = str(ipaddress.IPv6Address(data[pos + 24 : pos + 40]))
    end = pos + 40 + length if length else len(data)
    return _parse_tcp(data[pos + 40 : min(end, len(data))], src, dst, ts_ns)


def _parse_tcp(seg: bytes, src: str, dst: str, ts_ns: int) -> Packet | None:
    if len(seg) < 20:
        return None
    sport, dport, seq = struct.unpack_from(">HHI", seg, 0)
    offset = (seg[12] >> 4) * 4
    return Packet(ts_ns, src, dst, sport, dport, seq, seg[13], bytes(seg[offset:]))


# --------------------------------------------------------------------------- reassembly


class _Direction:
    """One direction of a TCP connection: in-order bytes, cut into Kafka frames."""

    def __init__(self) -> None:
        self.next_seq: int | None = None  # absolute sequence number expected next
        self.pending: dict[int, tuple[bytes, int]] = {}  # seq -> (payload, ts) out of order
        self.buffer = bytearray()
        self.frame_start_ts = 0
        self.broken = False

    def syn(self, seq: int) -> None:
        self.next_seq = (seq + 1) & 0xFFFFFFFF

    def segment(self, seq: int, payload: bytes, ts_ns: int) -> list[tuple[bytes, int, int]]:
        """Add a segment; return the complete frames it finished: (frame, first_ts, last_ts)."""
        if self.broken or not payload:
            return []
        if self.next_seq is None:
            self.next_seq = seq  # no SYN seen: assume the capture starts at a frame
        self.pending[seq] = (payload, ts_ns)
        frames: list[tuple[bytes, int, int]] = []
        progressed = True
        while progressed and self.pending:
            progressed = False
            for s in list(self.pending):
                data, ts = self.pending[s]
                delta = (self.next_seq - s) & 0xFFFFFFFF
                if delta >= 0x80000000:
                    continue  # still in the future: wait for the gap to fill
                del self.pending[s]
                if delta >= len(data):
                    continue  # a retransmission of bytes we have
                if not self.buffer:
                    self.frame_start_ts = ts
                self.buffer += data[delta:]
                self.next_seq = (self.next_seq + len(data) - delta) & 0xFFFFFFFF
                frames.extend(self._cut(ts))
                progressed = True
        if len(self.pending) > 10_000:
            log.warning("pcap: a gap in a TCP stream never filled; dropping the rest of it")
            self.broken = True
            self.pending.clear()
        return frames

    def _cut(self, ts: int) -> Iterator[tuple[bytes, int, int]]:
        while len(self.buffer) >= 4:
            size = struct.unpack_from(">i", self.buffer, 0)[0]
            if size < 4 or size > MAX_FRAME:
                log.warning("pcap: implausible frame size %d; dropping the stream", size)
                self.broken = True
                self.buffer.clear()
                return
            if len(self.buffer) < 4 + size:
                return
            frame = bytes(self.buffer[4 : 4 + size])
            del self.buffer[: 4 + size]
            yield frame, self.frame_start_ts, ts
            self.frame_start_ts = ts


@attrs.define
class _Connection:
    id: int
    client: str
    to_server: _Direction = attrs.field(factory=_Direction)
    to_client: _Direction = attrs.field(factory=_Direction)
    #: correlation id -> (api key, version, client id) of requests awaiting a response
    waiting: dict[int, tuple[int, int, str | None]] = attrs.field(factory=dict)


@attrs.define
class ImportSummary:
    packets: int = 0
    connections: int = 0
    requests: int = 0
    responses: int = 0
    unpaired_responses: int = 0
    files: list[Path] = attrs.field(factory=list)

    def describe(self) -> str:
        return (
            f"{self.packets} TCP packets, {self.connections} Kafka connections, "
            f"{self.requests} requests, {self.responses} responses "
            f"({self.unpaired_responses} without a request) in {len(self.files)} files"
        )


def _request_ids(frame: bytes) -> tuple[int, int, int, str | None]:
    api_key, version, corr = struct.unpack_from(">hhi", frame, 0)
    client_id = None
    if len(frame) >= 10:
        length = struct.unpack_from(">h", frame, 8)[0]
        if length >= 0:
            client_id = frame[10 : 10 + length].decode(errors="replace")
    return api_key, version, corr, client_id


def import_pcap(path: Path, ports: set[int], out: Path, *, broker_id: int = 0) -> ImportSummary:
    """Write the Kafka traffic in ``path`` (to any of ``ports``) as capture Parquet in ``out``."""
    summary = ImportSummary()
    rotator = ParquetRotator(Path(out), broker_id, name="pcap")
    connections: dict[tuple[str, int, str, int], _Connection] = {}
    rows: list[CaptureRow] = []

    def flush() -> None:
        written = rotator.write(rows)
        if written is not None:
            summary.files.append(written)
        rows.clear()

    for pkt in read_packets(Path(path)):
        if pkt.dport in ports:
            key, to_server = (pkt.src, pkt.sport, pkt.dst, pkt.dport), True
        elif pkt.sport in ports:
            key, to_server = (pkt.dst, pkt.dport, pkt.src, pkt.sport), False
        else:
            continue
        summary.packets += 1
        conn = connections.get(key)
        if conn is None or (
            to_server and pkt.flags & TCP_SYN and conn.to_server.next_seq is not None
        ):
            summary.connections += 1
            client = f"[{key[0]}]:{key[1]}" if ":" in key[0] else f"{key[0]}:{key[1]}"
            conn = connections[key] = _Connection(summary.connections, client)
        direction = conn.to_server if to_server else conn.to_client
        if pkt.flags & TCP_SYN:
            direction.syn(pkt.seq)
            continue
        for frame, first_ts, last_ts in direction.segment(pkt.seq, pkt.payload, pkt.ts_ns):
            if len(frame) < (8 if to_server else 4):
                continue
            if to_server:
                api_key, version, corr, client_id = _request_ids(frame)
                conn.waiting[corr] = (api_key, version, client_id)
                summary.requests += 1
                rows.append(CaptureRow(
                    broker_id, conn.id, conn.client, client_id, REQUEST, first_ts, first_ts,
                    api_key, version, corr, len(frame), redact(REQUEST, api_key, frame),
                ))  # fmt: skip
            else:
                corr = struct.unpack_from(">i", frame, 0)[0]
                request = conn.waiting.pop(corr, None)
                if request is None:
                    summary.unpaired_responses += 1
                    continue
                api_key, version, client_id = request
                summary.responses += 1
                rows.append(CaptureRow(
                    broker_id, conn.id, conn.client, client_id, RESPONSE, last_ts, last_ts,
                    api_key, version, corr, len(frame), redact(RESPONSE, api_key, frame),
                ))  # fmt: skip
            if len(rows) >= ROWS_PER_FILE:
                flush()
    flush()
    rotator.write_stats(requests=summary.requests, responses=summary.responses)
    return summary
