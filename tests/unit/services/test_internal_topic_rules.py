"""Internal topics' partitioning matches Kafka's (Java's String.hashCode), and a write
counts only once synced (and, in a cluster, committed)."""

from __future__ import annotations

import pytest
import trio

from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.protocol.records import build_batch
from trio_broker.replication.leader import AckState
from trio_broker.services.internal_topics import (
    NotCommitted,
    append_committed,
    java_string_hash,
    partition_for,
)
from trio_broker.services.local_replication import LeadsNothing, OwnLog
from trio_broker.storage.memory import MemoryLog


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", 0),
        ("abc", 96354),
        ("hello", 99162322),
        ("\U0001f600", 31 * 0xD83D + 0xDE00),  # a surrogate pair: two UTF-16 units
        ("polygenelubricants", -(2**31)),  # Integer.MIN_VALUE
    ],
)
def test_java_string_hash(text: str, expected: int) -> None:
    assert java_string_hash(text) == expected


def test_partition_for_follows_kafka_abs() -> None:
    assert partition_for("polygenelubricants", 50) == 0  # abs(MIN_VALUE) is 0 in Kafka
    assert partition_for("hello", 50) == 99162322 % 50
    negative = next(
        k for k in (f"consumer-group-number-{i}" for i in range(1000)) if java_string_hash(k) < 0
    )
    assert partition_for(negative, 7) == abs(java_string_hash(negative)) % 7
    with pytest.raises(ValueError):
        partition_for("x", 0)


class _Durability:
    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.dirty: list[object] = []

    def mark_dirty(self, log: object, messages: int = 1) -> None:
        self.dirty.append(log)

    async def wait_durable(self, log: MemoryLog, offset: int) -> None:
        await trio.lowlevel.checkpoint()
        if self.fail:
            raise OSError("EIO")


class _Term:
    leader_epoch = 7
    replicated = True  # a cluster's term


class _Replication:
    def __init__(self, state: AckState | None) -> None:
        self.state = state

    def leader_term(self, topic: str, partition: int) -> _Term | None:
        return None if self.state is None else _Term()

    async def wait_committed(self, topic: str, partition: int, last_offset: int) -> AckState:
        await trio.lowlevel.checkpoint()
        assert self.state is not None
        return self.state


def _batch() -> bytes:
    return build_batch([(b"k", b"v")], base_timestamp=1)


async def test_alone_a_synced_write_counts() -> None:
    log, durability = MemoryLog(), _Durability()
    result = await append_committed(log, _batch(), now_ms=1, durability=durability,
                                    replication=OwnLog(0, log))  # fmt: skip
    assert (result.base_offset, log.log_end_offset, durability.dirty) == (0, 1, [log])
    assert not log.epoch_cache.entries  # a local term stamps no epoch


async def test_a_failed_sync_does_not_count() -> None:
    """A storage error is answered NOT_COORDINATOR, as Kafka's coordinators map
    KafkaStorageException (the client looks the coordinator up again)."""
    log = MemoryLog()
    with pytest.raises(NotCommitted) as info:
        await append_committed(log, _batch(), now_ms=1, durability=_Durability(True),
                               replication=OwnLog(0, log))  # fmt: skip
    assert info.value.error_code == ErrorCode.NOT_COORDINATOR


async def test_a_broker_that_left_its_cluster_is_no_coordinator() -> None:
    log = MemoryLog()
    with pytest.raises(NotCommitted) as info:
        await append_committed(log, _batch(), now_ms=1, durability=_Durability(),
                               replication=LeadsNothing(0), topic="t")  # fmt: skip
    assert (info.value.error_code, log.log_end_offset) == (ErrorCode.NOT_COORDINATOR, 0)


async def test_in_a_cluster_the_leader_stamps_its_epoch_and_waits_for_the_hw() -> None:
    log = MemoryLog()
    await append_committed(log, _batch(), now_ms=1, durability=_Durability(),
                           replication=_Replication(AckState.DONE), topic="t")  # fmt: skip
    assert log.epoch_cache.latest_epoch == 7


@pytest.mark.parametrize(
    ("state", "code"),
    [
        (None, ErrorCode.NOT_COORDINATOR),  # not the leader: nothing appended
        (AckState.LEADERSHIP_LOST, ErrorCode.NOT_COORDINATOR),
        (AckState.NOT_ENOUGH_REPLICAS_AFTER_APPEND, ErrorCode.COORDINATOR_NOT_AVAILABLE),
    ],
)
async def test_in_a_cluster_an_uncommitted_write_does_not_count(
    state: AckState | None, code: ErrorCode
) -> None:
    log = MemoryLog()
    with pytest.raises(NotCommitted) as info:
        await append_committed(log, _batch(), now_ms=1, durability=_Durability(),
                               replication=_Replication(state), topic="t")  # fmt: skip
    assert info.value.error_code == code
    assert log.log_end_offset == (0 if state is None else 1)
