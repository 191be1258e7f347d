"""The transaction coordinator's pure rules (transactions/state.py), edge by edge.

The coordinator machine (statemachine/test_txn_coordinator_machine.py) drives these
through the coordinator; the cases here are the ones mutation testing showed it never
reaches: an exhausted producer epoch, a transaction started at time 0, and the
bookkeeping (last update, previous producer) that expiry and KIP-360 retries read.
"""

from __future__ import annotations

import attrs
import pytest

from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.transactions.state import (
    EXHAUSTED_PRODUCER_EPOCH,
    MAX_PRODUCER_EPOCH,
    Decision,
    IllegalTransition,
    TxnMetadata,
    TxnState,
    decide_end,
    decide_init,
    expired,
    fence_for_timeout,
    timed_out,
)

S = TxnState


def _init(
    current: TxnMetadata | None, now_ms: int, name: str = "t", **kw: int
) -> tuple[ErrorCode, TxnMetadata | None]:
    ids = iter(range(100, 200))
    decision = decide_init(
        current,
        transactional_id=name,
        pending=False,
        producer_id=kw.get("producer_id", -1),
        producer_epoch=kw.get("producer_epoch", -1),
        timeout_ms=kw.get("timeout_ms", 1000),
        max_timeout_ms=60_000,
        now_ms=now_ms,
        fresh_id=lambda: next(ids),
        fenced_error=ErrorCode.PRODUCER_FENCED,
    )
    return decision.error, decision.target


@pytest.mark.parametrize("epoch", [EXHAUSTED_PRODUCER_EPOCH, MAX_PRODUCER_EPOCH])
@pytest.mark.parametrize("state", [S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT])
def test_an_exhausted_epoch_gets_a_new_producer_id_at_epoch_0(state: TxnState, epoch: int) -> None:
    """As Kafka: at the last epoch handed out (32766), or the fencing one above it,
    InitProducerId hands out a fresh id (epoch 0) and remembers the old pair, so that
    the client's retry of it is recognised."""
    current = TxnMetadata("t", 7, producer_epoch=epoch, state=state)
    error, target = _init(current, now_ms=50)
    assert error is ErrorCode.NONE and target is not None
    assert (target.producer_id, target.producer_epoch) == (100, 0)
    assert (target.last_producer_id, target.last_producer_epoch) == (7, epoch)
    assert (target.state, target.last_update_ms) == (S.EMPTY, 50)
    # The client retries with the pair it had: answered with the new one, nothing written.
    error, again = _init(target, now_ms=60, producer_id=7, producer_epoch=epoch)
    assert (error, again) == (ErrorCode.NONE, None)


def test_one_epoch_below_the_last_is_still_bumped_in_place() -> None:
    current = TxnMetadata("t", 7, producer_epoch=EXHAUSTED_PRODUCER_EPOCH - 1)
    _, target = _init(current, now_ms=0)
    assert target is not None
    assert (target.producer_id, target.producer_epoch) == (7, EXHAUSTED_PRODUCER_EPOCH)
    assert (target.last_producer_id, target.last_producer_epoch) == (
        7, EXHAUSTED_PRODUCER_EPOCH - 1,
    )  # fmt: skip


def test_a_fence_at_the_last_epoch_handed_out_uses_short_max() -> None:
    """Kafka's prepareFenceProducerEpoch: one more bump, to 32767, which no client holds."""
    current = TxnMetadata("t", 7, producer_epoch=EXHAUSTED_PRODUCER_EPOCH, state=S.ONGOING)
    decision = decide_init(
        current, transactional_id="t", pending=False, producer_id=-1, producer_epoch=-1,
        timeout_ms=1000, max_timeout_ms=60_000, now_ms=5, fresh_id=lambda: 100,
        fenced_error=ErrorCode.PRODUCER_FENCED,
    )  # fmt: skip
    assert decision.fence_and_abort and decision.target is not None
    fencing = decision.target
    assert (fencing.state, fencing.producer_id, fencing.producer_epoch) == (
        S.PREPARE_EPOCH_FENCE, 7, MAX_PRODUCER_EPOCH,
    )  # fmt: skip
    timed_out_fence = fence_for_timeout(current, 5)
    assert timed_out_fence.producer_epoch == MAX_PRODUCER_EPOCH
    # The fenced producer's re-init with its epoch is no retry: fenced.
    aborted = fencing.to(S.PREPARE_ABORT, 6).to(S.COMPLETE_ABORT, 7)
    assert _init(aborted, now_ms=8, producer_id=7, producer_epoch=EXHAUSTED_PRODUCER_EPOCH)[0] is (
        ErrorCode.PRODUCER_FENCED
    )


@pytest.mark.parametrize(("pid", "epoch"), [(7, -1), (-1, 3)])
def test_only_one_of_id_and_epoch_is_invalid(pid: int, epoch: int) -> None:
    current = TxnMetadata("t", 7, producer_epoch=3, last_producer_id=7, state=S.COMPLETE_ABORT)
    assert _init(current, now_ms=0, producer_id=pid, producer_epoch=epoch)[0] is (
        ErrorCode.INVALID_REQUEST
    )


def test_every_transition_stamps_its_time_and_expiry_counts_from_it() -> None:
    meta = TxnMetadata("t", 1, producer_epoch=0, last_update_ms=0)
    ongoing = meta.to(S.ONGOING, 1_000, start_ms=1_000)
    assert ongoing.last_update_ms == 1_000
    committed = ongoing.to(S.PREPARE_COMMIT, 2_000).to(S.COMPLETE_COMMIT, 2_500)
    assert committed.last_update_ms == 2_500
    assert not expired(committed, 2_500 + 9_999, expiration_ms=10_000)
    assert expired(committed, 2_500 + 10_000, expiration_ms=10_000)


def test_a_forbidden_transition_names_the_id_and_both_states() -> None:
    with pytest.raises(IllegalTransition, match=r"^t: EMPTY -> COMPLETE_COMMIT$"):
        TxnMetadata("t", 1).to(S.COMPLETE_COMMIT, 0)


def test_a_transaction_started_at_time_0_times_out() -> None:
    meta = TxnMetadata("t", 1, producer_epoch=0, state=S.ONGOING, start_ms=0, timeout_ms=100)
    assert not timed_out(meta, 100)
    assert timed_out(meta, 101)
    assert not timed_out(TxnMetadata("t", 1, state=S.ONGOING, start_ms=-1), 10**9)


def test_a_timeout_fence_bumps_the_epoch_and_forgets_the_fenced_one() -> None:
    """As Kafka's prepareFenceProducerEpoch (last epoch -1): the fenced producer's
    InitProducerId with its old epoch is PRODUCER_FENCED, not a retry."""
    meta = TxnMetadata("t", 4, producer_epoch=3, state=S.ONGOING, start_ms=0, timeout_ms=10)
    fenced = fence_for_timeout(meta, 500)
    assert (fenced.state, fenced.producer_id, fenced.producer_epoch) == (
        S.PREPARE_EPOCH_FENCE, 4, 4,
    )  # fmt: skip
    assert (fenced.last_producer_id, fenced.last_producer_epoch) == (4, -1)
    assert fenced.last_update_ms == 500


def _end(current: TxnMetadata, *, pending: bool = False, committed: bool = True) -> Decision:
    return decide_end(current, pending=pending, producer_id=current.producer_id,
                      producer_epoch=current.producer_epoch, committed=committed, now_ms=9,
                      fenced_error=ErrorCode.PRODUCER_FENCED)  # fmt: skip


@pytest.mark.parametrize("committed", [True, False])
def test_end_txn_waits_for_a_pending_write_or_a_fence(committed: bool) -> None:
    """The coordinator machine completes every write at once, so it never asks these."""
    ongoing = TxnMetadata("t", 1, producer_epoch=0, state=S.ONGOING, start_ms=0)
    busy = _end(ongoing, pending=True, committed=committed)
    assert (busy.error, busy.target) == (ErrorCode.CONCURRENT_TRANSACTIONS, None)
    fencing = attrs.evolve(ongoing, state=S.PREPARE_EPOCH_FENCE)
    fenced = _end(fencing, committed=committed)
    assert (fenced.error, fenced.target) == (ErrorCode.CONCURRENT_TRANSACTIONS, None)
    done = _end(ongoing, committed=committed)
    assert done.error is ErrorCode.NONE and done.target is not None
    assert done.target.state is (S.PREPARE_COMMIT if committed else S.PREPARE_ABORT)
    assert done.target.last_update_ms == 9


def test_init_accepts_timeouts_and_names_up_to_their_limits() -> None:
    for timeout_ms in (1, 60_000):
        error, target = _init(None, now_ms=0, timeout_ms=timeout_ms)
        assert error is ErrorCode.NONE and target is not None
        assert target.timeout_ms == timeout_ms
    for timeout_ms in (0, 60_001):
        assert _init(None, now_ms=0, timeout_ms=timeout_ms)[0] is (
            ErrorCode.INVALID_TRANSACTION_TIMEOUT
        )
    assert _init(None, now_ms=0, name="n" * 32767)[0] is ErrorCode.NONE
    assert _init(None, now_ms=0, name="n" * 32768)[0] is ErrorCode.INVALID_REQUEST


def test_a_reinit_takes_the_new_timeout_and_a_kip_360_bump_keeps_the_id() -> None:
    current = TxnMetadata("t", 7, producer_epoch=4, state=S.COMPLETE_ABORT, timeout_ms=1000)
    error, target = _init(current, now_ms=30, timeout_ms=5000, producer_id=7, producer_epoch=4)
    assert error is ErrorCode.NONE and target is not None
    assert (target.producer_id, target.producer_epoch, target.timeout_ms) == (7, 5, 5000)
    assert (target.state, target.partitions, target.start_ms) == (S.EMPTY, frozenset(), -1)


def test_an_init_that_fences_an_open_transaction_stamps_its_time() -> None:
    current = TxnMetadata("t", 7, producer_epoch=4, state=S.ONGOING, start_ms=0)
    error, target = _init(current, now_ms=77)
    assert error is ErrorCode.CONCURRENT_TRANSACTIONS and target is not None
    assert (target.state, target.producer_epoch, target.last_update_ms) == (
        S.PREPARE_EPOCH_FENCE, 5, 77,
    )  # fmt: skip
