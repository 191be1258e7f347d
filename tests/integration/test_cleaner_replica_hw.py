"""A replica's cleaner cleans only below its high watermark (Kafka: below the LSO, which
never passes the HW), so that a tail a new leader may still truncate is never rewritten.

An in-process broker whose replication is a stand-in saying what the replica manager
says (this replica's HW, whether it leads); the cleaner task and the logs are real.
"""

from __future__ import annotations

import time

import attrs

from trio_broker.protocol.records import Record, build_batch, iter_batches
from trio_broker.server.broker import Broker

TOPIC = "table"
CONFIGS = {"cleanup.policy": "compact", "segment.bytes": "1024", "min.cleanable.dirty.ratio": "0"}


@attrs.define
class ReplicaRole:
    """What ReplicaManager answers about one replica of the partition."""

    high_watermark: int | None
    leads: bool = False

    def replica_high_watermark(self, topic: str, partition: int) -> int | None:
        return self.high_watermark

    def leader_term(self, topic: str, partition: int) -> object | None:
        return object() if self.leads else None


def fill(broker: Broker, updates: int) -> None:
    log = broker.topics.log(TOPIC, 0)
    assert log is not None
    now = int(time.time() * 1000)
    for i in range(updates):  # one record per batch, 4 keys
        log.append(build_batch([Record(0, 0, b"k%d" % (i % 4), b"v%d" % i)]), now_ms=now)
    log.flush()


def offsets(broker: Broker) -> list[int]:
    log = broker.topics.log(TOPIC, 0)
    assert log is not None
    return [
        batch.offset_of(record)
        for region in log.read(0, 1 << 30, log.log_end_offset)
        for batch in iter_batches(region.read_bytes())
        for record in batch.records()
    ]


async def test_a_follower_cleans_below_its_high_watermark_only(broker: Broker) -> None:
    broker.topics.create(TOPIC, 1, CONFIGS)
    fill(broker, 200)
    log = broker.topics.log(TOPIC, 0)
    assert log is not None and len(log.segment_base_offsets()) > 5
    broker.replication = ReplicaRole(high_watermark=None)  # neither leads nor follows
    facts = await broker._transaction_facts(log)
    assert facts is not None and facts.last_stable_offset == log.log_start_offset
    assert await broker.log_cleaner.clean_once() is None
    assert offsets(broker) == list(range(200))

    hw = 120
    broker.replication = ReplicaRole(high_watermark=hw)  # a follower
    facts = await broker._transaction_facts(log)
    assert facts is not None and facts.last_stable_offset == hw
    assert await broker.log_cleaner.clean_once() is not None
    kept = offsets(broker)
    # Segments wholly below the HW were cleaned; at and above it nothing was touched,
    # although the same keys come again later.
    assert len([o for o in kept if o < hw]) < hw - 50
    assert [o for o in kept if o >= hw] == list(range(hw, 200))

    broker.replication = ReplicaRole(high_watermark=200, leads=True)  # the leader's HW
    facts = await broker._transaction_facts(log)
    assert facts is not None and facts.last_stable_offset == 200
    assert await broker.log_cleaner.clean_once() is not None
    # The same pass rules with a higher HW do clean there: the bound was what kept them.
    active = log.active_segment().base_offset
    assert active > hw + 10
    assert len([o for o in offsets(broker) if hw <= o < active]) < (active - hw) / 2
