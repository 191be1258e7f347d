"""SyncGroup answers a generation's members together, once its assignment is durable.

A real in-process broker with file storage; two group members speak the wire protocol
over their own connections. The fsync of the offsets log is held (the flusher's
``sync`` hook, as in tests/reliability/test_fsync_faults.py) while the leader's
SyncGroup waits for the write of the generation, so the moment between "the leader's
assignment is in" and "it is durable" lasts as long as the test wants:

* a follower whose SyncGroup arrives in that moment waits; when the fsync completes,
  the leader and the follower are answered together and the group is Stable (the
  broker used to mark the group Stable at once and answer the late follower from
  memory, before the leader and before anything was durable: aiokafka's
  test_kip_345_enabled saw the follower's new assignment while the leader still
  owned every partition);
* if the fsync fails, both get NOT_COORDINATOR (Kafka's answer to a failed group
  metadata append on a storage error) and the group rebalances.
"""

from __future__ import annotations

import errno
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.integration.raw_client import RawClient
from tests.waits import eventually
from trio_broker.config import BrokerConfig
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.server.broker import Broker
from trio_broker.server.flusher import flush_log
from trio_broker.state.group import GroupState

GROUP = "held"
V_JOIN, V_SYNC, V_HEARTBEAT = 5, 3, 3  # what librdkafka and aiokafka send


@pytest.fixture
def broker_config(tmp_path: Path) -> BrokerConfig:
    return BrokerConfig(port=0, data_dir=tmp_path / "data", group_initial_rebalance_delay_ms=0)


class HeldFsync:
    """Holds every fsync of the offsets log in the flusher's worker thread until
    :meth:`release` (other logs are synced as usual). ``reached`` is set once an
    fsync is being held; ``fail`` makes the held fsync fail with EIO instead."""

    def __init__(self, broker: Broker) -> None:
        self.directory = broker.groups.store.log.directory
        self.reached = trio.Event()
        self._released = threading.Event()
        self._fail = False
        token = trio.lowlevel.current_trio_token()

        def sync(log: Any) -> int:
            if getattr(log, "directory", None) == self.directory:
                token.run_sync_soon(self.reached.set)
                self._released.wait(timeout=60)
                if self._fail:
                    raise OSError(errno.EIO, "held fsync fails")
            return flush_log(log)

        broker.flusher.sync = sync

    def release(self, fail: bool = False) -> None:
        self._fail = fail
        self._released.set()


class Member:
    """One group member on its own connection."""

    def __init__(self, client: RawClient, instance: str) -> None:
        self.client = client
        self.instance = instance
        self.member_id = ""
        self.generation = -1

    async def join(self) -> m.JoinGroupResponse:
        Join = m.JoinGroupRequest
        response = await self.client.call(m.ApiKey.JOIN_GROUP, V_JOIN, Join(
            group_id=GROUP, session_timeout_ms=30_000, rebalance_timeout_ms=30_000,
            member_id=self.member_id, group_instance_id=self.instance,
            protocol_type="consumer", reason=None,
            protocols=[Join.JoinGroupRequestProtocol(name="range", metadata=b"sub")],
        ))  # fmt: skip
        assert response.error_code == ErrorCode.NONE, response
        self.member_id, self.generation = response.member_id, response.generation_id
        return response

    async def sync(self, assignments: dict[str, bytes]) -> m.SyncGroupResponse:
        Sync = m.SyncGroupRequest
        return await self.client.call(m.ApiKey.SYNC_GROUP, V_SYNC, Sync(
            group_id=GROUP, generation_id=self.generation, member_id=self.member_id,
            group_instance_id=self.instance, protocol_type="consumer", protocol_name="range",
            assignments=[Sync.SyncGroupRequestAssignment(member_id=k, assignment=v)
                         for k, v in assignments.items()],
        ))  # fmt: skip

    async def heartbeat(self) -> int:
        response = await self.client.call(m.ApiKey.HEARTBEAT, V_HEARTBEAT, m.HeartbeatRequest(
            group_id=GROUP, generation_id=self.generation, member_id=self.member_id,
            group_instance_id=self.instance,
        ))  # fmt: skip
        return int(response.error_code)


async def connect(broker: Broker, instance: str) -> Member:
    return Member(RawClient(await trio.open_tcp_stream(*broker.bound[0]), instance), instance)


async def in_background(nursery: trio.Nursery, call: Callable[[], Any]) -> list[Any]:
    """Start ``call``; the returned list gets its result when it returns."""
    out: list[Any] = []

    async def run() -> None:
        out.append(await call())

    nursery.start_soon(run)
    return out


async def second_generation(broker: Broker, nursery: trio.Nursery) -> tuple[Member, Member]:
    """Leader ``a`` alone in a Stable generation 1, then ``b`` joins: generation 2 of both,
    ``a`` leading, nobody synced yet (the aiokafka test's second rebalance)."""
    a, b = await connect(broker, "instance-a"), await connect(broker, "instance-b")
    await a.join()
    assert (await a.sync({a.member_id: b"a-alone"})).error_code == ErrorCode.NONE
    joined_b = await in_background(nursery, b.join)
    group = broker.groups.groups[GROUP]
    await eventually(lambda: group.state is GroupState.PREPARING_REBALANCE, "b's join")
    assert await a.heartbeat() == ErrorCode.REBALANCE_IN_PROGRESS
    joined_a = await a.join()
    await eventually(lambda: bool(joined_b), "b's JoinGroup answer")
    assert joined_a.leader == a.member_id and a.generation == b.generation == 2
    return a, b


async def sync_both_while_held(
    broker: Broker, nursery: trio.Nursery, a: Member, b: Member, held: HeldFsync
) -> tuple[list[Any], list[Any]]:
    """The leader syncs, its write's fsync is held, then the follower syncs: neither
    may be answered while the generation is not durable."""
    synced_a = await in_background(nursery, lambda: a.sync({a.member_id: b"A", b.member_id: b"B"}))
    with trio.fail_after(10):
        await held.reached.wait()  # the generation's write is appended, its fsync held
    synced_b = await in_background(nursery, lambda: b.sync({}))
    group = broker.groups.groups[GROUP]
    await eventually(
        lambda: bool(synced_b) or group.members[b.member_id].awaiting_sync,
        "the broker to take b's SyncGroup",
    )
    assert not synced_b, f"the follower was answered before its generation was durable: {synced_b}"
    assert not synced_a and group.state is GroupState.COMPLETING_REBALANCE
    return synced_a, synced_b


@pytest.mark.timeout(300)
async def test_a_late_follower_is_answered_with_the_leader_once_durable(
    broker: Broker, nursery: trio.Nursery
) -> None:
    a, b = await second_generation(broker, nursery)
    held = HeldFsync(broker)
    try:
        synced_a, synced_b = await sync_both_while_held(broker, nursery, a, b, held)
    finally:
        held.release()
    await eventually(lambda: bool(synced_a and synced_b), "both SyncGroup answers")
    assert [(r.error_code, bytes(r.assignment)) for r in synced_a + synced_b] == [
        (ErrorCode.NONE, b"A"), (ErrorCode.NONE, b"B"),
    ]  # fmt: skip
    group = broker.groups.groups[GROUP]
    assert group.state is GroupState.STABLE and group.generation_id == 2
    stored = broker.groups.store.group_metadata(GROUP)
    assert stored is not None and stored.generation_id == 2
    assert {r.member_id: r.assignment for r in stored.members} == {
        a.member_id: b"A", b.member_id: b"B",
    }  # fmt: skip


@pytest.mark.timeout(300)
async def test_a_failed_write_answers_leader_and_follower_and_rebalances(
    broker: Broker, nursery: trio.Nursery
) -> None:
    a, b = await second_generation(broker, nursery)
    held = HeldFsync(broker)
    try:
        synced_a, synced_b = await sync_both_while_held(broker, nursery, a, b, held)
    finally:
        held.release(fail=True)
    await eventually(lambda: bool(synced_a and synced_b), "both SyncGroup answers")
    assert [r.error_code for r in synced_a + synced_b] == [ErrorCode.NOT_COORDINATOR] * 2
    group = broker.groups.groups[GROUP]
    assert group.state is GroupState.PREPARING_REBALANCE and group.generation_id == 2
    assert all(member.assignment == b"" for member in group.members.values())
    # Generation 1 is still what the log holds: a new coordinator would load that.
    stored = broker.groups.store.group_metadata(GROUP)
    assert stored is not None and stored.generation_id == 1


@pytest.mark.timeout(300)
async def test_an_offset_commit_whose_write_fails_is_answered_not_coordinator(
    broker: Broker, nursery: trio.Nursery
) -> None:
    """A node alone writes its offsets log as the leader of a cluster of one, on a
    cluster's write path: a disk error on a commit is answered NOT_COORDINATOR, Kafka's
    answer to a storage error on a group write (it was COORDINATOR_NOT_AVAILABLE alone),
    and nothing is committed. A second commit finds the log offline: NOT_COORDINATOR."""
    broker.topics.create("t", 1)
    client = RawClient(await trio.open_tcp_stream(*broker.bound[0]), "committer")
    Commit = m.OffsetCommitRequest
    Partition = Commit.OffsetCommitRequestTopic.OffsetCommitRequestPartition

    async def commit(offset: int) -> list[int]:
        response = await client.call(m.ApiKey.OFFSET_COMMIT, 8, Commit(
            group_id="simple", generation_id_or_member_epoch=-1, member_id="",
            group_instance_id=None, retention_time_ms=-1,
            topics=[Commit.OffsetCommitRequestTopic(name="t", partitions=[
                Partition(partition_index=0, committed_offset=offset, committed_metadata=None),
            ])],
        ))  # fmt: skip
        return [int(p.error_code) for t in response.topics for p in t.partitions]

    held = HeldFsync(broker)
    answered = await in_background(nursery, lambda: commit(5))
    try:
        with trio.fail_after(10):
            await held.reached.wait()  # appended, its fsync held
    finally:
        held.release(fail=True)
    await eventually(lambda: bool(answered), "the OffsetCommit answer")
    assert answered == [[ErrorCode.NOT_COORDINATOR]]
    assert broker.groups.committed("simple", "t", 0) is None
    assert await commit(6) == [ErrorCode.NOT_COORDINATOR]
