"""The pure state machine of one transactional id (Kafka's TransactionMetadata).

Everything here is sync and I/O-free: the coordinator (coordinator.py) asks a
``decide_*`` function what a request means for the current metadata, writes the
resulting target metadata to ``__transaction_state`` and only then makes it
current. While such a write (or a commit/abort's marker writes) is under way
the id has a *pending* target, and every other request for it answers
CONCURRENT_TRANSACTIONS, which clients retry.

Transition table (Kafka's ``validPreviousStates``): a state may only be entered
from the states listed for it; anything else is a bug, raised as
:class:`IllegalTransition`.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable

import attrs

from trio_broker.protocol.error_codes import ErrorCode

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
#: The last epoch InitProducerId hands out (Kafka's isEpochExhausted: Short.MaxValue - 1):
#: at or past it, InitProducerId replaces the producer id (a new one at epoch 0).
EXHAUSTED_PRODUCER_EPOCH = 32766
#: Epochs are int16 (Short.MaxValue): the one left above the last handed out is for
#: fencing, so a producer at 32766 can still be fenced; no client ever holds it.
MAX_PRODUCER_EPOCH = 32767


class TxnState(enum.Enum):
    """The value is the byte Kafka writes in ``__transaction_state``."""

    EMPTY = 0
    ONGOING = 1
    PREPARE_COMMIT = 2
    PREPARE_ABORT = 3
    COMPLETE_COMMIT = 4
    COMPLETE_ABORT = 5
    DEAD = 6
    PREPARE_EPOCH_FENCE = 7

    @property
    def kafka_name(self) -> str:
        """The name DescribeTransactions / ListTransactions use ("PrepareCommit")."""
        return "".join(part.capitalize() for part in self.name.split("_"))

    @classmethod
    def from_kafka_name(cls, name: str) -> TxnState | None:
        return _BY_KAFKA_NAME.get(name)


_BY_KAFKA_NAME = {state.kafka_name: state for state in TxnState}

S = TxnState
#: target state -> the states it may be entered from.
VALID_PREVIOUS: dict[TxnState, frozenset[TxnState]] = {
    S.EMPTY: frozenset({S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.ONGOING: frozenset({S.ONGOING, S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.PREPARE_COMMIT: frozenset({S.ONGOING}),
    S.PREPARE_ABORT: frozenset({S.ONGOING, S.PREPARE_EPOCH_FENCE}),
    S.COMPLETE_COMMIT: frozenset({S.PREPARE_COMMIT}),
    S.COMPLETE_ABORT: frozenset({S.PREPARE_ABORT}),
    S.DEAD: frozenset({S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.PREPARE_EPOCH_FENCE: frozenset({S.ONGOING}),
}
#: States in which a transaction is open: partitions are (being) written.
IN_TRANSACTION = frozenset({S.ONGOING, S.PREPARE_COMMIT, S.PREPARE_ABORT, S.PREPARE_EPOCH_FENCE})


class IllegalTransition(Exception):
    pass


#: ``__transaction_state`` stores ids and group ids as int16-length strings.
MAX_NAME_BYTES = 32767


def fits_in_log(name: str) -> bool:
    """Whether a transactional id or group id can be written to the transaction log."""
    return len(name.encode()) <= MAX_NAME_BYTES


TopicPartition = tuple[str, int]


@attrs.frozen
class TxnMetadata:
    transactional_id: str
    producer_id: int
    #: The id before the last epoch exhaustion (or -1): a retried InitProducerId
    #: from the previous id is recognised.
    last_producer_id: int = NO_PRODUCER_ID
    #: -1 until the first InitProducerId completes.
    producer_epoch: int = NO_PRODUCER_EPOCH
    last_producer_epoch: int = NO_PRODUCER_EPOCH
    timeout_ms: int = 60_000
    state: TxnState = TxnState.EMPTY
    #: Partitions of the open transaction (empty outside one).
    partitions: frozenset[TopicPartition] = frozenset()
    #: Consumer groups of AddOffsetsToTxn: their staged offsets commit or abort with it.
    groups: frozenset[str] = frozenset()
    #: When the open transaction began (its first AddPartitions/AddOffsets), else -1.
    start_ms: int = -1
    last_update_ms: int = -1

    def to(self, state: TxnState, now_ms: int, **changes: object) -> TxnMetadata:
        """The same id in ``state``; raises if the table forbids the step."""
        if self.state not in VALID_PREVIOUS[state]:
            raise IllegalTransition(f"{self.transactional_id}: {self.state.name} -> {state.name}")
        return attrs.evolve(self, state=state, last_update_ms=now_ms, **changes)  # type: ignore[arg-type]


@attrs.frozen
class Decision:
    """What a request does: an error to answer, or a target metadata to write first."""

    error: ErrorCode
    target: TxnMetadata | None = None


def fenced(api_version: int, first_version_with_fenced: int) -> ErrorCode:
    """PRODUCER_FENCED where the request version knows it (KIP-588), else INVALID_PRODUCER_EPOCH."""
    if api_version >= first_version_with_fenced:
        return ErrorCode.PRODUCER_FENCED
    return ErrorCode.INVALID_PRODUCER_EPOCH


# ------------------------------------------------------------------ InitProducerId


@attrs.frozen
class InitDecision:
    error: ErrorCode
    #: None with NONE: answer the current id and epoch, nothing to write.
    target: TxnMetadata | None = None
    #: True: the target is PrepareEpochFence; the coordinator aborts the open
    #: transaction with the bumped epoch, and the client (answered
    #: CONCURRENT_TRANSACTIONS) retries.
    fence_and_abort: bool = False


def decide_init(
    current: TxnMetadata | None,
    *,
    transactional_id: str,
    pending: bool,
    producer_id: int,
    producer_epoch: int,
    timeout_ms: int,
    max_timeout_ms: int,
    now_ms: int,
    fresh_id: Callable[[], int],
    fenced_error: ErrorCode,
) -> InitDecision:
    if not transactional_id or not fits_in_log(transactional_id):
        return InitDecision(ErrorCode.INVALID_REQUEST)
    if (producer_id == NO_PRODUCER_ID) != (producer_epoch == NO_PRODUCER_EPOCH):
        # As Kafka: both or neither. (A fence leaves the previous epoch at -1: a request
        # with only the id must not pass for a retry of it.)
        return InitDecision(ErrorCode.INVALID_REQUEST)
    if timeout_ms <= 0 or timeout_ms > max_timeout_ms:
        return InitDecision(ErrorCode.INVALID_TRANSACTION_TIMEOUT)
    if current is None:
        # First use: a fresh id, epoch -1 so that the bump below hands out 0.
        current = TxnMetadata(transactional_id, fresh_id(), timeout_ms=timeout_ms,
                              last_update_ms=now_ms)  # fmt: skip
    if pending or current.state in (S.PREPARE_COMMIT, S.PREPARE_ABORT, S.DEAD):
        return InitDecision(ErrorCode.CONCURRENT_TRANSACTIONS)
    if producer_id != NO_PRODUCER_ID:
        # KIP-360: the client says which id/epoch it has; a stale one is fenced,
        # unless it is a retry of the bump that already happened.
        known = (current.producer_id, current.producer_epoch)
        retried = (current.last_producer_id, current.last_producer_epoch)
        if (producer_id, producer_epoch) == retried and current.state != S.ONGOING:
            return InitDecision(ErrorCode.NONE)  # answer the current id and epoch
        if (producer_id, producer_epoch) != known:
            return InitDecision(fenced_error)
    if current.state == S.ONGOING:
        # An open transaction of the previous producer: fence its epoch, abort it. The
        # client's retry then bumps again, or gets a new id if the fence used the last.
        target = _fenced(current, now_ms)
        return InitDecision(ErrorCode.CONCURRENT_TRANSACTIONS, target, fence_and_abort=True)
    bumped = _bumped(current, fresh_id)
    target = bumped.to(S.EMPTY, now_ms, timeout_ms=timeout_ms, partitions=frozenset(),
                       groups=frozenset(), start_ms=-1)  # fmt: skip
    return InitDecision(ErrorCode.NONE, target)


def _bumped(meta: TxnMetadata, fresh_id: Callable[[], int]) -> TxnMetadata:
    """InitProducerId's next epoch; a new producer id at epoch 0 once the epoch is
    exhausted. The pair it replaces is remembered: a retry of this bump is recognised."""
    if meta.producer_epoch < EXHAUSTED_PRODUCER_EPOCH:
        return attrs.evolve(
            meta,
            last_producer_id=meta.producer_id,
            last_producer_epoch=meta.producer_epoch,
            producer_epoch=meta.producer_epoch + 1,
        )
    return attrs.evolve(
        meta,
        last_producer_id=meta.producer_id,
        last_producer_epoch=meta.producer_epoch,
        producer_id=fresh_id(),
        producer_epoch=0,
    )


def _fenced(meta: TxnMetadata, now_ms: int) -> TxnMetadata:
    """PrepareEpochFence: the open transaction's producer is fenced by the next epoch.

    As Kafka's prepareFenceProducerEpoch: the fenced epoch is *not* remembered as the
    previous one, so the fenced producer's InitProducerId with it (KIP-360) is
    PRODUCER_FENCED rather than taken for a retry. Epochs handed out stop at
    EXHAUSTED_PRODUCER_EPOCH, so the bump fits in an int16; the clamp only guards
    metadata from elsewhere (Kafka refuses to fence at Short.MaxValue).
    """
    return meta.to(S.PREPARE_EPOCH_FENCE, now_ms,
                   producer_epoch=min(meta.producer_epoch + 1, MAX_PRODUCER_EPOCH),
                   last_producer_id=meta.producer_id,
                   last_producer_epoch=NO_PRODUCER_EPOCH)  # fmt: skip


# ------------------------------------------------------------------ the open transaction


def _check_producer(
    current: TxnMetadata | None, pending: bool, producer_id: int, producer_epoch: int,
    fenced_error: ErrorCode,
) -> ErrorCode:  # fmt: skip
    if current is None or current.producer_id != producer_id:
        return ErrorCode.INVALID_PRODUCER_ID_MAPPING
    if current.producer_epoch != producer_epoch:
        return fenced_error
    if pending or current.state in (S.PREPARE_COMMIT, S.PREPARE_ABORT):
        return ErrorCode.CONCURRENT_TRANSACTIONS
    if current.state in (S.PREPARE_EPOCH_FENCE, S.DEAD):
        return fenced_error
    return ErrorCode.NONE


def decide_add(
    current: TxnMetadata | None,
    *,
    pending: bool,
    producer_id: int,
    producer_epoch: int,
    partitions: Iterable[TopicPartition] = (),
    groups: Iterable[str] = (),
    now_ms: int,
    fenced_error: ErrorCode,
) -> Decision:
    """AddPartitionsToTxn / AddOffsetsToTxn: the transaction is (or becomes) Ongoing."""
    error = _check_producer(current, pending, producer_id, producer_epoch, fenced_error)
    if error != ErrorCode.NONE:
        return Decision(error)
    assert current is not None
    new_partitions = current.partitions | frozenset(partitions)
    new_groups = current.groups | frozenset(groups)
    if current.state == S.ONGOING and (new_partitions, new_groups) == (
        current.partitions,
        current.groups,
    ):
        return Decision(ErrorCode.NONE)  # nothing new: nothing to write
    start_ms = current.start_ms if current.state == S.ONGOING else now_ms
    target = current.to(S.ONGOING, now_ms, partitions=new_partitions, groups=new_groups,
                        start_ms=start_ms)  # fmt: skip
    return Decision(ErrorCode.NONE, target)


def verify_partition(
    current: TxnMetadata | None, producer_id: int, producer_epoch: int, partition: TopicPartition
) -> ErrorCode:
    """KIP-890 verification: is ``partition`` in this producer's open transaction?"""
    if current is None or current.producer_id != producer_id:
        return ErrorCode.INVALID_PRODUCER_ID_MAPPING
    if producer_epoch < current.producer_epoch:
        return ErrorCode.INVALID_PRODUCER_EPOCH
    in_txn = current.state == S.ONGOING and partition in current.partitions
    if in_txn and producer_epoch == current.producer_epoch:
        return ErrorCode.NONE
    return ErrorCode.INVALID_TXN_STATE


def decide_end(
    current: TxnMetadata | None,
    *,
    pending: bool,
    producer_id: int,
    producer_epoch: int,
    committed: bool,
    now_ms: int,
    fenced_error: ErrorCode,
) -> Decision:
    """EndTxn: NONE with a Prepare target; NONE without one for a retried, finished end."""
    if current is None or current.producer_id != producer_id:
        return Decision(ErrorCode.INVALID_PRODUCER_ID_MAPPING)
    if current.producer_epoch != producer_epoch:
        return Decision(fenced_error)
    state = current.state
    if pending or state == S.PREPARE_EPOCH_FENCE:
        return Decision(ErrorCode.CONCURRENT_TRANSACTIONS)
    if state == S.ONGOING:
        target = current.to(S.PREPARE_COMMIT if committed else S.PREPARE_ABORT, now_ms)
        return Decision(ErrorCode.NONE, target)
    if state == (S.COMPLETE_COMMIT if committed else S.COMPLETE_ABORT):
        return Decision(ErrorCode.NONE)  # a retry of the end that already completed
    if state == (S.PREPARE_COMMIT if committed else S.PREPARE_ABORT):
        return Decision(ErrorCode.CONCURRENT_TRANSACTIONS)
    return Decision(ErrorCode.INVALID_TXN_STATE)


def prepare_abort_fenced(fencing: TxnMetadata, now_ms: int) -> TxnMetadata:
    """After PrepareEpochFence (or a timeout): abort with the bumped epoch."""
    return fencing.to(S.PREPARE_ABORT, now_ms)


def complete(prepared: TxnMetadata, now_ms: int) -> TxnMetadata:
    """CompleteCommit/CompleteAbort after every marker is written: the txn is closed."""
    state = S.COMPLETE_COMMIT if prepared.state == S.PREPARE_COMMIT else S.COMPLETE_ABORT
    return prepared.to(state, now_ms, partitions=frozenset(), groups=frozenset())


def timed_out(meta: TxnMetadata, now_ms: int) -> bool:
    return (
        meta.state == S.ONGOING and meta.start_ms >= 0 and meta.start_ms + meta.timeout_ms < now_ms
    )


def fence_for_timeout(meta: TxnMetadata, now_ms: int) -> TxnMetadata:
    """A timed-out Ongoing transaction: bump the epoch (the producer is fenced), then abort."""
    return _fenced(meta, now_ms)


def expired(meta: TxnMetadata, now_ms: int, expiration_ms: int) -> bool:
    """transactional.id.expiration.ms: an idle id with no open transaction is forgotten."""
    closed = meta.state in (S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT)
    return closed and meta.last_update_ms + expiration_ms <= now_ms


def partition_error(
    current: TxnMetadata | None, producer_epoch: int, partition: TopicPartition
) -> ErrorCode:
    """For Produce: may this producer write a transactional batch to ``partition``?"""
    if current is None:
        return ErrorCode.INVALID_TXN_STATE
    if producer_epoch < current.producer_epoch:
        return ErrorCode.INVALID_PRODUCER_EPOCH
    if current.state == S.ONGOING and partition in current.partitions:
        return ErrorCode.NONE
    return ErrorCode.INVALID_TXN_STATE
