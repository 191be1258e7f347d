"""A node alone's group coordinator is a cluster of one's (issue 29): elected leader of
partition 0 of a one-partition ``__consumer_offsets`` at start, through the same entry a
cluster's replica manager calls, over ``<data_dir>/__consumer_offsets-0``."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from trio_broker.config import BrokerConfig
from trio_broker.groups.offsets_store import OFFSETS_LOG_NAME, OffsetAndMetadata, OffsetKey
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.server.broker import Broker
from trio_broker.services.internal_topics import CONSUMER_OFFSETS, TRANSACTION_STATE
from trio_broker.services.own_partition import OwnPartition


async def test_a_broker_alone_leads_its_one_offsets_partition(tmp_path: Path) -> None:
    # offsets.topic.num.partitions is a cluster's routing: alone there is one partition.
    config = BrokerConfig(port=0, data_dir=tmp_path, offsets_topic_num_partitions=7)
    broker = Broker(config)
    groups = broker.groups
    async with trio.open_nursery() as nursery:
        with trio.fail_after(30):
            await nursery.start(broker.run)  # returns once listening: the table is loaded
        assert list(groups.led) == [0]
        led = groups.led[0]
        assert led.store is not None and groups.offsets is led.store
        assert Path(led.log.directory) == tmp_path / OFFSETS_LOG_NAME  # type: ignore[attr-defined]
        for group_id in ("a", "b", "some-group", "x" * 40):
            assert groups.partition_of(group_id) == 0
            assert groups.coordinator_error(group_id) is ErrorCode.NONE
            assert groups.find_coordinator(group_id) == (ErrorCode.NONE, config.node_id)
        # One commit timeout for one broker and many.
        assert groups.commit_timeout_s == config.offsets_commit_timeout_ms / 1000
        # A commit goes through the led table and counts (synced).
        write = groups.append_offsets([(OffsetKey("a", "t", 0), OffsetAndMetadata(5))])
        await groups.wait_offsets_durable(write)
        assert groups.committed("a", "t", 0) == OffsetAndMetadata(5)
        # No catalogue topic is made for it: the file is the coordinator's own.
        assert CONSUMER_OFFSETS not in broker.topics.topics
        nursery.cancel_scope.cancel()
    assert groups.offsets is not None and groups.offsets.log.closed  # type: ignore[attr-defined]


def leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for sub in exc.exceptions for leaf in leaves(sub)]
    return [exc]


@pytest.mark.parametrize("topic", [CONSUMER_OFFSETS, TRANSACTION_STATE])
async def test_an_own_partition_that_cannot_be_opened_stops_the_start(
    tmp_path: Path, topic: str
) -> None:
    # As before the coordinators were elected: a broker alone without its offsets or
    # its transaction log does not start (nothing listens).
    broker = Broker(BrokerConfig(port=0, data_dir=tmp_path))
    own = next(s for s in broker.services if isinstance(s, OwnPartition) and s.topic == topic)

    def broken() -> None:
        raise OSError("disk gone")

    own._open_log = broken  # type: ignore[assignment]
    with pytest.raises(BaseException) as raised:
        async with trio.open_nursery() as nursery:
            with trio.fail_after(30):
                await nursery.start(broker.run)
    assert [str(e) for e in leaves(raised.value)] == ["disk gone"]
    assert broker.bound == []
