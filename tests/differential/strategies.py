"""Hypothesis strategies over the differential harness's ops.

A sequence starts from a fixed prologue (two topics, one with two partitions, and an
idempotent producer) so that most generated ops hit something that exists; the ops that
follow mix the normal path with its edges: duplicates of the last five batches, sequence
gaps, stale epochs after a bump, fetches at and past the high watermark, unknown topics
and partitions, topics deleted and created again, malformed frames; every compression
codec and acks=0; topics named by id (Fetch v13, Metadata v12); OffsetForLeaderEpoch; and
(one sequence in four) a consumer group's join/sync/heartbeat/commit/fetch/leave calls by
two members.
"""

from __future__ import annotations

from hypothesis import strategies as st

from tests.differential.harness import (
    CLOSE,
    COMMIT,
    DUPLICATE,
    EARLIEST,
    FETCH_OFFSETS,
    FORGET,
    GAP,
    HEARTBEAT,
    JOIN,
    LATEST,
    LEAVE,
    LOCAL_BUMP,
    MAX_TIMESTAMP,
    NEXT,
    NEXT_FETCH,
    OPEN,
    REBALANCE_TIMEOUT_MS,
    STALE_EPOCH,
    STALE_SESSION_EPOCH,
    SYNC,
    UNKNOWN_SESSION,
    CreateTopic,
    DeleteTopic,
    Fetch,
    GroupOp,
    IdempotentProduce,
    InitProducer,
    ListOffsets,
    Malformed,
    Metadata,
    MetadataById,
    OffsetForLeaderEpoch,
    Op,
    Pause,
    Produce,
    SessionFetch,
)

TOPICS = ["a", "b", "c"]  # "c" does not exist until a CreateTopic makes it
PROLOGUE: list[Op] = [CreateTopic("a", 1), CreateTopic("b", 2), InitProducer(0, bump=False)]

topics = st.sampled_from(TOPICS)
partitions = st.sampled_from([0, 0, 0, 1, 7])  # 1 exists in "b" only; 7 nowhere
acks = st.sampled_from([-1, 1])
records = st.integers(1, 4)
codecs = st.sampled_from(["none", "none", "gzip", "snappy", "lz4", "zstd"])

create_topic = st.builds(CreateTopic, topics, st.sampled_from([1, 2, 0, -1]))
delete_topic = st.builds(DeleteTopic, st.sampled_from([*TOPICS, "never"]))
metadata = st.builds(Metadata, st.sampled_from([*TOPICS, "never"]))
init_producer = st.builds(InitProducer, st.sampled_from([0, 0, 1]), st.booleans())
idempotent = st.builds(
    IdempotentProduce,
    producer=st.sampled_from([0, 0, 1]),
    topic=st.sampled_from(["a", "a", "b", "c"]),
    records=records,
    acks=acks,
    mode=st.sampled_from([NEXT, NEXT, NEXT, DUPLICATE, GAP, LOCAL_BUMP, STALE_EPOCH]),
    back=st.integers(1, 6),
    codec=codecs,
)
fetch = st.builds(
    Fetch, topics, partitions,
    st.sampled_from(["zero", "hw", "hw+1", "beyond", "negative", "middle"]),
    by=st.sampled_from(["name", "name", "id", "unknown-id"]),
)  # fmt: skip
metadata_by_id = st.builds(MetadataById, topics, st.sampled_from([True, True, False]))
offset_for_leader_epoch = st.builds(
    OffsetForLeaderEpoch, topics, partitions,
    leader_epoch=st.sampled_from([0, 0, 1, 5, -1]),
    current_leader_epoch=st.sampled_from([-1, -1, 0, 1]),
)  # fmt: skip
list_offsets = st.builds(
    ListOffsets, topics, partitions,
    st.sampled_from([EARLIEST, LATEST, MAX_TIMESTAMP, 0, 15, 30, 10_000]),
)  # fmt: skip
malformed = st.builds(
    Malformed,
    st.sampled_from(
        ["api-versions-v99", "metadata-v99", "absurd-length", "negative-length", "unknown-api-key"]
    ),
)

produce = st.builds(Produce, topics, partitions, records, st.sampled_from([-1, 1, 0]), codec=codecs)
group_op = st.builds(
    GroupOp,
    action=st.sampled_from(
        [JOIN, JOIN, SYNC, SYNC, HEARTBEAT, HEARTBEAT, COMMIT, COMMIT, FETCH_OFFSETS, LEAVE]
    ),
    member=st.sampled_from([0, 0, 0, 1]),
    offset=st.integers(0, 5),
    stale=st.sampled_from([False, False, False, True]),
)

session_fetch = st.builds(
    SessionFetch,
    st.sampled_from([OPEN, OPEN, NEXT_FETCH, NEXT_FETCH, NEXT_FETCH, STALE_SESSION_EPOCH,
                     UNKNOWN_SESSION, FORGET, CLOSE]),
)  # fmt: skip

op = st.one_of(
    idempotent, idempotent, produce, produce, fetch, fetch, list_offsets, list_offsets,
    init_producer, create_topic, delete_topic, metadata, malformed, metadata_by_id,
    offset_for_leader_epoch, group_op, session_fetch,
)  # fmt: skip


#: One producer on one partition: long enough runs for duplicates of the last five batches,
#: gaps against known state and stale epochs after a local bump to happen often.
producer_focused = st.one_of(
    st.builds(
        IdempotentProduce,
        producer=st.just(0),
        topic=st.just("a"),
        records=records,
        acks=acks,
        mode=st.sampled_from(
            [NEXT, NEXT, NEXT, DUPLICATE, DUPLICATE, GAP, LOCAL_BUMP, STALE_EPOCH]
        ),
        back=st.integers(1, 7),
    ),
    st.builds(Fetch, st.just("a"), st.just(0), st.sampled_from(["zero", "middle", "hw"])),
    st.builds(ListOffsets, st.just("a"), st.just(0), st.sampled_from([MAX_TIMESTAMP, 20, 40])),
)


#: A consumer group's life: mostly member 0 (join, sync, heartbeats, commits), sometimes a
#: second member whose join rebalances the group, stale generations, leaves.
group_focused = st.one_of(group_op, group_op, group_op, group_op, produce, fetch)
#: With ``pauses``, a group run also gets up to one pause of twice the rebalance timeout
#: (at drawn positions), so that a join without its sync times out: the group timers'
#: semantics. Seconds each, so only the long run (bench/differential.py) has them.
PAUSE = Pause(2 * REBALANCE_TIMEOUT_MS / 1000)


def _with_pauses(drawn: tuple[list[Op], list[int]]) -> list[Op]:
    ops, positions = drawn
    for position in sorted(positions, reverse=True):
        ops.insert(min(position, len(ops)), PAUSE)
    return ops


def sequences(max_ops: int, pauses: bool = False) -> st.SearchStrategy[list[Op]]:
    """The prologue, then a mix of everything, a producer-focused or a group-focused run."""
    mixed = st.lists(op, min_size=1, max_size=max_ops)
    focused = st.lists(producer_focused, min_size=max_ops // 2, max_size=max_ops)
    groups = st.lists(group_focused, min_size=max_ops // 2, max_size=max_ops)
    if pauses:
        positions = st.lists(st.integers(0, max_ops), max_size=1)
        groups = st.tuples(groups, positions).map(_with_pauses)
    return st.one_of(mixed, mixed, focused, groups).map(lambda ops: [*PROLOGUE, *ops])
