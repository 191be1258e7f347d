"""The offsets log's records as Kafka 4.4 lays them out, and main's numbering still read.

``data/offsets_log_main_layout.json`` holds records as main's encoder wrote them (key
versions 1-11, our own values; hex keys and values, made with main's
``offsets_store.encode_record`` before the layout changed): every one must load into the
same table after the change, alone and with records of the new layout after it.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

from trio_broker.groups.offsets_store import (
    OWN_RECORD_BASE,
    SHARE_GROUP_MEMBER_KEY_VERSION,
    SHARE_GROUP_METADATA_KEY_VERSION,
    ConsumerGroupSnapshot,
    GroupMetadata,
    OffsetAndMetadata,
    OffsetKey,
    OffsetsStore,
    ShareGroupRecord,
    StoreRecord,
    TxnEnd,
    TxnOffset,
    decode_record,
    encode_record,
)
from trio_broker.protocol.records import build_batch
from trio_broker.state.group import GroupRecord, MemberRecord
from trio_broker.storage.log import LogConfig
from trio_broker.storage.memory import MemoryLog

MAIN_LAYOUT = Path(__file__).parent / "data" / "offsets_log_main_layout.json"
MEMBER = MemberRecord("m-1", "inst-1", "client-a", "/127.0.0.1", 60000, 10000, b"\0sub", b"\0asg")


def store_over(pairs: list[tuple[bytes, bytes | None]]) -> OffsetsStore:
    log = MemoryLog(LogConfig())
    log.append(build_batch(pairs, base_timestamp=1), now_ms=1)
    store = OffsetsStore(log)
    assert store.load() == len(pairs)
    return store


def main_layout_records() -> list[tuple[bytes, bytes | None]]:
    return [
        (bytes.fromhex(key), None if value is None else bytes.fromhex(value))
        for key, value in json.loads(MAIN_LAYOUT.read_text())
    ]


def assert_main_layout_state(store: OffsetsStore) -> None:
    assert store.group_offsets("classic") == {
        ("t", 0): OffsetAndMetadata(42, 3, "meta", 1700000000000),
        ("t", 1): OffsetAndMetadata(7, -1, "", 1700000000001),
    }
    assert store.group_metadata("classic") == GroupRecord("consumer", 5, "range", "m-1", (MEMBER,))
    assert store.group_metadata("gone") is None
    # The committed transaction's staged offset counts; the other producer's is pending.
    assert store.get("txg", "t", 0) == OffsetAndMetadata(100, 4, "tx", 1700000000003)
    assert store.pending_offsets("txg", 7001) == {
        ("t", 1): OffsetAndMetadata(200, -1, "", 1700000000004)
    }
    assert store.producer_epoch(7000) == 2
    assert store.consumer_group_snapshot("kip848") == b"\0\1snapshot"
    assert store.share_group_records("shares") == {
        (SHARE_GROUP_METADATA_KEY_VERSION, ""): b"\0\1meta",
        (SHARE_GROUP_MEMBER_KEY_VERSION, "sm-1"): b"\0\2member",
    }


def test_a_log_in_mains_numbering_loads_unchanged() -> None:
    assert_main_layout_state(store_over(main_layout_records()))


def test_mains_records_and_new_ones_in_one_log() -> None:
    """A data dir written by main, then by this broker: both numberings in one log."""
    later: list[StoreRecord] = [
        (OffsetKey("classic", "t", 3), OffsetAndMetadata(9, 1, "new", 1800000000000)),
        GroupMetadata("fresh", GroupRecord("consumer", 1, "range", "m-1", (MEMBER,))),
        TxnOffset(7002, 0, OffsetKey("txg", "t", 5), OffsetAndMetadata(5)),
        ConsumerGroupSnapshot("kip848-new", b"snap"),
        ShareGroupRecord(SHARE_GROUP_MEMBER_KEY_VERSION, "shares", b"m2", "sm-2"),
    ]
    store = store_over([*main_layout_records(), *(encode_record(r) for r in later)])
    assert store.get("classic", "t", 3) == OffsetAndMetadata(9, 1, "new", 1800000000000)
    assert store.group_metadata("fresh") == GroupRecord("consumer", 1, "range", "m-1", (MEMBER,))
    assert store.pending_offsets("txg", 7002) == {("t", 5): OffsetAndMetadata(5)}
    assert store.consumer_group_snapshot("kip848-new") == b"snap"
    assert store.share_group_record("shares", SHARE_GROUP_MEMBER_KEY_VERSION, "sm-2") == b"m2"
    # Everything main wrote is still there (sm-2 is one more member of "shares").
    assert store.group_offsets("classic")[("t", 0)] == OffsetAndMetadata(
        42, 3, "meta", 1700000000000
    )
    assert store.group_metadata("classic") == GroupRecord("consumer", 5, "range", "m-1", (MEMBER,))
    assert store.get("txg", "t", 0) == OffsetAndMetadata(100, 4, "tx", 1700000000003)


def test_a_plain_offset_is_kafkas_offset_commit_v4() -> None:
    key, value = encode_record((OffsetKey("g", "t", 2), OffsetAndMetadata(77, 5, "hé", 1234)))
    # OffsetCommitKey (type 1): int16 strings and the partition.
    assert key == b"\0\1" + b"\0\1g" + b"\0\1t" + struct.pack(">i", 2)
    assert value is not None
    metadata = "hé".encode()
    # OffsetCommitValue v4: offset, leader epoch, compact string, commit time, no tags.
    assert value == (
        struct.pack(">hqi", 4, 77, 5) + bytes([len(metadata) + 1]) + metadata
        + struct.pack(">q", 1234) + b"\0"
    )  # fmt: skip


def test_a_group_is_kafkas_group_metadata_v3() -> None:
    key, value = encode_record(GroupMetadata("g", GroupRecord(None, 2, None, None, ())))
    assert key == b"\0\2\0\1g"
    # protocolType "" (none), generation, protocol and leader null, state time -1, no member.
    assert value == (
        struct.pack(">hh", 3, 0) + struct.pack(">i", 2) + b"\xff\xff\xff\xff"
        + struct.pack(">qi", -1, 0)
    )  # fmt: skip


def test_our_own_records_take_types_kafka_does_not_know() -> None:
    own: list[StoreRecord] = [
        TxnOffset(1, 0, OffsetKey("g", "t", 0), OffsetAndMetadata(1)),
        TxnOffset(1, 0, OffsetKey("g", "t", 0), None),
        TxnEnd("g", 1, 0, True),
        ConsumerGroupSnapshot("g", b"x"),
        ShareGroupRecord(SHARE_GROUP_METADATA_KEY_VERSION, "g", b"x"),
        ShareGroupRecord(SHARE_GROUP_MEMBER_KEY_VERSION, "g", None, "m"),
    ]
    for record in own:
        key, value = encode_record(record)
        assert int.from_bytes(key[:2], "big") > OWN_RECORD_BASE  # Kafka 4.4's end at 23
        assert decode_record(key, value) == record
