"""A follower's replicated appends through the replica fetcher's own code, in process:
CPU per appended batch (process CPU, worker threads included, from ``getrusage``).

The fetcher's ``_fetch_once`` runs against a stand-in leader connection that answers
each Fetch with the next ``BATCHES`` batches (built before the timed loop) at the
offset asked for, into a file-backed log on a temporary dir: the fetch request built,
the answer's batches appended as they are, the log marked dirty, the producer snapshot
check at a roll (a worker thread), the HW and log start kept. The same calls in every
tree since the fetcher took its partitions' logs from the topic manager (a node alone's
``LocalReplication`` takes them, so a tree whose fetcher appends through a
``Partition`` finds one), so two trees compare by running it under each PYTHONPATH in
turn, interleaved:

    for i in 1 2 3; do for t in /tmp/main /work/wt/follower; do
        PYTHONPATH=$t .venv/bin/python bench/replicated_append.py 2000; done; done
"""

from __future__ import annotations

import resource
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import trio

from trio_broker.cluster import replica_fetcher
from trio_broker.cluster.replica_fetcher import FollowerRole
from trio_broker.protocol import messages as m
from trio_broker.protocol.records import build_batch
from trio_broker.services.local_replication import LocalReplication
from trio_broker.services.producers import ProducerStateRegistry
from trio_broker.services.topics import TopicManager
from trio_broker.storage.log import LogConfig

#: Batches per fetch answer, and records per batch.
BATCHES = 4
RECORDS = 10


class NoSync:
    """The flusher's side the fetcher asks (nothing synced: acks.all.fsync off)."""

    def mark_dirty(self, log: object, messages: int = 1) -> None:
        pass

    async def wait_durable(self, log: object, offset: int) -> None:
        pass


class Leader:
    """Answers each Fetch with the next prebuilt answer (its batches at the offset the
    follower asks from)."""

    def __init__(self, answers: list[bytes]) -> None:
        self.answers = answers
        self.next = 0

    async def call(self, api_key: Any, version: int, request: Any, *_timeout: float) -> Any:
        records = self.answers[self.next]
        self.next += 1
        wanted = request.topics[0].partitions[0]
        high_watermark = wanted.fetch_offset + BATCHES * RECORDS
        FR = m.FetchResponse.FetchableTopicResponse
        part = FR.PartitionData(
            partition_index=0, high_watermark=high_watermark, log_start_offset=0,
            records=records,
        )  # fmt: skip
        return m.FetchResponse(
            throttle_time_ms=0, error_code=0, session_id=0,
            responses=[FR(topic="t", partitions=[part])],
        )  # fmt: skip


def _batch(base_offset: int) -> bytes:
    """One of the leader's batches as it stores them: ``RECORDS`` records of an
    idempotent producer, at ``base_offset``, in leader epoch 0."""
    return bytes(
        build_batch(
            [(None, b"v" * 100)] * RECORDS, base_offset=base_offset, producer_id=5,
            producer_epoch=0, base_sequence=base_offset, base_timestamp=0,
            partition_leader_epoch=0,
        )
    )  # fmt: skip


async def run(rounds: int, data_dir: Path) -> float:
    topics = TopicManager(data_dir, LogConfig(), lambda: 0)
    topics.create("t", 1)
    producers = ProducerStateRegistry(data_dir, lambda: 0)
    LocalReplication.over(topics, producers=producers)  # takes the Partition (either tree)
    answers = []
    for r in range(rounds):
        base = r * BATCHES * RECORDS
        answers.append(b"".join(_batch(base + b * RECORDS) for b in range(BATCHES)))
    manager = SimpleNamespace(
        view=SimpleNamespace(broker_id=2), topics=topics, durability=NoSync(),
        producers=producers, sync_before_counting=False,
        following={("t", 0): FollowerRole(1, 0, needs_truncation=False)},
        roles_changed=trio.Event(), now_ms=lambda: 0, follower_throttle_rate=1 << 40,
        follower_throttled=lambda name, partition: False,
        partition_changed=lambda name, partition: None,
    )  # fmt: skip
    leader = Leader(answers)
    ready = dict(manager.following)
    before = resource.getrusage(resource.RUSAGE_SELF)
    for _ in range(rounds):
        await replica_fetcher._fetch_once(manager, leader, ready)  # type: ignore[arg-type]
    after = resource.getrusage(resource.RUSAGE_SELF)
    log = topics.log("t", 0)
    assert log is not None and log.log_end_offset == rounds * BATCHES * RECORDS
    topics.close()
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu / (rounds * BATCHES)


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    with tempfile.TemporaryDirectory() as tmp:
        per_batch = trio.run(run, rounds, Path(tmp))
    print(f"{per_batch * 1e6:.1f} us CPU per replicated batch ({rounds} fetches of {BATCHES})")


if __name__ == "__main__":
    main()
