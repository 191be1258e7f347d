"""The group machine (pure), the offsets store, and the coordinator's timers.

The pure tests drive ``trio_broker.state.group.Group`` with integer waiters and
explicit times. The coordinator tests run the Trio shell with ``autojump_clock``:
the initial rebalance delay, session expiry and rebalance timeouts pass in no
real time.
"""

from __future__ import annotations

import struct
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trio.testing

from trio_broker.config import BrokerConfig
from trio_broker.groups.coordinator import GroupCoordinator, StableGeneration, Waiter
from trio_broker.groups.offsets_store import (
    OFFSETS_LOG_NAME,
    OffsetAndMetadata,
    OffsetKey,
    OffsetsStore,
    decode_key,
    decode_value,
    encode_key,
    encode_value,
    open_offsets_log,
)
from trio_broker.groups.own_offsets import coordinator_alone
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.server.flusher import Flusher
from trio_broker.state.group import (
    TRANSITIONS,
    Group,
    GroupConfig,
    GroupEvent,
    GroupRecord,
    GroupState,
    IllegalGroupTransition,
    JoinRequest,
    JoinResult,
    Member,
    MemberRecord,
    Reply,
    SyncOutcome,
    SyncResult,
    consumer_subscription_topics,
    lifecycle_diagram,
    next_state,
    select_protocol,
)
from trio_broker.storage.log import LogConfig

S = GroupState
RANGE_FIRST = (("range", b"r"), ("roundrobin", b"rr"))
ROUNDROBIN_ONLY = (("roundrobin", b"rr"),)


def join_req(member_id: str = "", *, instance: str | None = None, protocols: Any = RANGE_FIRST,
             session: int = 10_000, rebalance: int = 30_000, v4: bool = True,
             v9: bool = True) -> JoinRequest:  # fmt: skip
    return JoinRequest(member_id, instance, "client", "/127.0.0.1", session, rebalance,
                       "consumer", protocols, require_known_member_id=v4,
                       supports_skip_assignment=v9)  # fmt: skip


def answers(replies: Any) -> dict[Any, Any]:
    return {r.waiter: r.result for r in replies}


def stable_group(delay: int = 0, members: int = 2) -> tuple[Group, list[str]]:
    """A Stable group at t=0 whose leader assigned b"<member id>" to each member."""
    group = Group("g", GroupConfig(initial_rebalance_delay_ms=delay))
    ids = []
    for i in range(members):
        out = group.join(join_req(v4=False), 0, f"m{i}", waiter=f"join{i}")
        assert out.result is None
        ids.append(f"m{i}")
    # Members arriving during the initial delay extend it once.
    replies = answers(group.advance_to(2 * delay))
    assert group.state is S.COMPLETING_REBALANCE and len(replies) == members
    for i, mid in enumerate(ids[1:], 1):
        assert group.sync(mid, None, 1, None, None, {}, 0, f"sync{i}").result is None
    synced = group.sync("m0", None, 1, "consumer", "range", {m: m.encode() for m in ids}, 0, "s0")
    # The leader's assignment is written first: nobody is answered until it counts.
    assert synced == SyncOutcome(None, (), GroupRecord(
        "consumer", 1, "range", "m0",
        tuple(MemberRecord(m, None, "client", "/127.0.0.1", 30_000, 10_000, b"r",
                           m.encode()) for m in ids),
    ))  # fmt: skip
    assert group.state is S.COMPLETING_REBALANCE and group.store_pending
    assert answers(group.store_completed(1, ErrorCode.NONE, 0)) == {
        f"sync{i}" if i else "s0": SyncResult(ErrorCode.NONE, "consumer", "range", mid.encode())
        for i, mid in enumerate(ids)
    }
    return group, ids


# ----------------------------------------------------------------------------- the table


def test_transition_table_is_the_lifecycle() -> None:
    assert next_state(S.EMPTY, GroupEvent.PREPARE_REBALANCE) is S.PREPARING_REBALANCE
    assert next_state(S.PREPARING_REBALANCE, GroupEvent.JOIN_COMPLETED) is S.COMPLETING_REBALANCE
    assert next_state(S.COMPLETING_REBALANCE, GroupEvent.ASSIGNMENT_STORED) is S.STABLE
    assert next_state(S.PREPARING_REBALANCE, GroupEvent.ALL_MEMBERS_GONE) is S.EMPTY
    assert next_state(S.EMPTY, GroupEvent.DELETE) is S.DEAD
    # Dead is terminal; every other state can be left.
    assert not [key for key in TRANSITIONS if key[0] is S.DEAD]
    assert {state for state, _ in TRANSITIONS} == set(S) - {S.DEAD}
    # Every state is reachable from Empty.
    reached, frontier = {S.EMPTY}, [S.EMPTY]
    while frontier:
        state = frontier.pop()
        for (before, _), after in TRANSITIONS.items():
            if before is state and after not in reached:
                reached.add(after)
                frontier.append(after)
    assert reached == set(S)


@pytest.mark.parametrize(
    ("state", "event"),
    [(s, e) for s in GroupState for e in GroupEvent if (s, e) not in TRANSITIONS],
)
def test_illegal_transitions_raise(state: GroupState, event: GroupEvent) -> None:
    with pytest.raises(IllegalGroupTransition):
        next_state(state, event)


def test_docs_diagram_is_drawn_from_the_table() -> None:
    doc = (Path(__file__).parents[3] / "docs" / "consumer-groups.md").read_text()
    assert f"```mermaid\n{lifecycle_diagram()}\n```" in doc


def test_deleting_a_non_empty_group_is_a_bug() -> None:
    group, _ = stable_group()
    with pytest.raises(IllegalGroupTransition):
        group.delete(0)
    assert group.state is S.STABLE


# ----------------------------------------------------------------------------- protocols


def member(mid: str, protocols: Any) -> Member:
    return Member(mid, None, "c", "h", 10_000, 10_000, "consumer", protocols)


def test_protocol_selection_by_votes() -> None:
    a = member("a", (("range", b""), ("roundrobin", b""), ("sticky", b"")))
    b = member("b", (("sticky", b""), ("roundrobin", b"")))
    c = member("c", (("sticky", b""), ("range", b""), ("roundrobin", b"")))
    # Candidates: roundrobin, sticky (range is not supported by b). Votes: a->roundrobin,
    # b->sticky, c->sticky.
    assert select_protocol([a, b, c]) == "sticky"
    # A tie goes to the first member's (the leader's) preference.
    assert select_protocol([a, b]) == "roundrobin"
    assert select_protocol([b, a]) == "sticky"
    with pytest.raises(ValueError, match="share no protocol"):
        select_protocol([member("x", (("a", b""),)), member("y", (("b", b""),))])


def test_join_with_an_unsupported_protocol_is_inconsistent() -> None:
    group, _ = stable_group()
    out = group.join(join_req(protocols=(("sticky", b""),)), 5, "new", "w")
    assert out.result == JoinResult(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, member_id="")
    bad_type = attrs.evolve(join_req(), protocol_type="connect")
    assert group.join(bad_type, 5, "new", "w").result is not None
    assert group.join(bad_type, 5, "new", "w").result.error is ErrorCode.INCONSISTENT_GROUP_PROTOCOL  # type: ignore[union-attr]
    assert group.state is S.STABLE


def test_protocol_follows_the_members() -> None:
    group = Group("g", GroupConfig(initial_rebalance_delay_ms=0))
    group.join(join_req(v4=False), 0, "a", "wa")
    group.join(join_req(v4=False, protocols=ROUNDROBIN_ONLY), 0, "b", "wb")
    replies = answers(group.advance_to(0))
    assert {r.protocol_name for r in replies.values()} == {"roundrobin"}
    leader = replies["wa"]
    assert leader.leader_id == "a" and [m[0] for m in leader.members] == ["a", "b"]
    assert leader.members[1][2] == b"rr"  # metadata of the chosen protocol
    assert replies["wb"].members == ()  # followers get no member list


# ----------------------------------------------------------------------------- joining


def test_kip394_member_id_required_then_join() -> None:
    group = Group("g", GroupConfig(initial_rebalance_delay_ms=0))
    out = group.join(join_req(), 0, "m-1", "w1")
    assert out.result == JoinResult(ErrorCode.MEMBER_ID_REQUIRED, member_id="m-1")
    assert group.state is S.EMPTY and group.pending_members == {"m-1": 10_000}
    assert group.join(join_req("m-1"), 5, "unused", "w2").result is None
    assert group.state is S.PREPARING_REBALANCE and not group.pending_members
    result = answers(group.advance_to(5))["w2"]
    assert (result.error, result.generation_id, result.member_id) == (ErrorCode.NONE, 1, "m-1")


def test_pending_member_that_never_returns_expires() -> None:
    group, _ = stable_group()
    group.join(join_req(), 100, "ghost", "w")
    assert "ghost" in group.pending_members
    for mid in ("m0", "m1"):  # keep the real members alive
        assert group.heartbeat(mid, None, 1, 9_000) is ErrorCode.NONE
    group.advance_to(100 + 10_000 - 1)
    assert "ghost" in group.pending_members
    group.advance_to(100 + 10_000)
    assert not group.pending_members and group.state is S.STABLE


def test_join_before_v4_joins_at_once() -> None:
    group = Group("g", GroupConfig(initial_rebalance_delay_ms=0))
    assert group.join(join_req(v4=False), 0, "direct", "w").result is None
    assert list(group.members) == ["direct"]


def test_unknown_member_and_session_timeout_bounds() -> None:
    group, _ = stable_group()
    assert group.join(join_req("nobody"), 0, "x", "w").result == JoinResult(
        ErrorCode.UNKNOWN_MEMBER_ID, member_id="nobody"
    )
    for session in (5_999, 1_800_001):
        result = group.join(join_req(session=session), 0, "x", "w").result
        assert result is not None and result.error is ErrorCode.INVALID_SESSION_TIMEOUT


def test_initial_delay_waits_for_more_members_and_extends() -> None:
    group = Group("g", GroupConfig(initial_rebalance_delay_ms=3000))
    group.join(join_req(v4=False, rebalance=10_000), 0, "a", "wa")
    assert group.join_deadline_ms == 3000
    group.join(join_req(v4=False, rebalance=10_000), 1000, "b", "wb")
    assert group.advance_to(2999) == []
    # A member arrived during the delay: wait another delay (rebalance timeout allows it).
    assert group.advance_to(3000) == [] and group.join_deadline_ms == 6000
    replies = answers(group.advance_to(6000))
    assert set(replies) == {"wa", "wb"} and group.generation_id == 1


def test_initial_delay_is_only_for_an_empty_group() -> None:
    group, _ = stable_group(delay=3000)
    assert group.join(join_req("m0"), 5000, "x", "w0").result is None  # leader rejoins
    assert group.state is S.PREPARING_REBALANCE
    # Not the initial delay: the phase ends as soon as everyone has rejoined.
    replies = group.join(join_req("m1"), 5001, "x", "w1").replies
    assert set(answers(replies)) == {"w0", "w1"} and group.generation_id == 2


def test_follower_rejoin_in_stable_returns_current_generation() -> None:
    group, _ = stable_group()
    result = group.join(join_req("m1"), 10, "x", "w").result
    assert result is not None and (result.error, result.generation_id) == (ErrorCode.NONE, 1)
    assert group.state is S.STABLE


def test_changed_protocols_trigger_a_rebalance() -> None:
    group, _ = stable_group()
    assert group.join(join_req("m1", protocols=ROUNDROBIN_ONLY), 10, "x", "w").result is None
    assert group.state is S.PREPARING_REBALANCE
    assert group.heartbeat("m0", None, 1, 11) is ErrorCode.REBALANCE_IN_PROGRESS
    replies = answers(group.join(join_req("m0"), 12, "x", "w0").replies)
    assert {r.protocol_name for r in replies.values()} == {"roundrobin"}


def test_retried_join_gets_the_same_answer_twice() -> None:
    group, _ = stable_group()
    group.join(join_req("m0"), 10, "x", "first")
    group.join(join_req("m0"), 11, "x", "retry")
    replies = answers(group.join(join_req("m1"), 12, "x", "w1").replies)
    assert replies["first"] == replies["retry"] and replies["first"].generation_id == 2


# ----------------------------------------------------------------------------- sync


def test_sync_errors() -> None:
    group, _ = stable_group()
    assert group.sync("m1", None, 0, None, None, {}, 5, "w").result == SyncResult(
        ErrorCode.ILLEGAL_GENERATION
    )
    assert group.sync("zz", None, 1, None, None, {}, 5, "w").result == SyncResult(
        ErrorCode.UNKNOWN_MEMBER_ID
    )
    assert group.sync("m1", None, 1, "consumer", "sticky", {}, 5, "w").result == SyncResult(
        ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    )
    group.join(join_req("m0"), 6, "x", "w0")
    assert group.sync("m1", None, 1, None, None, {}, 7, "w").result == SyncResult(
        ErrorCode.REBALANCE_IN_PROGRESS
    )


def test_member_leaving_before_the_leader_syncs_restarts_the_rebalance() -> None:
    group = Group("g", GroupConfig(initial_rebalance_delay_ms=0))
    for mid in ("a", "b", "c"):
        group.join(join_req(v4=False), 0, mid, f"j{mid}")
    group.advance_to(0)
    assert group.sync("b", None, 1, None, None, {}, 1, "sb").result is None
    error, replies = group.leave("c", None, 2)
    assert error is ErrorCode.NONE and group.state is S.PREPARING_REBALANCE
    assert answers(replies) == {"sb": SyncResult(ErrorCode.REBALANCE_IN_PROGRESS)}


# ----------------------------------------------------------------------------- timeouts


def test_session_expiry_removes_the_member_and_rebalances() -> None:
    group, _ = stable_group()
    assert group.heartbeat("m0", None, 1, 9_000) is ErrorCode.NONE
    group.advance_to(10_000)  # m1's session (10 s from its sync at t=0) ran out
    assert list(group.members) == ["m0"] and group.state is S.PREPARING_REBALANCE
    # m0 does not rejoin within the rebalance timeout (30 s): it is dropped too.
    group.advance_to(40_000)
    assert group.state is S.EMPTY and group.generation_id == 2 and not group.members


def test_rebalance_timeout_drops_members_that_did_not_rejoin() -> None:
    group, _ = stable_group()
    group.join(join_req("m0"), 1000, "x", "w0")
    for t in range(4000, 31_000, 3000):  # m1 keeps heartbeating but never rejoins
        assert group.heartbeat("m1", None, 1, t) is ErrorCode.REBALANCE_IN_PROGRESS
    replies = answers(group.advance_to(31_000))
    assert list(group.members) == ["m0"] and replies["w0"].generation_id == 2


def test_sync_timeout_drops_a_leader_that_never_syncs() -> None:
    group = Group("g", GroupConfig(initial_rebalance_delay_ms=0))
    group.join(join_req(v4=False, rebalance=20_000), 0, "lead", "w0")
    group.join(join_req(v4=False, rebalance=20_000), 0, "follow", "w1")
    group.advance_to(0)
    group.sync("follow", None, 1, None, None, {}, 10, "s1")
    for t in (9000, 18_000):  # the leader heartbeats but never syncs
        assert group.heartbeat("lead", None, 1, t) is ErrorCode.NONE
    replies = answers(group.advance_to(20_000))
    assert replies == {"s1": SyncResult(ErrorCode.REBALANCE_IN_PROGRESS)}
    assert list(group.members) == ["follow"] and group.state is S.PREPARING_REBALANCE
    assert group.leader_id == "follow"
    # The follower waited in SyncGroup (alive); its session restarts when answered.
    assert group.members["follow"].session_deadline_ms == 30_000


def test_a_big_clock_jump_fires_timers_in_order() -> None:
    group, _ = stable_group()
    assert group.heartbeat("m1", None, 1, 5000) is ErrorCode.NONE
    # m0's session ends at 10 s (rebalance starts), m1's at 15 s: nobody is left, so
    # the join phase ends then and there, not at the 30 s rebalance timeout.
    group.advance_to(1_000_000)
    assert group.state is S.EMPTY and group.generation_id == 2
    assert group.state_since_ms == 15_000


# ----------------------------------------------------------------------------- static


def test_static_member_restart_keeps_generation_and_assignment() -> None:
    group = Group("g", GroupConfig(initial_rebalance_delay_ms=0))
    group.join(join_req(instance="i0"), 0, "s0", "w0")  # static: no MEMBER_ID_REQUIRED
    group.join(join_req(instance="i1"), 0, "s1", "w1")
    group.advance_to(0)
    group.sync("s1", "i1", 1, None, None, {}, 0, "y1")
    group.sync("s0", "i0", 1, None, None, {"s0": b"A", "s1": b"B"}, 0, "y0")
    group.store_completed(1, ErrorCode.NONE, 0)
    assert group.state is S.STABLE
    # i1 restarts: new member id, same generation, no rebalance.
    result = group.join(join_req(instance="i1"), 100, "s1-new", "w2").result
    assert result is not None and (result.error, result.generation_id) == (ErrorCode.NONE, 1)
    assert result.member_id == "s1-new" and group.state is S.STABLE
    assert group.static_members == {"i0": "s0", "i1": "s1-new"}
    # The old incarnation is fenced; the new one gets the old assignment.
    assert group.heartbeat("s1", "i1", 1, 101) is ErrorCode.FENCED_INSTANCE_ID
    assert group.sync("s1-new", "i1", 1, None, None, {}, 102, "y").result == SyncResult(
        ErrorCode.NONE, "consumer", "range", b"B"
    )


def test_static_leader_restart_by_client_version() -> None:
    group = Group("g", GroupConfig(initial_rebalance_delay_ms=0))
    group.join(join_req(instance="i0"), 0, "s0", "w0")
    group.join(join_req(instance="i1"), 0, "s1", "w1")
    group.advance_to(0)
    group.sync("s0", "i0", 1, None, None, {}, 0, "y0")
    group.store_completed(1, ErrorCode.NONE, 0)
    new = group.join(join_req(instance="i0", v9=True), 10, "s0-b", "w").result
    assert new is not None and new.skip_assignment and new.leader_id == "s0-b"
    assert [m[0] for m in new.members] == ["s0-b", "s1"]
    # Before v9 the client cannot skip the assignment: it is told the old leader id.
    old = group.join(join_req(instance="i0", v9=False), 20, "s0-c", "w").result
    assert old is not None and old.leader_id == "s0-b" and old.members == ()
    assert not old.skip_assignment and group.leader_id == "s0-c"


def test_static_member_leaves_by_instance_id() -> None:
    group = Group("g", GroupConfig(initial_rebalance_delay_ms=0))
    group.join(join_req(instance="i0"), 0, "s0", "w0")
    group.advance_to(0)
    assert group.leave("s9", "i0", 1)[0] is ErrorCode.FENCED_INSTANCE_ID
    assert group.leave("", "i0", 1)[0] is ErrorCode.NONE
    assert group.state is S.EMPTY and not group.static_members


def test_parked_join_of_a_replaced_static_member_is_fenced() -> None:
    group, _ = stable_group()
    group.join(join_req(instance="i0"), 0, "s0", "first")
    out = group.join(join_req(instance="i0"), 1, "s0-b", "second")
    assert answers(out.replies)["first"] == JoinResult(ErrorCode.FENCED_INSTANCE_ID, member_id="s0")


# ----------------------------------------------------------------------------- offsets


def test_offset_commit_validation() -> None:
    group = Group("g", GroupConfig(initial_rebalance_delay_ms=0))
    # Simple consumers (no group management) may commit while the group is Empty.
    assert group.validate_offset_commit("", None, -1, 0) is ErrorCode.NONE
    group.join(join_req(v4=False), 0, "m0", "w")
    group.advance_to(0)  # CompletingRebalance, generation 1
    assert group.validate_offset_commit("", None, -1, 0) is ErrorCode.UNKNOWN_MEMBER_ID
    assert group.validate_offset_commit("m0", None, 0, 0) is ErrorCode.ILLEGAL_GENERATION
    assert group.validate_offset_commit("m0", None, 1, 0) is ErrorCode.REBALANCE_IN_PROGRESS
    group.sync("m0", None, 1, None, None, {}, 0, "s")
    # Its assignment is being written: not Stable yet.
    assert group.validate_offset_commit("m0", None, 1, 0) is ErrorCode.REBALANCE_IN_PROGRESS
    group.store_completed(1, ErrorCode.NONE, 0)
    assert group.validate_offset_commit("m0", None, 1, 0) is ErrorCode.NONE
    group.join(join_req(v4=False), 1, "m1", "w1")  # PreparingRebalance: old generation may commit
    assert group.validate_offset_commit("m0", None, 1, 1) is ErrorCode.NONE
    # A commit counts as a heartbeat.
    group.validate_offset_commit("m0", None, 1, 5000)
    assert group.members["m0"].session_deadline_ms == 15_000


def consumer_subscription(*topics: str, version: int = 1) -> bytes:
    out = struct.pack(">hi", version, len(topics))
    for topic in topics:
        out += struct.pack(">h", len(topic)) + topic.encode()
    return out + struct.pack(">i", -1) + struct.pack(">i", 0)  # user data, owned partitions


def test_subscribed_topics_from_consumer_metadata() -> None:
    assert consumer_subscription_topics(consumer_subscription("a", "bb")) == {"a", "bb"}
    with pytest.raises(ValueError):
        consumer_subscription_topics(b"\x00\x01\x00\x00\x00\x05\x00")
    group = Group("g", GroupConfig(initial_rebalance_delay_ms=0))
    protocols = (("range", consumer_subscription("orders")),)
    group.join(join_req(protocols=protocols, v4=False), 0, "m0", "w")
    group.advance_to(0)
    assert group.subscribed_topics() == {"orders"}


def test_summary_shows_metadata_only_when_stable() -> None:
    group, _ = stable_group()
    summary = group.summary()
    assert (summary.state, summary.protocol_name) == (S.STABLE, "range")
    assert [(m.member_id, m.metadata, m.assignment) for m in summary.members] == [
        ("m0", b"r", b"m0"), ("m1", b"r", b"m1"),
    ]  # fmt: skip
    group.join(join_req("m0"), 1, "x", "w")
    summary = group.summary()
    assert summary.protocol_name == "" and summary.members[0].metadata == b""


# ----------------------------------------------------------------------------- offsets store


def test_offset_record_format_round_trips() -> None:
    key = OffsetKey("group-ü", "topic", 7)
    value = OffsetAndMetadata(42, 3, "meta", 1234)
    assert decode_key(encode_key(key)) == key
    assert decode_value(encode_value(value)) == value
    with pytest.raises(ValueError):
        decode_key(b"\x00\x09" + encode_key(key)[2:])


@pytest.mark.parametrize("storage", ["file", "memory"])
def test_offsets_store_replays_last_write_wins(tmp_path: Path, storage: str) -> None:
    data_dir = tmp_path if storage == "file" else None
    store = OffsetsStore.open(data_dir, LogConfig())
    k1, k2 = OffsetKey("g", "t", 0), OffsetKey("g", "t", 1)
    first = store.append([(k1, OffsetAndMetadata(1)), (k2, OffsetAndMetadata(5))], 0)
    second = store.append([(k1, OffsetAndMetadata(2))], 0)
    third = store.append([(k2, None)], 0)
    # Durability may wake waiters out of order: the newer write still wins.
    for write in (second, third, first):
        store.apply(write)
    assert store.get("g", "t", 0) == OffsetAndMetadata(2)
    assert store.get("g", "t", 1) is None
    assert store.group_ids() == ["g"]
    if storage == "file":
        store.log.flush()
        store.close()
        reopened = OffsetsStore.open(data_dir, LogConfig())
        assert (tmp_path / OFFSETS_LOG_NAME).is_dir()
        assert reopened.get("g", "t", 0) == OffsetAndMetadata(2)
        assert reopened.get("g", "t", 1) is None
        reopened.close()


def test_offsets_not_visible_until_applied() -> None:
    store = OffsetsStore.open(None, LogConfig())
    write = store.append([(OffsetKey("g", "t", 0), OffsetAndMetadata(9))], 0)
    assert store.get("g", "t", 0) is None
    store.apply(write)
    assert store.get("g", "t", 0) == OffsetAndMetadata(9)


# ----------------------------------------------------------------------------- coordinator


@attrs.define
class FakeBroker:
    """What the coordinator uses of a Broker."""

    config: BrokerConfig
    #: Syncs on the event loop: these tests run on an autojumping mock clock, which must
    #: not jump while a sync runs in a worker thread (on a loaded machine it did, and the
    #: members' sessions ran out during a generation's write).
    flusher: Flusher = attrs.field(factory=lambda: Flusher(inline=True))
    log_defaults: LogConfig = attrs.field(factory=LogConfig)

    @staticmethod
    def now_ms() -> int:
        return int(trio.current_time() * 1000)


async def start_coordinator(nursery: trio.Nursery, delay: int = 3000) -> GroupCoordinator:
    broker = FakeBroker(BrokerConfig(storage="memory", group_initial_rebalance_delay_ms=delay))
    await nursery.start(broker.flusher.run)
    coordinator, own = coordinator_alone(broker, partial(open_offsets_log, None, LogConfig()))
    await nursery.start(coordinator.run)
    await nursery.start(own.run)  # elects it, as a cluster's replica manager would
    return coordinator


async def join(coordinator: GroupCoordinator, req: JoinRequest) -> JoinResult:
    outcome = coordinator.join_group("g", req)
    result = await outcome.wait() if isinstance(outcome, Waiter) else outcome
    assert isinstance(result, JoinResult)
    return result


async def test_coordinator_initial_delay(autojump_clock: trio.testing.MockClock) -> None:
    async with trio.open_nursery() as nursery:
        coordinator = await start_coordinator(nursery, delay=3000)
        start = trio.current_time()
        first = await join(coordinator, join_req())
        assert first.error is ErrorCode.MEMBER_ID_REQUIRED
        result = await join(coordinator, join_req(first.member_id))
        assert result.error is ErrorCode.NONE and result.generation_id == 1
        assert trio.current_time() - start == pytest.approx(3.0, abs=0.01)
        nursery.cancel_scope.cancel()


async def test_coordinator_expires_sessions(autojump_clock: trio.testing.MockClock) -> None:
    stable: list[StableGeneration] = []
    async with trio.open_nursery() as nursery:
        coordinator = await start_coordinator(nursery, delay=0)
        coordinator.observers.append(stable.append)
        result = await join(coordinator, join_req(v4=False))
        outcome = coordinator.sync_group("g", result.member_id, None, 1, None, None,
                                         {result.member_id: b"all"})  # fmt: skip
        # The leader's SyncGroup is answered once the generation is stored.
        assert isinstance(outcome, Waiter)
        sync = await outcome.wait()
        assert sync == SyncResult(ErrorCode.NONE, "consumer", "range", b"all")
        assert [s.generation_id for s in stable] == [1]
        await trio.sleep(9.9)
        assert coordinator.groups["g"].state is S.STABLE
        await trio.sleep(0.2)  # the 10 s session has run out: the group empties
        group = coordinator.groups["g"]
        assert group.state is S.EMPTY and group.generation_id == 2
        nursery.cancel_scope.cancel()


async def test_coordinator_rebalance_wakes_parked_joins(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with trio.open_nursery() as nursery:
        coordinator = await start_coordinator(nursery, delay=0)
        first = await join(coordinator, join_req(v4=False))
        coordinator.sync_group("g", first.member_id, None, 1, None, None, {})
        results: list[JoinResult] = []

        async def join_into(req: JoinRequest) -> None:
            results.append(await join(coordinator, req))

        nursery.start_soon(join_into, join_req(v4=False))  # a second member: rebalance
        await trio.sleep(1)
        assert coordinator.heartbeat("g", first.member_id, None, 1) is (
            ErrorCode.REBALANCE_IN_PROGRESS
        )
        nursery.start_soon(join_into, join_req(first.member_id))
        await trio.sleep(1)
        assert [r.generation_id for r in results] == [2, 2]
        nursery.cancel_scope.cancel()


async def test_coordinator_commits_are_durable_then_visible(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with trio.open_nursery() as nursery:
        coordinator = await start_coordinator(nursery)
        assert coordinator.validate_offset_commit("solo", "", None, -1) is ErrorCode.NONE
        write = coordinator.append_offsets([(OffsetKey("solo", "t", 0), OffsetAndMetadata(7))])
        assert coordinator.committed("solo", "t", 0) is None
        await coordinator.wait_offsets_durable(write)
        assert coordinator.committed("solo", "t", 0) == OffsetAndMetadata(7)
        # A member of a group we never saw (e.g. from before a restart) is told to rejoin.
        assert coordinator.validate_offset_commit("new", "m", None, 3) is (
            ErrorCode.ILLEGAL_GENERATION
        )
        results, pending = coordinator.delete_groups(["solo", "missing"])
        assert results == {"solo": ErrorCode.NONE, "missing": ErrorCode.GROUP_ID_NOT_FOUND}
        [write] = pending  # alone, one offsets table: one write
        await coordinator.wait_offsets_durable(write)
        assert coordinator.committed("solo", "t", 0) is None and "solo" not in coordinator.groups
        nursery.cancel_scope.cancel()


async def test_coordinator_cleanup_forgets_empty_groups(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with trio.open_nursery() as nursery:
        coordinator = await start_coordinator(nursery, delay=0)
        result = await join(coordinator, join_req(v4=False))
        assert coordinator.leave_group("g", [(result.member_id, None)]) == [ErrorCode.NONE]
        assert coordinator.groups["g"].state is S.EMPTY
        await trio.sleep(601)  # one cleanup interval
        assert "g" not in coordinator.groups
        nursery.cancel_scope.cancel()


def test_replies_are_waiter_tokens() -> None:
    # The machine never looks inside a waiter: any hashable works (trio Waiters, ints).
    reply = Reply(object(), SyncResult(ErrorCode.NONE))
    assert reply.result.error is ErrorCode.NONE
