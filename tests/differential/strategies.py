"""Hypothesis strategies over the differential harness's ops.

A sequence starts from a fixed prologue (two topics, one with two partitions, and an
idempotent producer) so that most generated ops hit something that exists; the ops that
follow mix the normal path with its edges: duplicates of the last five batches, sequence
gaps, stale epochs after a bump, fetches at and past the high watermark, unknown topics
and partitions, topics deleted and created again, malformed frames.
"""

from __future__ import annotations

from hypothesis import strategies as st

from tests.differential.harness import (
    DUPLICATE,
    EARLIEST,
    GAP,
    LATEST,
    LOCAL_BUMP,
    MAX_TIMESTAMP,
    NEXT,
    STALE_EPOCH,
    CreateTopic,
    DeleteTopic,
    Fetch,
    IdempotentProduce,
    InitProducer,
    ListOffsets,
    Malformed,
    Metadata,
    Op,
    Produce,
)

TOPICS = ["a", "b", "c"]  # "c" does not exist until a CreateTopic makes it
PROLOGUE: list[Op] = [CreateTopic("a", 1), CreateTopic("b", 2), InitProducer(0, bump=False)]

topics = st.sampled_from(TOPICS)
partitions = st.sampled_from([0, 0, 0, 1, 7])  # 1 exists in "b" only; 7 nowhere
acks = st.sampled_from([-1, 1])
records = st.integers(1, 4)

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
)
fetch = st.builds(
    Fetch, topics, partitions,
    st.sampled_from(["zero", "hw", "hw+1", "beyond", "negative", "middle"]),
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

produce = st.builds(Produce, topics, partitions, records, acks)

op = st.one_of(
    idempotent, idempotent, produce, produce, fetch, fetch, list_offsets, list_offsets,
    init_producer, create_topic, delete_topic, metadata, malformed,
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


def sequences(max_ops: int) -> st.SearchStrategy[list[Op]]:
    """The prologue, then a mix of everything or (one in three) a producer-focused run."""
    mixed = st.lists(op, min_size=1, max_size=max_ops)
    focused = st.lists(producer_focused, min_size=max_ops // 2, max_size=max_ops)
    return st.one_of(mixed, mixed, focused).map(lambda ops: [*PROLOGUE, *ops])
