"""Classic members in a consumer-protocol group (KIP-848's migration), the pure state
(state/consumer_group.py): JoinGroup, SyncGroup, Heartbeat and LeaveGroup of a member
that speaks the classic protocol, assigned by the group's server-side assignor; the
upgrade of a classic group and the record of a downgraded one.
"""

from __future__ import annotations

import pytest

from trio_broker.protocol.consumer_protocol import (
    decode_assignment,
    decode_subscription,
    encode_assignment,
    encode_subscription,
)
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.state.consumer_group import (
    ClassicJoin,
    ConsumerGroup,
    ConsumerGroupConfig,
    Heartbeat,
    MemberState,
)
from trio_broker.state.group import Group, GroupConfig, GroupState, JoinRequest

TOPICS = {"t": 4}
ALL = frozenset(("t", p) for p in range(4))
SESSION, REBALANCE = 10_000, 30_000


def classic_join(
    group: ConsumerGroup, member_id: str, now: int = 0, *, owned: frozenset = frozenset(),
    version: int = 1, protocol_type: str = "consumer", new_id: str = "new",
    v4: bool = False, instance: str | None = None,
) -> object:  # fmt: skip
    metadata = encode_subscription(["t"], version, owned)
    request = ClassicJoin(
        member_id, instance, protocol_type, (("range", metadata), ("roundrobin", metadata)),
        SESSION, REBALANCE, "client", "/127.0.0.1", require_known_member_id=v4,
    )  # fmt: skip
    return group.classic_join(request, now, TOPICS, new_id)


def consumer_join(group: ConsumerGroup, member_id: str, now: int = 0) -> int:
    result = group.heartbeat(
        Heartbeat(member_id, 0, rebalance_timeout_ms=REBALANCE, subscribed=("t",),
                  owned=frozenset()),
        now, TOPICS, member_id,
    )  # fmt: skip
    assert result.error is ErrorCode.NONE, result
    return result.member_epoch


def consumer_beat(group: ConsumerGroup, member_id: str, now: int = 0) -> frozenset:
    member = group.members[member_id]
    result = group.heartbeat(
        Heartbeat(member_id, member.epoch, owned=member.assigned), now, TOPICS, member_id
    )
    assert result.error is ErrorCode.NONE, result
    return group.members[member_id].assigned


def synced(group: ConsumerGroup, member_id: str, now: int = 0) -> frozenset:
    generation = group.members[member_id].epoch
    result = group.classic_sync(member_id, None, generation, "consumer", "range", now)
    assert result.error is ErrorCode.NONE, result
    return decode_assignment(result.assignment)


def test_protocol_codec_round_trips() -> None:
    owned = frozenset({("a", 1), ("b", 0)})
    sub = decode_subscription(encode_subscription(["b", "a"], 1, owned))
    assert sub.topics == ("a", "b") and sub.owned == owned and sub.version == 1
    assert decode_subscription(encode_subscription(["a"], 0)).owned == frozenset()
    assert decode_assignment(encode_assignment(owned, 3)) == owned
    assert decode_assignment(b"") == frozenset()


@pytest.mark.parametrize("data", [b"\x00", b"\x00\x01\x7f\xff\xff\xff", b"\xff\xff"])
def test_malformed_metadata_is_a_value_error(data: bytes) -> None:
    with pytest.raises(ValueError):
        decode_subscription(data)


def test_a_classic_member_shares_the_partitions_with_a_consumer_member() -> None:
    group = ConsumerGroup("g")
    consumer_join(group, "modern")
    assert consumer_beat(group, "modern") == ALL
    joined = classic_join(group, "", new_id="old")
    # No leader: the coordinator assigns; the generation is the member's epoch.
    assert joined.error is ErrorCode.NONE and joined.leader_id == "" and not joined.members
    assert joined.member_id == "old" and joined.protocol_name == "range"
    assert joined.generation_id == group.members["old"].epoch == group.group_epoch
    # All four partitions are still the consumer member's: the classic one waits for them.
    assert synced(group, "old") == frozenset()
    assert group.members["old"].state is MemberState.UNRELEASED_PARTITIONS
    assert group.classic_heartbeat("old", None, joined.generation_id, 1) is ErrorCode.NONE
    modern = consumer_beat(group, "modern", 1)  # asked to revoke two
    assert group.members["modern"].state is MemberState.UNREVOKED_PARTITIONS
    modern = consumer_beat(group, "modern", 2)  # released them
    assert len(modern) == 2
    # The partitions held back are free now: the classic member is told to rejoin.
    assert group.classic_heartbeat("old", None, joined.generation_id, 3) is (
        ErrorCode.REBALANCE_IN_PROGRESS
    )
    again = classic_join(group, "old", 4)
    assert again.error is ErrorCode.NONE
    old = synced(group, "old", 4)
    assert old | modern == ALL and not old & modern and len(old) == 2


def test_an_eager_classic_member_revokes_by_rejoining_without_its_partitions() -> None:
    group = ConsumerGroup("g")
    consumer_join(group, "modern")
    first = classic_join(group, "", new_id="old")
    consumer_beat(group, "modern", 1)
    consumer_beat(group, "modern", 2)
    classic_join(group, "old", 3)
    assert len(synced(group, "old", 3)) == 2
    generation = group.members["old"].epoch
    consumer_join(group, "third", 4)  # the group epoch moves on
    assert first.generation_id == generation < group.group_epoch
    assert group.classic_heartbeat("old", None, generation, 5) is ErrorCode.REBALANCE_IN_PROGRESS
    # A SyncGroup of the old generation is told to rejoin too.
    assert group.classic_sync("old", None, generation, None, None, 5).error is (
        ErrorCode.REBALANCE_IN_PROGRESS
    )
    classic_join(group, "old", 6)  # v1 subscription, nothing owned: it revoked everything
    member = group.members["old"]
    assert member.state is not MemberState.UNREVOKED_PARTITIONS
    assert member.epoch == group.group_epoch


def test_a_cooperative_classic_member_keeps_its_epoch_until_it_released() -> None:
    group = ConsumerGroup("g")
    classic_join(group, "", new_id="old")
    assert synced(group, "old") == ALL
    epoch = group.members["old"].epoch
    consumer_join(group, "modern", 1)
    assert group.classic_heartbeat("old", None, epoch, 1) is ErrorCode.REBALANCE_IN_PROGRESS
    # It rejoins still owning everything: it must give two partitions up first.
    rejoined = classic_join(group, "old", 2, owned=ALL)
    assert rejoined.generation_id == epoch
    assert group.members["old"].state is MemberState.UNREVOKED_PARTITIONS
    kept = synced(group, "old", 2)  # answered without the partitions to revoke
    assert len(kept) == 2
    classic_join(group, "old", 3, owned=kept)  # released them
    assert group.members["old"].epoch == group.group_epoch
    assert len(consumer_beat(group, "modern", 4)) == 2


def test_classic_members_answers_as_kafka() -> None:
    group = ConsumerGroup("g")
    consumer_join(group, "modern")
    required = classic_join(group, "", v4=True, new_id="fresh")
    assert required.error is ErrorCode.MEMBER_ID_REQUIRED and required.member_id == "fresh"
    assert "fresh" not in group.members  # no pending ids kept
    assert classic_join(group, "", protocol_type="connect").error is (
        ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    )
    # The id handed out joins (Kafka keeps no pending ids: any id does).
    assert classic_join(group, "fresh").error is ErrorCode.NONE
    joined = classic_join(group, "", new_id="old")
    generation = joined.generation_id
    assert group.classic_heartbeat("old", None, generation + 1, 0) is ErrorCode.ILLEGAL_GENERATION
    assert group.classic_heartbeat("modern", None, 1, 0) is ErrorCode.UNKNOWN_MEMBER_ID
    assert group.classic_sync("old", None, generation, "consumer", "roundrobin", 0).error is (
        ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    )
    # Commits: a classic member's generation must be its epoch, any OffsetCommit version.
    group.validate_offset_commit("old", generation, 2)
    with pytest.raises(Exception, match="generation"):
        group.validate_offset_commit("old", generation - 1, 8)
    assert group.classic_leave("old", None) is ErrorCode.NONE
    assert "old" not in group.members
    assert group.classic_leave("old", None) is ErrorCode.UNKNOWN_MEMBER_ID


def test_a_classic_member_is_fenced_by_its_session_and_by_its_join_timeout() -> None:
    group = ConsumerGroup("g", ConsumerGroupConfig(session_timeout_ms=45_000))
    consumer_join(group, "modern")
    joined = classic_join(group, "", new_id="old")
    # Its JoinGroup's session (10 s), not the group's 45 s; a SyncGroup must come first.
    assert group.next_deadline() == SESSION
    synced(group, "old", 1)
    assert group.advance_to(SESSION) == []  # renewed by the SyncGroup at 1
    assert group.advance_to(SESSION + 1) == ["old"]
    # Asked to rejoin and never does: fenced after its rebalance timeout.
    joined = classic_join(group, "", SESSION + 2, new_id="late")
    synced(group, "late", SESSION + 2)
    consumer_join(group, "third", SESSION + 3)
    t = SESSION + 4
    assert group.classic_heartbeat("late", None, joined.generation_id, t) is (
        ErrorCode.REBALANCE_IN_PROGRESS
    )
    for step in range(1, REBALANCE // SESSION + 1):  # heartbeats keep its session alive
        group.classic_heartbeat("late", None, joined.generation_id, t + step * (SESSION - 1))
    fenced = group.advance_to(t + REBALANCE)
    assert "late" in fenced


def test_classic_members_survive_the_snapshot() -> None:
    group = ConsumerGroup("g")
    consumer_join(group, "modern")
    classic_join(group, "", new_id="old")
    raw = group.encode()
    back = ConsumerGroup.decode("g", raw, ConsumerGroupConfig(), 100)
    member = back.members["old"]
    assert member.classic == group.members["old"].classic
    assert member.session_deadline_ms == 100 + SESSION
    assert back.members["modern"].classic is None
    assert back.encode() == raw


def stable_classic_group() -> Group:
    """A Stable classic group of two consumer members, t-0/t-1 and t-2/t-3."""
    group = Group("g", GroupConfig(initial_rebalance_delay_ms=0))
    for member_id in ("a", "b"):
        metadata = encode_subscription(["t"], 1)
        request = JoinRequest("", None, "client", "/h", SESSION, REBALANCE, "consumer",
                              (("range", metadata),), require_known_member_id=False)  # fmt: skip
        group.join(request, 0, member_id, waiter=member_id)
    group.advance_to(0)  # no initial delay: the join phase ends
    assert group.state is GroupState.COMPLETING_REBALANCE
    assignments = {
        "a": encode_assignment({("t", 0), ("t", 1)}, 1),
        "b": encode_assignment({("t", 2), ("t", 3)}, 1),
    }
    leader = group.leader_id
    assert leader is not None
    out = group.sync(leader, None, group.generation_id, None, None, assignments, 0, "s")
    assert out.store is not None
    group.store_completed(group.generation_id, ErrorCode.NONE, 0)
    assert group.state is GroupState.STABLE
    return group


def test_upgrade_keeps_the_classic_members_and_their_partitions() -> None:
    classic = stable_classic_group()
    group = ConsumerGroup.from_classic(classic, ConsumerGroupConfig(), 0)
    generation = classic.generation_id
    assert group.group_epoch == group.assignment_epoch == generation
    assert group.members["a"].assigned == {("t", 0), ("t", 1)}
    assert group.members["b"].epoch == generation
    assert all(m.classic is not None for m in group.members.values())
    # They heartbeat on with their generation until something changes.
    assert group.classic_heartbeat("a", None, generation, 1) is ErrorCode.NONE
    consumer_join(group, "modern", 2)
    assert group.classic_heartbeat("a", None, generation, 3) is ErrorCode.REBALANCE_IN_PROGRESS
    # Nothing is held by two members meanwhile: the new one waits for the partitions.
    assert len(group.owners) == 4


def test_the_downgrade_record_is_a_classic_generation() -> None:
    group = ConsumerGroup.from_classic(stable_classic_group(), ConsumerGroupConfig(), 0)
    record = group.classic_record(group.group_epoch)
    assert record.protocol_type == "consumer" and record.protocol_name == "range"
    assert record.generation_id == group.group_epoch and record.leader_id == "a"
    restored = Group.restore("g", record, GroupConfig(), 0)
    assert restored.state is GroupState.STABLE
    assigned = {m.member_id: decode_assignment(m.assignment) for m in restored.members.values()}
    assert assigned == {"a": {("t", 0), ("t", 1)}, "b": {("t", 2), ("t", 3)}}
    restored.rebalance(1)
    assert restored.state is GroupState.PREPARING_REBALANCE
