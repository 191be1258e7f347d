"""Share group membership (trio_broker/state/share_group.py) and share sessions
(trio_broker/groups/share.py): the rules without a broker."""

from __future__ import annotations

import uuid

from hypothesis import given
from hypothesis import strategies as st

from trio_broker.groups.share import ShareGroups, ShareGroupsConfig
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.state.share_group import ShareGroup, ShareHeartbeat, simple_assignment

META = {"t": 2, "u": 1}
#: What ShareGroups is told: each topic's id too (share partitions are keyed by it).
TOPIC_IDS = {"t": uuid.UUID(int=1), "u": uuid.UUID(int=2)}
META_WITH_IDS = {name: (TOPIC_IDS[name], count) for name, count in META.items()}


def join(group: ShareGroup, member: str, topics: tuple[str, ...], now: int = 0) -> int:
    result = group.heartbeat(ShareHeartbeat(member, 0, None, topics), META, now)
    assert result.error is ErrorCode.NONE
    return result.member_epoch


def test_members_split_the_partitions_and_share_them_when_more() -> None:
    group = ShareGroup("g")
    epoch_a = join(group, "a", ("t",))
    epoch_b = join(group, "b", ("t", "u"))
    # Subscriptions differ: each topic is dealt among its own subscribers.
    assert group.target == {"a": {("t", 0)}, "b": {("t", 1), ("u", 0)}}
    assert group.members["b"].assignment == {("t", 1), ("u", 0)}
    # a learns its share (and the new epoch) from its own next heartbeat, which carries
    # the epoch it was given (nothing to revoke, nothing to wait for).
    assert group.members["a"].assignment == {("t", 0), ("t", 1)}
    moved = group.heartbeat(ShareHeartbeat("a", epoch_a, None, None), META, 1)
    assert moved.error is ErrorCode.NONE and moved.member_epoch == epoch_b == group.group_epoch
    assert moved.assignment == group.members["a"].assignment == {("t", 0)}
    steady = group.heartbeat(ShareHeartbeat("a", epoch_b, None, None), META, 1)
    assert steady.error is ErrorCode.NONE and steady.member_epoch == epoch_b
    left = group.heartbeat(ShareHeartbeat("b", -1, None, None), META, 2)
    assert left.error is ErrorCode.NONE and left.member_epoch == -1
    assert list(group.members) == ["a"] and group.group_epoch == epoch_b + 1
    assert group.target == {"a": {("t", 0), ("t", 1)}}


@given(members=st.integers(1, 7), partitions=st.integers(0, 7))
def test_the_simple_assignment_is_balanced(members: int, partitions: int) -> None:
    ids = [f"m{i}" for i in range(members)]
    out = simple_assignment(dict.fromkeys(ids, ("t",)), {"t": partitions})
    per_member = [len(out[m]) for m in ids]
    sharers = [sum((("t", p) in out[m]) for m in ids) for p in range(partitions)]
    if partitions:
        assert min(sharers) >= 1 and max(sharers) - min(sharers) <= 1
        assert min(per_member) >= 1 and max(per_member) - min(per_member) <= 1
        assert max(sharers) == -(-members // partitions)  # ceil: Kafka's desired sharing
    else:
        assert per_member == [0] * members


def test_members_keep_the_epoch_they_were_given_until_they_heartbeat() -> None:
    """Kafka's rule: a member heartbeats with the epoch it was last given (or the one
    before: the answer that raised it may have been lost); another member joining does
    not fence it. Any other epoch is fenced."""
    group = ShareGroup("g")
    first = join(group, "a", ("t",))
    for other in ("b", "c"):
        join(group, other, ("t",))
    assert group.members["a"].member_epoch == first < group.group_epoch
    moved = group.heartbeat(ShareHeartbeat("a", first, None, None), META, 1)
    assert moved.error is ErrorCode.NONE and moved.member_epoch == group.group_epoch
    # The answer was lost: the member sends the epoch before again.
    again = group.heartbeat(ShareHeartbeat("a", first, None, None), META, 2)
    assert again.error is ErrorCode.NONE and again.member_epoch == group.group_epoch
    between = group.heartbeat(ShareHeartbeat("a", first + 1, None, None), META, 3)
    assert between.error is ErrorCode.FENCED_MEMBER_EPOCH


def test_sessions_run_out_and_epochs_are_checked() -> None:
    group = ShareGroup("g", session_timeout_ms=100)
    epoch = join(group, "a", ("t",), now=0)
    stale = group.heartbeat(ShareHeartbeat("a", epoch + 1, None, None), META, 10)
    assert stale.error is ErrorCode.FENCED_MEMBER_EPOCH
    assert group.expire(99) == []
    assert group.expire(100) == ["a"] and group.state == "Empty"
    gone = group.heartbeat(ShareHeartbeat("a", epoch, None, None), META, 101)
    assert gone.error is ErrorCode.UNKNOWN_MEMBER_ID


def test_an_expired_member_gives_back_what_it_held() -> None:
    shares = ShareGroups(ShareGroupsConfig(session_timeout_ms=100, record_lock_duration_ms=10_000))
    hb = ShareHeartbeat("a", 0, None, ("t",))
    assert shares.heartbeat("g", hb, META_WITH_IDS, lambda t, p, r: 7, 0).error is ErrorCode.NONE
    share_partition = shares.partition("g", TOPIC_IDS["t"], 0)
    assert share_partition is not None and share_partition.start_offset == 7  # the log end
    shares.open_session("g", "a")
    runs = share_partition.acquire("a", 10, 5, 0)
    assert [(r.first_offset, r.last_offset, r.delivery_count) for r in runs] == [(7, 9, 1)]
    assert shares.group("g", 100) is not None  # the member's session ran out here
    assert shares.session("g", "a") is None
    again = share_partition.acquire("b", 10, 5, 101)
    assert [(r.first_offset, r.last_offset, r.delivery_count) for r in again] == [(7, 9, 2)]


def test_a_leave_keeps_the_share_session_and_its_connection_ends_it() -> None:
    shares = ShareGroups(ShareGroupsConfig(record_lock_duration_ms=10_000))
    hb = ShareHeartbeat("a", 0, None, ("t",))
    assert shares.heartbeat("g", hb, META_WITH_IDS, lambda t, p, r: 0, 0).error is ErrorCode.NONE
    share_partition = shares.partition("g", TOPIC_IDS["t"], 0)
    assert share_partition is not None
    shares.open_session("g", "a", connection_id=7)
    assert [r.last_offset for r in share_partition.acquire("a", 3, 5, 0)] == [2]
    leave = ShareHeartbeat("a", -1, None, None)
    assert shares.heartbeat("g", leave, META_WITH_IDS, lambda t, p, r: 0, 1).error is ErrorCode.NONE
    # The session's last acknowledgements may still come (librdkafka sends them with the
    # leave): the session and what it holds outlive the leave.
    assert shares.session_error("g", "a", -1) is ErrorCode.NONE
    assert share_partition.acquire("b", 3, 5, 2) == []
    shares.connection_closed(8)  # another connection: nothing changes
    assert shares.session("g", "a") is not None
    shares.connection_closed(7)
    assert shares.session("g", "a") is None
    again = share_partition.acquire("b", 3, 5, 3)
    assert [(r.first_offset, r.last_offset, r.delivery_count) for r in again] == [(0, 2, 2)]


def test_only_assignable_partitions_are_assigned_and_the_target_follows_them() -> None:
    """Kafka assigns a share group's partitions whose share state is initialized only;
    when more become assignable (or fewer: a topic created again under its name), the
    group epoch rises and the target follows, at the member's next heartbeat."""
    group = ShareGroup("g")
    none_yet: dict[str, frozenset[int]] = {}
    joined = group.heartbeat(ShareHeartbeat("a", 0, None, ("t",)), META, 0, none_yet)
    assert (joined.error, joined.assignment) == (ErrorCode.NONE, frozenset())
    # Nothing changed: the same epoch.
    again = group.heartbeat(ShareHeartbeat("a", joined.member_epoch, None, None), META, 1, none_yet)
    assert again.member_epoch == joined.member_epoch
    one = {"t": frozenset({1})}
    got = group.heartbeat(ShareHeartbeat("a", joined.member_epoch, None, None), META, 2, one)
    assert got.member_epoch > joined.member_epoch
    assert got.assignment == frozenset({("t", 1)})
    # A second member while only t-1 is assignable shares it; when t-0 becomes
    # assignable too (its initialization finished during b's heartbeat), b catches up.
    b = group.heartbeat(ShareHeartbeat("b", 0, None, ("t",)), META, 3, one)
    assert b.assignment == frozenset({("t", 1)})
    caught_up = group.catch_up("b", META, {"t": frozenset({0, 1})})
    assert caught_up is not None and caught_up.member_epoch > b.member_epoch
    assert caught_up.assignment is not None and len(caught_up.assignment) == 1
    assert group.assigned_partitions() == {"t": frozenset({0, 1})}
    # No longer assignable (the topic was created again: a new id, nothing initialized).
    gone = group.heartbeat(ShareHeartbeat("a", got.member_epoch, None, None), META, 4, none_yet)
    assert gone.assignment == frozenset()
    assert group.catch_up("nobody", META, none_yet) is None
