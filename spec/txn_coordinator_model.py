"""Reference model of the transaction coordinator (one node, requests one at a time).

Deliberately small: per transactional id the producer id, the epoch, whether a
transaction is open (and its partitions and groups) or how the last one ended,
and the markers each partition should have received. It knows Kafka's answers
per state without the coordinator's transition table; the stateful test
(statemachine/test_txn_coordinator_machine.py) compares the two.
"""

from __future__ import annotations

import attrs

NONE = 0
INVALID_REQUEST = 42
INVALID_TXN_STATE = 48
INVALID_PRODUCER_ID_MAPPING = 49
INVALID_TRANSACTION_TIMEOUT = 50
CONCURRENT_TRANSACTIONS = 51
PRODUCER_FENCED = 90

#: (producer id, epoch, committed) per marker, in the order written.
Marker = tuple[int, int, bool]


@attrs.define
class ModelTxn:
    producer_id: int
    epoch: int
    #: "empty", "ongoing", "committed", "aborted"
    status: str = "empty"
    partitions: set[tuple[str, int]] = attrs.Factory(set)
    groups: set[str] = attrs.Factory(set)
    started_ms: int = -1
    timeout_ms: int = 0


@attrs.define
class ModelCoordinator:
    max_timeout_ms: int
    txns: dict[str, ModelTxn] = attrs.Factory(dict)
    markers: dict[tuple[str, int], list[Marker]] = attrs.Factory(dict)
    #: (group, producer id, epoch, committed) in the order the groups were told.
    group_outcomes: list[tuple[str, int, int, bool]] = attrs.Factory(list)

    def init(self, tid: str, timeout_ms: int, new_producer_id: int) -> tuple[int, int, int]:
        """(error, producer id, epoch) for InitProducerId from a new producer (-1/-1)."""
        if not tid:
            return INVALID_REQUEST, -1, -1
        if not 0 < timeout_ms <= self.max_timeout_ms:
            return INVALID_TRANSACTION_TIMEOUT, -1, -1
        txn = self.txns.get(tid)
        if txn is None:
            self.txns[tid] = ModelTxn(new_producer_id, 0, timeout_ms=timeout_ms)
            return NONE, new_producer_id, 0
        if txn.status == "ongoing":
            # Fence: the open transaction is aborted under the next epoch; retry.
            txn.epoch += 1
            self._finish(txn, committed=False)
            return CONCURRENT_TRANSACTIONS, -1, -1
        txn.epoch += 1
        txn.status = "empty"
        txn.timeout_ms = timeout_ms
        return NONE, txn.producer_id, txn.epoch

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
        if txn.status != "ongoing":
            txn.status, txn.started_ms = "ongoing", now_ms
        txn.partitions |= partitions
        txn.groups |= groups
        return NONE

    def end(self, tid: str, producer_id: int, epoch: int, committed: bool) -> int:
        error = self._check(tid, producer_id, epoch)
        if error:
            return error
        txn = self.txns[tid]
        if txn.status == "ongoing":
            self._finish(txn, committed)
            return NONE
        if txn.status == ("committed" if committed else "aborted"):
            return NONE  # a retry
        return INVALID_TXN_STATE

    def expire_timed_out(self, now_ms: int) -> None:
        # The coordinator aborts the oldest transaction first, ties by transactional id.
        for _, txn in sorted(self.txns.items(), key=lambda item: (item[1].started_ms, item[0])):
            if txn.status == "ongoing" and txn.started_ms + txn.timeout_ms < now_ms:
                txn.epoch += 1
                self._finish(txn, committed=False)

    def _finish(self, txn: ModelTxn, committed: bool) -> None:
        for tp in sorted(txn.partitions):
            self.markers.setdefault(tp, []).append((txn.producer_id, txn.epoch, committed))
        for group in sorted(txn.groups):
            self.group_outcomes.append((group, txn.producer_id, txn.epoch, committed))
        txn.status = "committed" if committed else "aborted"
        txn.partitions, txn.groups = set(), set()
