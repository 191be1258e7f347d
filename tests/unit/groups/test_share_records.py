"""A share group's records in the offsets log (groups/share_records.py): their layout,
the replay that brings them back (latest record wins, tombstones), what an unreadable
value does, and the group coordinator restoring them when it loads a partition."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trio_broker.groups.offsets_store import (
    SHARE_GROUP_METADATA_KEY_VERSION,
    SHARE_GROUP_PARTITIONS_KEY_VERSION,
    OffsetAndMetadata,
    OffsetKey,
    OffsetsStore,
    decode_record,
    encode_record,
)
from trio_broker.groups.share_records import (
    StoredShareGroup,
    StoredTopic,
    decode_group,
    records_of,
)
from trio_broker.protocol.records import build_batch
from trio_broker.storage.log import LogConfig
from trio_broker.storage.memory import MemoryLog

T1, T2 = uuid.UUID(int=1), uuid.UUID(int=2)

topics = st.dictionaries(
    st.uuids(),
    st.builds(StoredTopic, st.text(max_size=20), st.frozensets(st.integers(0, 2**31 - 1))),
    max_size=5,
)
groups = st.builds(
    StoredShareGroup,
    st.integers(0, 2**31 - 1),
    topics,
    st.dictionaries(st.uuids(), st.text(max_size=20), max_size=3),
)


def stored(group_id: str, store: OffsetsStore) -> StoredShareGroup | None:
    return decode_group(
        store.share_group_record(group_id, SHARE_GROUP_METADATA_KEY_VERSION),
        store.share_group_record(group_id, SHARE_GROUP_PARTITIONS_KEY_VERSION),
    )


def replayed(*writes: list[tuple[bytes, bytes | None]]) -> OffsetsStore:
    log = MemoryLog(LogConfig())
    for records in writes:
        log.append(build_batch(records, base_timestamp=0), now_ms=0)
    store = OffsetsStore(log)
    store.load()
    return store


@given(st.text(min_size=1, max_size=30), groups)
def test_records_round_trip_through_the_offsets_log(group_id: str, group: StoredShareGroup) -> None:
    encoded = [encode_record(r) for r in records_of(group_id, group)]
    assert [decode_record(k, v) for k, v in encoded] == records_of(group_id, group)
    assert stored(group_id, replayed(encoded)) == group


def test_the_latest_record_wins_and_tombstones_remove_the_group() -> None:
    first = StoredShareGroup(3).with_partitions([(T1, "a", 0), (T1, "a", 1)])
    later = first.with_partitions([(T2, "b", 4)], epoch=5).without_topics([T1])
    commit = encode_record((OffsetKey("other", "t", 0), OffsetAndMetadata(7)))
    store = replayed(
        [encode_record(r) for r in records_of("g", first)],
        [commit, *(encode_record(r) for r in records_of("g", later))],
    )
    assert (
        stored("g", store) == later == StoredShareGroup(5, {T2: StoredTopic("b", frozenset({4}))})
    )
    assert store.share_group_ids() == {"g"}
    # Share groups are not classic groups: the coordinator's classic restore skips them.
    assert store.group_ids() == ["other"]
    store = replayed(
        [encode_record(r) for r in records_of("g", later)],
        [encode_record(r) for r in records_of("g", None)],
    )
    assert stored("g", store) is None and store.share_group_ids() == set()


@pytest.mark.parametrize("cut", [1, 3, 7, 25])
def test_a_damaged_value_is_refused(cut: int) -> None:
    group = StoredShareGroup(2).with_partitions([(T1, "topic", 3)])
    _, partitions = encode_record(records_of("g", group)[1])
    assert partitions is not None
    with pytest.raises(ValueError):
        decode_group(None, partitions[:cut])
    with pytest.raises(ValueError):
        decode_group((9).to_bytes(2, "big") + b"\0\0\0\1", None)
