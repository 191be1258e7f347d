"""A node alone's transaction coordinator is a cluster of one's (issue 29): the
partitioned coordinator, elected leader of partition 0 of a one-partition
``__transaction_state`` at start, through the same entry a cluster's replica manager
calls, over ``<data_dir>/__transaction_state-0`` (or a memory log)."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from tests.unit.groups.test_own_offsets import leaves
from trio_broker.config import BrokerConfig
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.server.broker import Broker
from trio_broker.services.internal_topics import TRANSACTION_STATE
from trio_broker.services.own_partition import OwnPartition
from trio_broker.transactions.coordinator import TRANSACTION_LOG_NAME
from trio_broker.transactions.state import TxnState


def own_transactions(broker: Broker) -> OwnPartition:
    [own] = [
        s for s in broker.services if isinstance(s, OwnPartition) and s.topic == TRANSACTION_STATE
    ]
    return own


async def init(broker: Broker, tid: str, pid: int = -1, epoch: int = -1) -> tuple[int, int, int]:
    result = await broker.transactions.init_producer_id(
        tid, pid, epoch, 60_000, ErrorCode.PRODUCER_FENCED
    )
    return result.error, result.producer_id, result.producer_epoch


@pytest.mark.parametrize("storage", ["file", "memory"])
async def test_a_broker_alone_leads_its_one_transaction_state_partition(
    tmp_path: Path, storage: str
) -> None:
    # transaction.state.log.num.partitions is a cluster's routing: alone there is one.
    config = BrokerConfig(
        port=0, data_dir=tmp_path, storage=storage, transaction_state_log_num_partitions=7
    )
    broker = Broker(config)
    coordinator = broker.transactions
    own = own_transactions(broker)
    assert coordinator.replication is own
    async with trio.open_nursery() as nursery:
        with trio.fail_after(30):
            await nursery.start(broker.run)  # returns once listening: the table is loaded
        assert coordinator.num_partitions == 1 and list(coordinator.tables) == [0]
        table = coordinator.tables[0]
        assert table.log is own.log and table.coordinator_epoch == 0
        if storage == "file":
            assert Path(table.log.directory) == tmp_path / TRANSACTION_LOG_NAME  # type: ignore[attr-defined]
        assert TRANSACTION_STATE not in broker.topics.topics  # the coordinator's own file
        for tid in ("a", "b", "some-id", "x" * 40):
            assert coordinator.partition_of(tid) == 0
            assert coordinator.table_for(tid) is table
        # FindCoordinator's question: this broker leads the one partition.
        info = own.partition(TRANSACTION_STATE, 0)
        assert info is not None and info.leader == config.node_id
        assert own.partition(TRANSACTION_STATE, 1) is None
        assert not own.about_to_lead(TRANSACTION_STATE, 0)
        error, pid, epoch = await init(broker, "a")
        assert (error, epoch) == (ErrorCode.NONE, 0)
        meta = coordinator.get("a")
        assert meta is not None and meta.state == TxnState.EMPTY
        # A producer this broker does not coordinate is in no transaction: it coordinates
        # every id.
        unknown = coordinator.partition_in_transaction(pid + 1000, 0, "t", 0)
        assert unknown == ErrorCode.INVALID_TXN_STATE
        nursery.cancel_scope.cancel()
    assert own.log is None  # closed with the broker
    assert table.log.closed  # type: ignore[attr-defined]


async def test_the_table_is_read_back_after_a_restart(tmp_path: Path) -> None:
    config = BrokerConfig(port=0, data_dir=tmp_path)
    for round_ in range(2):
        broker = Broker(config)
        async with trio.open_nursery() as nursery:
            with trio.fail_after(30):
                await nursery.start(broker.run)
            if round_ == 0:
                first = await init(broker, "kept")
                assert first[0] == ErrorCode.NONE
            else:
                # The id's record was replayed: the same producer id, its epoch bumped.
                assert await init(broker, "kept", first[1], first[2]) == (
                    ErrorCode.NONE, first[1], first[2] + 1
                )  # fmt: skip
            nursery.cancel_scope.cancel()


async def test_a_table_that_cannot_be_loaded_stops_the_start(tmp_path: Path) -> None:
    broker = Broker(BrokerConfig(port=0, data_dir=tmp_path))

    def unloadable(*args: object) -> object:
        raise OSError("unreadable segment")

    broker.transactions.make_table = unloadable  # type: ignore[assignment]
    with pytest.raises(BaseException) as raised:
        async with trio.open_nursery() as nursery:
            with trio.fail_after(30):
                await nursery.start(broker.run)
    assert [str(e) for e in leaves(raised.value)] == [
        f"could not load {TRANSACTION_STATE}-0 (see the log)"
    ]
    assert broker.bound == []
