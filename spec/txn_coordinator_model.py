"""Reference model of the transaction coordinator (one node, requests one at a time).

Deliberately small: per transactional id the producer id, the epoch, whether a
transaction is open (and its partitions and groups) or how the last one ended,
and the markers each partition should have received. It knows Kafka's answers
per state without the coordinator's transition table; the stateful test
(statemachine/test_txn_coordinator_machine.py) compares the two.

Ending a transaction is not one step. Its outcome is decided (PrepareCommit or
PrepareAbort, durable) before any marker is written; the markers then go out one
partition at a time, and a partition may refuse one for now (its leader moved, its
disk failed): the transaction stays prepared, with the remaining markers owed, until
the coordinator's recovery writes them. While a marker round is in flight (a marker
appended, not yet durable) the id is *pending*. Kafka's rules for that window:

P1. While an id is pending or prepared, InitProducerId, AddPartitions/AddOffsets and
    an EndTxn of the same outcome answer CONCURRENT_TRANSACTIONS (the client retries);
    an EndTxn of the other outcome INVALID_TXN_STATE (a prepared outcome never flips).
P2. A prepared transaction is not open: a transactional write to one of its
    partitions is refused (INVALID_TXN_STATE), and the timeout does not abort it again.
P3. Each partition gets the outcome's marker once per round, in partition order;
    the groups learn the outcome, and the id completes, only after every marker.
P4. A restart keeps the prepared outcome; recovery writes every marker again.
I1. InitProducerId with the producer's own id and epoch (KIP-360, a producer that hit
    an error keeping its id) bumps the epoch as a new producer's does. The pair the
    last bump replaced is a retry of that bump: answered with the current pair, nothing
    changed, unless a transaction is open. Any other pair is PRODUCER_FENCED, and so is
    the epoch a fence (InitProducerId over an open transaction, a timeout) aborted: a
    fence is not a bump a producer asked for, its old epoch is not remembered.
I2. Epochs run out: InitProducerId bumps the epoch while it is below Short.MaxValue - 1
    (32766); an id at 32766 or above gets a new producer id at epoch 0 instead (Kafka's
    isEpochExhausted and producer id rotation), so the epoch a fence bumps to (at most
    Short.MaxValue) always fits. The replaced pair is remembered for a retry as in I1.
E1. An id with no open or prepared transaction whose metadata last changed
    transactional.id.expiration.ms or more ago is forgotten (InitProducerId then gives
    it a new producer id); an open, prepared or pending one never is.
"""

from __future__ import annotations

import attrs

NONE = 0
COORDINATOR_NOT_AVAILABLE = 15
INVALID_PRODUCER_EPOCH = 47
INVALID_REQUEST = 42
INVALID_TXN_STATE = 48
INVALID_PRODUCER_ID_MAPPING = 49
INVALID_TRANSACTION_TIMEOUT = 50
CONCURRENT_TRANSACTIONS = 51
PRODUCER_FENCED = 90
#: I2: Short.MaxValue - 1, the epoch at which InitProducerId takes a new producer id.
EXHAUSTED_EPOCH = 32766
MAX_EPOCH = 32767

#: (producer id, epoch, committed) per marker, in the order written.
Marker = tuple[int, int, bool]


@attrs.define
class ModelTxn:
    producer_id: int
    epoch: int
    #: "empty", "ongoing", "prepare_commit", "prepare_abort", "committed", "aborted"
    status: str = "empty"
    #: A marker round in flight (markers appended, not yet durable): P1.
    pending: bool = False
    #: Partitions still owed the prepared outcome's marker (P3).
    owed: set[tuple[str, int]] = attrs.Factory(set)
    partitions: set[tuple[str, int]] = attrs.Factory(set)
    groups: set[str] = attrs.Factory(set)
    started_ms: int = -1
    timeout_ms: int = 0
    #: When its metadata last changed (E1).
    updated_ms: int = 0
    #: The (producer id, epoch) the last InitProducerId bump replaced (I1); None after a
    #: fence or before any bump.
    last_pair: tuple[int, int] | None = None


@attrs.define
class ModelCoordinator:
    max_timeout_ms: int
    txns: dict[str, ModelTxn] = attrs.Factory(dict)
    markers: dict[tuple[str, int], list[Marker]] = attrs.Factory(dict)
    #: (group, producer id, epoch, committed) in the order the groups were told.
    group_outcomes: list[tuple[str, int, int, bool]] = attrs.Factory(list)
    #: Partitions refusing markers for now (their leader moved, their disk failed).
    refusing: set[tuple[str, int]] = attrs.Factory(set)
    #: The clock (the machine sets it), for E1.
    now_ms: int = 0

    def busy(self, txn: ModelTxn) -> bool:
        return txn.pending or txn.status.startswith("prepare")

    def init(
        self, tid: str, timeout_ms: int, new_producer_id: int, producer_id: int = -1,
        epoch: int = -1,
    ) -> tuple[int, int, int]:  # fmt: skip
        """(error, producer id, epoch) for InitProducerId, from a new producer (-1/-1) or
        from one that names its id and epoch (I1)."""
        if not tid or (producer_id == -1) != (epoch == -1):
            return INVALID_REQUEST, -1, -1
        if not 0 < timeout_ms <= self.max_timeout_ms:
            return INVALID_TRANSACTION_TIMEOUT, -1, -1
        txn = self.txns.get(tid)
        if txn is None:
            if producer_id != -1:
                return PRODUCER_FENCED, -1, -1  # I1: a pair of an id it does not know
            self.txns[tid] = ModelTxn(new_producer_id, 0, timeout_ms=timeout_ms,
                                      updated_ms=self.now_ms)  # fmt: skip
            return NONE, new_producer_id, 0
        if self.busy(txn):
            return CONCURRENT_TRANSACTIONS, -1, -1  # P1
        if producer_id != -1:
            if (producer_id, epoch) == txn.last_pair and txn.status != "ongoing":
                return NONE, txn.producer_id, txn.epoch  # I1: a retried bump
            if (producer_id, epoch) != (txn.producer_id, txn.epoch):
                return PRODUCER_FENCED, -1, -1
        if txn.status == "ongoing":
            # Fence: the open transaction is aborted under the next epoch; retry.
            self._fence(txn)
            self._prepare(txn, committed=False)
            if self._write_markers(txn):
                self._complete(txn)
            return CONCURRENT_TRANSACTIONS, -1, -1
        txn.last_pair = (txn.producer_id, txn.epoch)
        if txn.epoch >= EXHAUSTED_EPOCH:  # I2: a new producer id
            txn.producer_id, txn.epoch = new_producer_id, 0
        else:
            txn.epoch += 1
        txn.status, txn.updated_ms = "empty", self.now_ms
        txn.timeout_ms = timeout_ms
        return NONE, txn.producer_id, txn.epoch

    @staticmethod
    def _fence(txn: ModelTxn) -> None:
        """I1: the next epoch, and the fenced one is not remembered as a retry's."""
        txn.epoch = min(txn.epoch + 1, MAX_EPOCH)
        txn.last_pair = None

    def _check(self, tid: str, producer_id: int, epoch: int) -> int:
        txn = self.txns.get(tid)
        if txn is None or txn.producer_id != producer_id:
            return INVALID_PRODUCER_ID_MAPPING
        if txn.epoch != epoch:
            return PRODUCER_FENCED
        return NONE

    def add(self, tid: str, producer_id: int, epoch: int, partitions: set[tuple[str, int]],
            groups: set[str], now_ms: int) -> int:  # fmt: skip
        error = self._check(tid, producer_id, epoch)
        if error:
            return error
        txn = self.txns[tid]
        if self.busy(txn):
            return CONCURRENT_TRANSACTIONS  # P1
        opens = txn.status != "ongoing"
        if opens or not (partitions <= txn.partitions and groups <= txn.groups):
            txn.updated_ms = now_ms  # written (nothing new: nothing to write)
        if opens:
            txn.status, txn.started_ms = "ongoing", now_ms
        txn.partitions |= partitions
        txn.groups |= groups
        return NONE

    def end(self, tid: str, producer_id: int, epoch: int, committed: bool,
            in_flight: bool = False) -> int:  # fmt: skip
        """``in_flight``: the markers are appended but not yet durable; the answer comes
        with :meth:`markers_durable` (this returns NONE meanwhile)."""
        error = self._check(tid, producer_id, epoch)
        if error:
            return error
        txn = self.txns[tid]
        if txn.pending:
            return CONCURRENT_TRANSACTIONS
        if txn.status == "ongoing":
            self._prepare(txn, committed)
            if not self._write_markers(txn):
                return COORDINATOR_NOT_AVAILABLE  # prepared; recovery finishes it
            if in_flight:
                txn.pending = True
                return NONE
            self._complete(txn)
            return NONE
        if txn.status == ("committed" if committed else "aborted"):
            return NONE  # a retry
        if txn.status == ("prepare_commit" if committed else "prepare_abort"):
            return CONCURRENT_TRANSACTIONS  # P1
        return INVALID_TXN_STATE

    def markers_durable(self, tid: str) -> None:
        txn = self.txns[tid]
        assert txn.pending
        txn.pending = False
        self._complete(txn)

    def recover(self, order: list[str]) -> None:
        """The coordinator's recovery pass, over its table in ``order`` (P3)."""
        for tid in order:
            txn = self.txns[tid]
            if txn.status.startswith("prepare") and not txn.pending and self._write_markers(txn):
                self._complete(txn)

    def restart(self) -> None:
        """P4: a marker round in flight is lost; every prepared id owes every marker."""
        for txn in self.txns.values():
            txn.pending = False
            if txn.status.startswith("prepare"):
                txn.owed = set(txn.partitions)

    def expire_timed_out(self, now_ms: int) -> None:
        # The coordinator aborts the oldest transaction first, ties by transactional id.
        for _, txn in sorted(self.txns.items(), key=lambda item: (item[1].started_ms, item[0])):
            # A pending transition (a write on its way) is left alone, as Kafka's
            # abortTimedOutTransactions skips it: the write lands first.
            if (
                txn.status == "ongoing"
                and not txn.pending
                and txn.started_ms + txn.timeout_ms < now_ms
            ):
                self._fence(txn)
                self._prepare(txn, committed=False)
                if self._write_markers(txn):
                    self._complete(txn)

    def expire_ids(self, expiration_ms: int) -> None:
        """E1."""
        for tid, txn in list(self.txns.items()):
            idle = self.now_ms - txn.updated_ms >= expiration_ms
            if idle and txn.status in ("empty", "committed", "aborted") and not txn.pending:
                del self.txns[tid]

    def _prepare(self, txn: ModelTxn, committed: bool) -> None:
        txn.status = "prepare_commit" if committed else "prepare_abort"
        txn.updated_ms = self.now_ms
        txn.owed = set(txn.partitions)

    def _write_markers(self, txn: ModelTxn) -> bool:
        """P3: in partition order, until one refuses; True once none is owed."""
        committed = txn.status == "prepare_commit"
        for tp in sorted(txn.owed):
            if tp in self.refusing:
                return False
            self.markers.setdefault(tp, []).append((txn.producer_id, txn.epoch, committed))
            txn.owed.discard(tp)
        return True

    def _complete(self, txn: ModelTxn) -> None:
        committed = txn.status == "prepare_commit"
        for group in sorted(txn.groups):
            self.group_outcomes.append((group, txn.producer_id, txn.epoch, committed))
        txn.status = "committed" if committed else "aborted"
        txn.updated_ms = self.now_ms
        txn.partitions, txn.groups = set(), set()

    def write_allowed(self, tid: str, producer_id: int, epoch: int, tp: tuple[str, int]) -> int:
        """Produce's check of a transactional batch (P2): only into an open transaction."""
        txn = self.txns.get(tid)
        if txn is None or txn.producer_id != producer_id:
            return INVALID_TXN_STATE
        if epoch < txn.epoch:
            return INVALID_PRODUCER_EPOCH
        if txn.status == "ongoing" and tp in txn.partitions:
            return NONE
        return INVALID_TXN_STATE
