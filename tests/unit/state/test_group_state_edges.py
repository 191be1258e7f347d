"""Corners of the pure group machine the group Hypothesis machine reaches rarely or not at
all: static members restarting mid-rebalance, rejoins during CompletingRebalance, leaves
of pending members, what DescribeGroups reports, and the consumer subscription parser
behind OffsetDelete. Found by mutation testing (tools/mutation.sh state/group).
"""

from __future__ import annotations

import struct
from typing import Any

import attrs
import pytest

from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.state.group import (
    Group,
    GroupConfig,
    GroupEvent,
    GroupState,
    GroupSummary,
    IllegalGroupTransition,
    JoinRequest,
    JoinResult,
    MemberSummary,
    SyncResult,
    consumer_subscription_topics,
    next_state,
    select_protocol,
)

S = GroupState
attrs_evolve = attrs.evolve
PROTOCOLS = (("range", b"r"), ("roundrobin", b"rr"))


def join_req(
    member_id: str = "",
    *,
    instance: str | None = None,
    protocols: Any = PROTOCOLS,
    session: int = 10_000,
    client: str = "client",
    host: str = "/127.0.0.1",
    v9: bool = True,
) -> JoinRequest:
    return JoinRequest(
        member_id, instance, client, host, session, 30_000, "consumer", protocols,
        require_known_member_id=True, supports_skip_assignment=v9,
    )  # fmt: skip


def answers(replies: Any) -> dict[Any, Any]:
    return {r.waiter: r.result for r in replies}


def completing(static: bool = True, protocols: Any = PROTOCOLS) -> Group:
    """Members m0 (leader) and m1 joined at t=0: generation 1, CompletingRebalance."""
    group = Group("g", GroupConfig(initial_rebalance_delay_ms=0))
    for i in range(2):
        req = join_req(instance=f"i{i}" if static else None, protocols=protocols)
        if not static:  # KIP-394 round trip for dynamic members
            assert group.join(req, 0, f"m{i}", f"j{i}").result is not None
            req = join_req(f"m{i}", protocols=protocols)
        assert group.join(req, 0, f"m{i}", f"j{i}").result is None
    replies = answers(group.advance_to(0))
    assert group.state is S.COMPLETING_REBALANCE and set(replies) == {"j0", "j1"}
    return group


def stable(static: bool = True, protocols: Any = PROTOCOLS) -> Group:
    group = completing(static, protocols)
    out = group.sync("m0", None, 1, None, None, {"m0": b"a0", "m1": b"a1"}, 0, "s0")
    assert out.store is not None and not out.replies
    replies = answers(group.store_completed(1, ErrorCode.NONE, 0))
    assert group.state is S.STABLE and replies["s0"].assignment == b"a0"
    return group


# ------------------------------------------------------------------ lifecycle


def test_an_illegal_transition_names_state_and_event() -> None:
    with pytest.raises(IllegalGroupTransition) as info:
        next_state(S.DEAD, GroupEvent.PREPARE_REBALANCE)
    assert (info.value.state, info.value.event) == (S.DEAD, GroupEvent.PREPARE_REBALANCE)
    assert str(info.value) == "PREPARE_REBALANCE is illegal in state Dead"


def test_delete_records_when_the_group_died() -> None:
    group = Group("g", GroupConfig())
    group.delete(1234)
    assert group.state is S.DEAD and group.state_since_ms == 1234


# ------------------------------------------------------------------ static members


def test_static_restart_in_a_stable_group_keeps_the_generation() -> None:
    group = stable()
    out = group.join(join_req(instance="i0", session=7_000), 500, "m0b", "j0b")
    assert out.result == JoinResult(
        ErrorCode.NONE, 1, "consumer", "range", "m0b", "m0b",
        (("m0b", "i0", b"r"), ("m1", "i1", b"r")), skip_assignment=True,
    )  # fmt: skip
    assert out.replies == ()
    assert group.state is S.STABLE
    # its session runs from the restart: m1's deadline (10 000) comes first, then m0b's
    assert group.members["m0b"].session_deadline_ms == 7_500
    assert group.next_deadline() == 7_500


def test_static_leader_restart_before_v9_is_told_the_old_leader() -> None:
    group = stable()
    out = group.join(join_req(instance="i0", v9=False), 500, "m0b", "j0b")
    assert out.result == JoinResult(ErrorCode.NONE, 1, "consumer", "range", "m0", "m0b")
    assert out.replies == ()


def test_static_restart_fences_a_parked_sync_of_the_old_id() -> None:
    group = completing()
    assert group.sync("m1", "i1", 1, None, None, {}, 0, "s1").result is None  # parked
    out = group.join(join_req(instance="i1"), 10, "m1b", "j1b")
    assert out.result is None
    assert answers(out.replies) == {"s1": SyncResult(ErrorCode.FENCED_INSTANCE_ID)}
    assert group.state is S.PREPARING_REBALANCE
    assert group.sync("m1", "i1", 1, None, None, {}, 10, "s1x").result == SyncResult(
        ErrorCode.FENCED_INSTANCE_ID
    )


def test_static_restart_can_complete_a_join_phase() -> None:
    group = stable()
    assert group.join(join_req("m0", instance="i0"), 100, "unused", "j0").result is None
    assert group.state is S.PREPARING_REBALANCE  # the leader asked for a rebalance
    out = group.join(join_req(instance="i1"), 200, "m1b", "j1b")
    assert out.result is None
    got = answers(out.replies)
    assert set(got) == {"j0", "j1b"}
    assert {r.generation_id for r in got.values()} == {2}
    assert group.state is S.COMPLETING_REBALANCE
    assert group.sync_deadline_ms == 200 + 30_000


# ------------------------------------------------------------------ rejoins


def test_rejoin_during_completing_rebalance_answers_the_current_generation() -> None:
    group = completing(static=False)
    leader = group.join(join_req("m0"), 5, "unused", "again0").result
    assert leader == JoinResult(
        ErrorCode.NONE, 1, "consumer", "range", "m0", "m0",
        (("m0", None, b"r"), ("m1", None, b"r")),
    )  # fmt: skip
    follower = group.join(join_req("m1"), 5, "unused", "again1").result
    assert follower == JoinResult(ErrorCode.NONE, 1, "consumer", "range", "m0", "m1")
    assert group.state is S.COMPLETING_REBALANCE


def test_a_rejoin_refreshes_what_describe_shows() -> None:
    group = stable(static=False)
    group.join(join_req("m1", client="new-client", host="/10.0.0.9", session=20_000), 7, "x", "j")
    assert group.state is S.STABLE  # a follower with unchanged protocols: no rebalance
    # ... and nothing changed; a leader rejoin updates the member and rebalances.
    group.join(join_req("m0", client="lead-2", host="/10.0.0.8", session=20_000), 7, "x", "j0")
    assert group.state is S.PREPARING_REBALANCE
    m0 = group.summary().members[0]
    assert (m0.client_id, m0.client_host) == ("lead-2", "/10.0.0.8")
    assert group.members["m0"].session_deadline_ms == 7 + 20_000


# ------------------------------------------------------------------ leaving


def test_a_pending_member_leaving_can_complete_a_join_phase() -> None:
    group = stable(static=False)
    pending = group.join(join_req(), 10, "p", "jp").result
    assert pending is not None and pending.error is ErrorCode.MEMBER_ID_REQUIRED
    assert group.join(join_req("m0"), 20, "x", "j0").result is None
    assert group.join(join_req("m1"), 20, "x", "j1").result is None
    assert group.state is S.PREPARING_REBALANCE  # still waiting for "p"
    error, replies = group.leave("p", None, 30)
    assert error is ErrorCode.NONE
    assert set(answers(replies)) == {"j0", "j1"}
    assert group.state is S.COMPLETING_REBALANCE and group.sync_deadline_ms == 30 + 30_000


def test_a_leaving_member_s_parked_sync_is_answered() -> None:
    group = completing(static=False)
    assert group.sync("m1", None, 1, None, None, {}, 0, "s1").result is None
    error, replies = group.leave("m1", None, 5)
    assert error is ErrorCode.NONE
    assert answers(replies) == {"s1": SyncResult(ErrorCode.UNKNOWN_MEMBER_ID)}
    assert group.state is S.PREPARING_REBALANCE


# ------------------------------------------------------------------ DescribeGroups


def test_summary_of_a_stable_group() -> None:
    group = stable()
    assert group.summary() == GroupSummary(
        "g", S.STABLE, "consumer", "range",
        (
            MemberSummary("m0", "i0", "client", "/127.0.0.1", b"r", b"a0"),
            MemberSummary("m1", "i1", "client", "/127.0.0.1", b"r", b"a1"),
        ),
    )  # fmt: skip


def test_summary_outside_stable_shows_no_protocol_data() -> None:
    group = completing()
    assert group.summary() == GroupSummary(
        "g", S.COMPLETING_REBALANCE, "consumer", "",
        (
            MemberSummary("m0", "i0", "client", "/127.0.0.1", b"", b""),
            MemberSummary("m1", "i1", "client", "/127.0.0.1", b"", b""),
        ),
    )  # fmt: skip
    empty = Group("fresh", GroupConfig())
    assert empty.summary() == GroupSummary("fresh", S.EMPTY, "", "", ())


# ------------------------------------------------------------------ consumer subscriptions


def subscription(*topics: bytes, version: int = 1, tail: bytes = b"") -> bytes:
    out = struct.pack(">hi", version, len(topics))
    for topic in topics:
        out += struct.pack(">h", len(topic)) + topic
    return out + tail


def test_subscription_topics_parse() -> None:
    assert consumer_subscription_topics(subscription(b"a", b"bb", tail=b"\x00\x00\x00\x00")) == {
        "a",
        "bb",
    }
    assert consumer_subscription_topics(subscription()) == set()  # no topics is valid
    assert consumer_subscription_topics(subscription(b"")) == {""}  # an empty name too
    assert consumer_subscription_topics(subscription(b"abc")) == {"abc"}  # ends at the end


@pytest.mark.parametrize(
    ("metadata", "message"),
    [
        (struct.pack(">hi", 1, -1), "bad topic count"),
        (struct.pack(">hi", 1, 7), "bad topic count"),  # more topics than bytes
        (struct.pack(">hih", 1, 8, 0x7FFF), "bad topic name"),  # count == len: names decide
        (struct.pack(">hih", 1, 1, -1), "bad topic name"),
        (struct.pack(">hih", 1, 1, 4) + b"abc", "bad topic name"),  # one byte short
    ],
)
def test_subscription_errors(metadata: bytes, message: str) -> None:
    with pytest.raises(ValueError) as info:
        consumer_subscription_topics(metadata)
    assert str(info.value) == message


def test_truncated_subscription_reports_the_short_read() -> None:
    with pytest.raises(ValueError) as info:
        consumer_subscription_topics(b"\x00\x01\x00")
    assert "unpack_from requires a buffer of at least 6 bytes" in str(info.value)


def test_subscribed_topics_of_a_consumer_group() -> None:
    group = Group("g", GroupConfig(initial_rebalance_delay_ms=0))
    metas = [b"\xff", subscription(b"t1"), subscription(b"t2", b"t3")]  # m0's does not parse
    for i, meta in enumerate(metas):
        req = join_req(instance=f"i{i}", protocols=(("range", meta),))
        assert group.join(req, 0, f"m{i}", f"j{i}").result is None
    group.advance_to(0)
    assert group.protocol_name == "range"
    assert group.subscribed_topics() == {"t1", "t2", "t3"}
    for i in range(3):
        group.leave(f"m{i}", None, 1)
    assert group.state is S.EMPTY and group.protocol_type == "consumer"
    assert group.subscribed_topics() is None  # no protocol chosen: cannot tell


# ------------------------------------------------------------------ dead groups, commits


def test_a_dead_group_answers_coordinator_not_available() -> None:
    group = Group("g", GroupConfig())
    group.delete(0)
    unavailable = ErrorCode.COORDINATOR_NOT_AVAILABLE
    assert group.sync("m0", None, 1, None, None, {}, 0, "s").result == SyncResult(unavailable)
    assert group.heartbeat("m0", None, 1, 0) is unavailable
    assert group.leave("m0", None, 0) == (unavailable, ())
    assert group.validate_offset_commit("", None, -1, 0) is unavailable


def test_only_a_negative_generation_commits_to_an_empty_group() -> None:
    group = Group("g", GroupConfig())
    assert group.validate_offset_commit("", None, -1, 0) is ErrorCode.NONE
    assert group.validate_offset_commit("", None, 0, 0) is ErrorCode.UNKNOWN_MEMBER_ID
    assert group.validate_offset_commit("m0", None, 1, 0) is ErrorCode.UNKNOWN_MEMBER_ID


# ------------------------------------------------------------------ join refusals


def test_join_refusals_keep_the_member_id() -> None:
    dead = Group("g", GroupConfig())
    dead.delete(0)
    assert dead.join(join_req("m9"), 0, "x", "j").result == JoinResult(
        ErrorCode.COORDINATOR_NOT_AVAILABLE, member_id="m9"
    )
    group = stable()  # static members i0 -> m0, i1 -> m1
    zombie = group.join(join_req("m0-old", instance="i0"), 5, "x", "jz")
    assert zombie.result == JoinResult(ErrorCode.FENCED_INSTANCE_ID, member_id="m0-old")
    # A known id with another instance id is not that member.
    other = group.join(join_req("m0", instance="i-other"), 5, "x", "jo")
    assert other.result == JoinResult(ErrorCode.UNKNOWN_MEMBER_ID, member_id="m0")
    assert group.state is S.STABLE


def test_join_needs_a_protocol_type_and_protocols() -> None:
    group = Group("g", GroupConfig(initial_rebalance_delay_ms=0))
    no_type = attrs_evolve(join_req(), protocol_type="")
    assert group.join(no_type, 0, "m0", "j").result == JoinResult(
        ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    )
    assert group.join(join_req(protocols=()), 0, "m0", "j").result == JoinResult(
        ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    )
    assert group.state is S.EMPTY and not group.pending_members


def test_the_largest_session_timeout_is_allowed() -> None:
    group = Group("g", GroupConfig(initial_rebalance_delay_ms=0))
    ok = group.join(join_req(session=1_800_000), 0, "m0", "j").result
    assert ok is not None and ok.error is ErrorCode.MEMBER_ID_REQUIRED
    too_long = group.join(join_req(session=1_800_001), 0, "m1", "j").result
    assert too_long == JoinResult(ErrorCode.INVALID_SESSION_TIMEOUT)


def test_select_protocol_errors() -> None:
    with pytest.raises(ValueError, match=r"^no members to select a protocol for$"):
        select_protocol([])
    group = Group("g", GroupConfig(initial_rebalance_delay_ms=0))
    group.join(join_req(instance="a", protocols=(("range", b""),)), 0, "m0", "j0")
    group.members["m0"].protocols = (("sticky", b""),)  # as if it had changed its mind
    group.join(join_req(instance="b", protocols=(("sticky", b""),)), 0, "m1", "j1")
    group.members["m0"].protocols = (("range", b""),)
    with pytest.raises(ValueError, match=r"^members share no protocol$"):
        select_protocol(group.members.values())


# ------------------------------------------------------------------ times


def test_transitions_record_their_time() -> None:
    group = Group("g", GroupConfig(initial_rebalance_delay_ms=0))
    group.join(join_req(instance="i0"), 10, "m0", "j0")
    assert group.state is S.PREPARING_REBALANCE and group.state_since_ms == 10
    group.advance_to(10)
    assert group.state is S.COMPLETING_REBALANCE and group.state_since_ms == 10
    group.sync("m0", None, 1, None, None, {}, 25, "s0")
    assert group.state is S.COMPLETING_REBALANCE and group.state_since_ms == 10
    group.store_completed(1, ErrorCode.NONE, 30)
    assert group.state is S.STABLE and group.state_since_ms == 30
    group.join(join_req("m0", instance="i0"), 40, "x", "j0b")  # the leader rejoins
    assert group.state is S.COMPLETING_REBALANCE and group.state_since_ms == 40


@pytest.mark.parametrize(
    ("rebalance", "done_at"),
    [
        (6_000, 6_000),  # 3 s of the initial delay left: extended once, by 3 s
        (3_001, 3_001),  # 1 ms left: extended by 1 ms
        (3_000, None),  # nothing left: the join phase ends at the first deadline
    ],
)
def test_the_initial_delay_is_extended_within_the_rebalance_timeout(
    rebalance: int, done_at: int | None
) -> None:
    group = Group("g", GroupConfig(initial_rebalance_delay_ms=3_000))

    def arrive(i: int, at: int) -> None:
        req = attrs_evolve(join_req(instance=f"i{i}"), rebalance_timeout_ms=rebalance)
        assert group.join(req, at, f"m{i}", f"j{i}").result is None

    arrive(0, 0)
    arrive(1, 1_000)  # arrives during the delay
    assert group.next_deadline() == 3_000
    group.advance_to(3_000)
    if done_at is None:
        assert group.state is S.COMPLETING_REBALANCE and len(group.members) == 2
        return
    assert group.state is S.PREPARING_REBALANCE
    arrive(2, 3_000)  # another one during the extension: no further extension
    group.advance_to(done_at - 1)
    assert group.state is S.PREPARING_REBALANCE
    group.advance_to(done_at)
    assert group.state is S.COMPLETING_REBALANCE
    assert len(group.members) == 3


def test_describe_hides_the_old_assignment_during_a_rebalance() -> None:
    group = stable()
    group.join(join_req("m0", instance="i0"), 5, "x", "j0")  # leader rejoins: rebalance
    assert group.state is S.PREPARING_REBALANCE
    assert [(m.member_id, m.metadata, m.assignment) for m in group.summary().members] == [
        ("m0", b"", b""),
        ("m1", b"", b""),
    ]


def test_a_lone_static_member_restarting_with_new_protocols_rejoins_at_once() -> None:
    group = Group("g", GroupConfig(initial_rebalance_delay_ms=0))
    group.join(join_req(instance="i0"), 0, "m0", "j0")
    group.advance_to(0)
    group.sync("m0", None, 1, None, None, {"m0": b"a"}, 0, "s0")
    group.store_completed(1, ErrorCode.NONE, 0)
    assert group.state is S.STABLE and group.protocol_name == "range"
    restarted = join_req(instance="i0", protocols=(("roundrobin", b"rr2"),))
    out = group.join(restarted, 5, "m0b", "j0b")
    # The choice changes, so a rebalance; it is the only member, so it ends at once.
    assert out.result is None
    expected = JoinResult(
        ErrorCode.NONE, 2, "consumer", "roundrobin", "m0b", "m0b", (("m0b", "i0", b"rr2"),)
    )
    assert answers(out.replies) == {"j0b": expected}


def test_member_protocol_lookups_name_what_is_missing() -> None:
    group = stable()
    member = group.members["m0"]
    with pytest.raises(KeyError) as info:
        member.metadata_for("sticky")
    assert info.value.args == ("sticky",)
    with pytest.raises(ValueError, match=r"^member m0 supports none of \['a', 'b'\]$"):
        member.vote({"b", "a"})
