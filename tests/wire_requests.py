"""Request bodies that many wire-level tests send, built in one place."""

from __future__ import annotations

from typing import Any

from trio_broker.protocol import messages as m


def fetch_request(
    topic: str,
    partition: int = 0,
    *,
    current_leader_epoch: int = -1,
    isolation_level: int = 0,
    fetch_offset: int = 0,
) -> Any:
    """A consumer's Fetch (replica id -1, no session) of one partition that answers at
    once (max wait 0, min bytes 0), up to 1 MiB."""
    Req = m.FetchRequest
    part = Req.FetchTopic.FetchPartition(
        partition=partition, current_leader_epoch=current_leader_epoch,
        fetch_offset=fetch_offset, log_start_offset=-1, partition_max_bytes=1 << 20,
    )  # fmt: skip
    return Req(
        replica_id=-1, max_wait_ms=0, min_bytes=0, max_bytes=1 << 20,
        isolation_level=isolation_level, session_id=0, session_epoch=-1,
        forgotten_topics_data=[], rack_id="",
        topics=[Req.FetchTopic(topic=topic, partitions=[part])],
    )  # fmt: skip
