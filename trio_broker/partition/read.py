"""A partition's one read entry, beside its write entry (issue 29): Kafka's
``Partition.fetchRecords`` → ``readRecords`` → ``UnifiedLog.read``.

:func:`read` takes what Kafka's read takes: a :class:`~trio_broker.partition.partition.
Partition` this broker leads (the guard, ``handlers/topic_lookup.leading_partition``,
found it: its log, term and producer state), the fetch offset, the bytes it may return, how far it may read (:class:`Isolation`: a
follower the log end, a consumer the high watermark, a read_committed one the last
stable offset) and whether one whole batch goes out even past the bytes (the first
partition of a response, or a throttled replica's). It answers the partition's offsets
as they were before the read (high watermark, last stable offset, log start), the
batches' regions, the aborted transactions a read_committed consumer filters with, or
the error the read hit; what the handler does with the bytes (the response's budget,
the replication throttle, the quota) stays the handler's, as Kafka's
``ReplicaManager.readFromLog``.

A replica's read records its progress first (Kafka's ``updateFollowerFetchState``,
called by ``Partition.fetchRecords`` for a fetch from a follower): given a
:class:`ReplicaRead`, :func:`read_by_replica` takes the leader's log progress into the
term and records the follower's fetch offset and log start there
(``replication/replica_rules.py``: its log end and last caught-up time, an ISR expansion
the term proposes, a high watermark advance), then hands what came of it to the
leader's :class:`Followers` (the replica manager: it wakes the partition's waiters and
stores the ISR change), and reads. A consumer's read (:func:`read`) records nothing and
pays nothing for it. The fetch handler reads by replica in the first read of a
follower's request only (a long poll's later reads record nothing), as the replica
manager did when the request arrived.

Sans-I/O: no trio.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

import attrs

from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.replication.replica_rules import leader_log_progress, record_follower_fetch
from trio_broker.storage.errors import OffsetOutOfRange, StorageError

if TYPE_CHECKING:
    from trio_broker.partition.append import Term
    from trio_broker.partition.partition import Partition
    from trio_broker.replication.leader import IsrProposal
    from trio_broker.state.partition_txns import AbortedTxn
    from trio_broker.storage.log_protocol import Region

__all__ = [
    "FetchedPartition",
    "Followers",
    "Isolation",
    "Read",
    "ReplicaRead",
    "read",
    "read_by_replica",
    "readable_end",
    "record_progress",
]


class Isolation(enum.Enum):
    """How far a read goes (Kafka's FetchIsolation)."""

    #: A follower copies everything, what is not committed yet too: its copy commits it.
    LOG_END = "log_end"
    #: A consumer, read_uncommitted: what is committed, below the high watermark.
    HIGH_WATERMARK = "high_watermark"
    #: A consumer, read_committed: below the last stable offset (the oldest open
    #: transaction), with the aborted transactions it overlaps.
    TXN_COMMITTED = "txn_committed"


# The members as module globals: the read runs per partition per Fetch, and an enum
# member looked up on its class costs about 150 ns in CPython 3.11 (a descriptor),
# a global about 20 ns; four such lookups were most of what the entry cost.
_LOG_END = Isolation.LOG_END
_TXN_COMMITTED = Isolation.TXN_COMMITTED


class FetchedPartition(Protocol):
    """Where a read writes the partition's offsets and error (a Fetch answer's
    partition): written in place, not returned in an object of its own, which would
    cost the Fetch hot path an allocation per partition."""

    error_code: int
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int


class Followers(Protocol):
    """A leader's side of its followers' reads (the replica manager, ``services.leaders``
    in a cluster): what the progress rules ask of it, and what it does with their
    outcome (the waiting and the ZooKeeper write are the shell's)."""

    @property
    def counts_synced_only(self) -> bool:
        """Whether the leader counts only what it synced toward the high watermark
        (``acks.all.fsync``): its own progress is then its durable end."""
        ...

    def may_join(self, topic: str, partition: int, replica: int, term: Term) -> bool:
        """Whether ``replica`` may be proposed into the ISR (not one a reassignment is
        removing: ``replica_rules.leaving_replica``, as the view has the move)."""
        ...

    def progressed(
        self, topic: str, partition: int, term: Term, moved: bool,
        proposal: IsrProposal | None,
    ) -> None:  # fmt: skip
        """A replica's read was recorded: ``moved``, the partition's waiters look again
        (the high watermark or the low watermark may have moved); ``proposal``, an ISR
        change ``term`` proposed, to store."""
        ...


@attrs.frozen(slots=True)
class ReplicaRead:
    """A follower's read, whose progress the read records: the replica's id, the
    broker's clock when its request arrived, and the leader's :class:`Followers`."""

    replica: int
    now_ms: int
    followers: Followers


def record_progress(
    partition: Partition, replica: ReplicaRead, fetch_offset: int, log_start_offset: int
) -> None:
    """Kafka's ``Partition.updateFollowerFetchState``: the follower holds everything
    below ``fetch_offset`` and its log starts at ``log_start_offset`` (-1: unknown).

    The leader's own log progress first (its log end, and what counts of it: the
    durable end when it syncs before counting), then the follower's fetch (a fetch
    past the log end records nothing), both by ``replication/replica_rules.py``; the
    outcome goes to the leader's :class:`Followers`. A node alone's term takes it by the
    same rules: a replica set of one, it has no follower to record (nothing moves, no
    ISR change), as Kafka's ``Partition`` has no remote replica to update."""
    term = partition.term
    log = partition.log
    followers = replica.followers
    log_end_offset = log.log_end_offset
    counted = log.durable_end_offset if followers.counts_synced_only else log_end_offset
    changed = leader_log_progress(term, log_end_offset, counted)
    topic, index = partition.topic, partition.index
    moved, proposal = record_follower_fetch(
        term, replica.replica, fetch_offset, log_start_offset, replica.now_ms,
        may_join=followers.may_join(topic, index, replica.replica, term),
    )  # fmt: skip
    if moved or changed or proposal is not None:
        followers.progressed(topic, index, term, moved or changed, proposal)


#: What a read returns: the whole batches read, in log order (empty: none), and, for
#: TXN_COMMITTED with records read, the aborted transactions overlapping [fetch
#: offset, LSO), a superset of those in the batches (the consumer filters by offset);
#: else None.
Read = tuple[Sequence["Region"], Sequence["AbortedTxn"] | None]
_NOTHING: Read = ((), None)


def readable_end(
    isolation: Isolation, log_end_offset: int, high_watermark: int, last_stable_offset: int
) -> int:
    """Where a read stops (Kafka's FetchIsolation): a follower copies up to the log end
    (what is not committed yet too: its copy is what commits it), a consumer sees only
    what is committed, below the high watermark, and read_committed only below the LSO."""
    if isolation is _LOG_END:
        return log_end_offset
    if isolation is _TXN_COMMITTED:
        return min(high_watermark, last_stable_offset)
    return high_watermark


def read_by_replica(
    into: FetchedPartition, partition: Partition, fetch_offset: int, max_bytes: int | None,
    replica: ReplicaRead, replica_log_start: int, *, min_one: bool,
) -> Read:  # fmt: skip
    """A follower's read that records its progress (Kafka's ``Partition.fetchRecords``
    from a follower): :func:`record_progress` (its fetch offset, ``replica_log_start``:
    its log start, -1 if unknown), then :func:`read` up to the log end. A consumer's
    read, and a follower's that records nothing (a long poll's later reads), is
    :func:`read` alone: it pays nothing for this."""
    record_progress(partition, replica, fetch_offset, replica_log_start)
    return read(into, partition, fetch_offset, max_bytes, _LOG_END, min_one=min_one)


def read(
    into: FetchedPartition, partition: Partition, fetch_offset: int, max_bytes: int | None,
    isolation: Isolation, *, min_one: bool,
) -> Read:  # fmt: skip
    """Read ``partition`` (led here: the guard found it) from ``fetch_offset``; the
    partition's offsets as they were before the read, or the read's error, go ``into``
    the answer (offsets -1 on an error, as Kafka answers a failed read).

    ``max_bytes`` None: the answer has no room left for this partition (or the replica
    is throttled to nothing): only its offsets, no read, and so no read error.
    ``min_one``: one whole batch goes out even if larger than ``max_bytes``.
    A follower's read that records its progress is :func:`read_by_replica`.
    """
    log = partition.log
    log_end_offset = log.log_end_offset
    if isolation is _LOG_END and fetch_offset > log_end_offset:
        # Past the leader's end: the follower has records the leader does not (Kafka's
        # read checks it against the log end; a consumer's is checked against its end).
        into.error_code = ErrorCode.OFFSET_OUT_OF_RANGE
        return _NOTHING
    # Alone, the high watermark is the durable end (services/local_replication.py).
    high_watermark = into.high_watermark = partition.term.high_watermark
    # The LSO: Kafka fills it for read_uncommitted fetches and followers too.
    producers = partition.producers
    stable = producers.last_stable_offset(log, high_watermark)
    into.last_stable_offset = stable
    into.log_start_offset = log.log_start_offset
    if max_bytes is None:
        return _NOTHING
    read_up_to = readable_end(isolation, log_end_offset, high_watermark, stable)
    try:
        regions = log.read(fetch_offset, max_bytes, read_up_to, min_one=min_one)
    except (OffsetOutOfRange, StorageError) as exc:
        into.error_code = (
            ErrorCode.OFFSET_OUT_OF_RANGE if isinstance(exc, OffsetOutOfRange) else exc.error_code
        )
        into.high_watermark = into.last_stable_offset = into.log_start_offset = -1
        return _NOTHING
    if regions and isolation is _TXN_COMMITTED:
        return regions, producers.aborted_between(log, fetch_offset, stable)
    return regions, None
