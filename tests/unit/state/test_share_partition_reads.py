"""A share partition's acquisitions bounded by what a fetch read (state/share_partition.py).

A ShareFetch reads whole batches from the partition's next fetch offset within its
bytes, and acquires only below the end of what it read; under read_committed the
offsets of aborted transactions it read are archived instead of acquired.
"""

from __future__ import annotations

from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.state.share_partition import Acquired, RecordState, SharePartition

NOW = 1_000


def test_next_fetch_offset_is_the_lowest_record_given_back() -> None:
    share = SharePartition(start_offset=0, lock_duration_ms=100)
    assert share.next_fetch_offset(NOW) == 0
    share.acquire("m1", 10, 10, NOW)
    assert share.next_fetch_offset(NOW) == 10
    assert share.acknowledge("m1", 3, 4, [2], NOW) is ErrorCode.NONE  # release 3-4
    assert share.next_fetch_offset(NOW) == 3
    # Locks that ran out give their records back too.
    assert share.next_fetch_offset(NOW + 100) == 0


def test_acquire_stops_at_the_end_of_what_was_read() -> None:
    share = SharePartition(start_offset=0)
    assert share.acquire("m1", 2, 500, NOW) == [Acquired(0, 1, 1)]
    share.acquire("m1", 6, 500, NOW)  # 2-5
    assert share.acknowledge("m1", 1, 4, [2], NOW) is ErrorCode.NONE  # release 1-4
    # A fetch that read up to offset 3 takes the given-back 1-2 only, not 3-4 nor new ones.
    assert share.acquire("m2", 3, 500, NOW) == [Acquired(1, 2, 2)]
    assert share.state_of(3) is RecordState.AVAILABLE
    assert share.end_offset == 6


def test_offsets_to_archive_are_finished_not_delivered() -> None:
    share = SharePartition(start_offset=0)
    # Offsets 1-3 belong to an aborted transaction, 4 is its marker.
    runs = share.acquire("m1", 6, 500, NOW, archive=frozenset({1, 2, 3}))
    assert runs == [Acquired(0, 0, 1), Acquired(4, 5, 1)]
    assert [share.state_of(o) for o in range(1, 4)] == [RecordState.ARCHIVED] * 3
    assert share.acknowledge("m1", 0, 0, [1], NOW) is ErrorCode.NONE
    # The start moves over the accepted record and the archived ones at once.
    assert share.start_offset == 4
    # An archived offset cannot be acknowledged.
    assert share.acknowledge("m1", 1, 1, [1], NOW) is ErrorCode.INVALID_RECORD_STATE
