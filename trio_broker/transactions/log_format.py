"""Records of ``__transaction_state``: Kafka's key and value layout, plus our groups.

Key (version 0): int16 version, string transactional id.
Value (version 0): int16 version, int64 producer id, int16 producer epoch,
int32 timeout ms, int8 state, array of (string topic, array of int32
partition), int64 last update ms, int64 start ms -- Kafka's
TransactionLogValue v0, non-flexible. After those fields we append what Kafka
keeps elsewhere and we need after a restart: int64 last producer id, int16 last
epoch, and an array of string group ids (AddOffsetsToTxn's groups, whose
staged offsets a recovered commit must complete). Kafka's readers stop before
trailing bytes, so the layout stays readable by its tools. A null value is a
tombstone: the transactional id expired.
"""

from __future__ import annotations

import struct

from trio_broker.transactions.state import TxnMetadata, TxnState

KEY_VERSION = 0
VALUE_VERSION = 0

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_HEAD = struct.Struct(">hqhib")  # version, producer id, epoch, timeout, state
_TIMES = struct.Struct(">qq")  # last update, start
_LAST = struct.Struct(">qh")  # last producer id, last epoch


class _Reader:
    def __init__(self, buf: bytes) -> None:
        self.buf = buf
        self.pos = 0

    def unpack(self, fmt: struct.Struct) -> tuple[int, ...]:
        if self.pos + fmt.size > len(self.buf):
            raise ValueError("record ends early")
        values = fmt.unpack_from(self.buf, self.pos)
        self.pos += fmt.size
        return values

    def string(self) -> str:
        (size,) = self.unpack(_I16)
        if size < 0 or self.pos + size > len(self.buf):
            raise ValueError("string runs past the record")
        text = self.buf[self.pos : self.pos + size].decode()
        self.pos += size
        return text

    def count(self) -> int:
        (n,) = self.unpack(_I32)
        if n < -1 or n > len(self.buf):
            raise ValueError(f"bad array length {n}")
        return max(n, 0)

    @property
    def at_end(self) -> bool:
        return self.pos >= len(self.buf)


def _string(out: bytearray, text: str) -> None:
    raw = text.encode()
    out += _I16.pack(len(raw))
    out += raw


def encode_key(transactional_id: str) -> bytes:
    out = bytearray(_I16.pack(KEY_VERSION))
    _string(out, transactional_id)
    return bytes(out)


def decode_key(buf: bytes) -> str:
    reader = _Reader(buf)
    (version,) = reader.unpack(_I16)
    if version != KEY_VERSION:
        raise ValueError(f"unknown transaction log key version {version}")
    return reader.string()


def encode_value(meta: TxnMetadata) -> bytes:
    out = bytearray(_HEAD.pack(VALUE_VERSION, meta.producer_id, meta.producer_epoch,
                               meta.timeout_ms, meta.state.value))  # fmt: skip
    by_topic: dict[str, list[int]] = {}
    for topic, partition in sorted(meta.partitions):
        by_topic.setdefault(topic, []).append(partition)
    out += _I32.pack(len(by_topic))
    for topic, partitions in by_topic.items():
        _string(out, topic)
        out += _I32.pack(len(partitions))
        for partition in partitions:
            out += _I32.pack(partition)
    out += _TIMES.pack(meta.last_update_ms, meta.start_ms)
    # trio-broker's trailing fields (module docstring).
    out += _LAST.pack(meta.last_producer_id, meta.last_producer_epoch)
    out += _I32.pack(len(meta.groups))
    for group in sorted(meta.groups):
        _string(out, group)
    return bytes(out)


def decode_value(transactional_id: str, buf: bytes) -> TxnMetadata:
    reader = _Reader(buf)
    version, producer_id, epoch, timeout_ms, state_byte = reader.unpack(_HEAD)
    if version not in (0, 1):
        raise ValueError(f"unknown transaction log value version {version}")
    if version == 1:
        raise ValueError("flexible (v1) transaction log values are not read yet")
    state = TxnState(state_byte)
    partitions: set[tuple[str, int]] = set()
    for _ in range(reader.count()):
        topic = reader.string()
        for _ in range(reader.count()):
            partitions.add((topic, reader.unpack(_I32)[0]))
    last_update_ms, start_ms = reader.unpack(_TIMES)
    last_id, last_epoch, groups = -1, -1, set()
    if not reader.at_end:
        last_id, last_epoch = reader.unpack(_LAST)
        groups = {reader.string() for _ in range(reader.count())}
    return TxnMetadata(
        transactional_id, producer_id, last_producer_id=last_id, producer_epoch=epoch,
        last_producer_epoch=last_epoch, timeout_ms=timeout_ms, state=state,
        partitions=frozenset(partitions), groups=frozenset(groups), start_ms=start_ms,
        last_update_ms=last_update_ms,
    )  # fmt: skip
