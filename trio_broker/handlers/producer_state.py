"""Load partitions' producer state in a worker thread before a handler needs it.

A partition's producer state is built the first time it is needed after a start (or a
change of leader): its latest snapshot, then every batch header after it, up to a whole
segment. Handlers that need it (Produce for the sequence checks and segment-roll
snapshots, Fetch and ListOffsets for the LSO) await :func:`prepare_producer_states`
first, while nothing is looked up yet, so that no request holds the event loop for it.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from functools import partial

from trio_broker.handlers.base import RequestContext
from trio_broker.handlers.topic_lookup import find_topic


async def prepare_producer_states(
    ctx: RequestContext, wanted: Iterable[tuple[str | None, uuid.UUID | None, Iterable[int]]]
) -> None:
    """``wanted``: (topic name, topic id, partition indexes) as the request names them.

    Only partitions this broker leads: a follower's state is never used (nor kept).
    """
    services = ctx.services
    producers = services.producers
    for name, topic_id, indexes in wanted:
        topic, _, _ = find_topic(ctx, name, topic_id)
        if topic is None:
            continue
        for index in indexes:
            if not 0 <= index < len(topic.logs):
                continue
            log = topic.logs[index]
            if producers.loaded(topic.name, index, log):
                continue
            if services.leaders.leader_term(topic.name, index) is None:
                continue
            await services.run_off_loop(partial(producers.prepare, topic.name, index, log))
