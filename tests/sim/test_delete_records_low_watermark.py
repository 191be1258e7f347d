"""DeleteRecords in a cluster answers as Kafka's delayed DeleteRecords (the simulator).

On the simulator's in-memory brokers, one partition on brokers 1-3 led by broker 1,
DeleteRecords sent over the wire to the leader:

- it answers once every live replica's log starts at the requested offset (the low
  watermark), not as soon as the leader cut its own log;
- a follower that cannot fetch (cut off from the leader, still registered) holds the
  answer back until timeout_ms: REQUEST_TIMED_OUT;
- -1 means the high watermark, and an offset above it (records not yet on every ISR
  member) is OFFSET_OUT_OF_RANGE, as Kafka's maybeIncrementLogStartOffset refuses.

Before the fix the leader answered at once with its own log start as the low watermark
while the followers' logs still started at 0, and cut uncommitted records (it took the
log end for the high watermark).
"""

from __future__ import annotations

import random
from typing import Any

import trio
import trio.testing

from sim.client import Producer, _Conn
from sim.cluster import SimBroker, SimCluster
from sim.simulation import BROKER_IDS, _deterministic
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.protocol.records import build_batch

TOPIC = "t"
DELETE_RECORDS_VERSION = 2
PRODUCE_VERSION = 9

Starts = dict[str, int]


def log_starts(sims: list[SimBroker]) -> Starts:
    out: Starts = {}
    for s in sims:
        log = s.broker.topics.log(TOPIC, 0) if s.broker is not None else None
        if log is not None:
            out[s.node] = log.log_start_offset
    return out


async def delete_records(conn: _Conn, offset: int, timeout_ms: int) -> tuple[int, int]:
    """(error code, low watermark) of DeleteRecords for partition 0."""
    Req = m.DeleteRecordsRequest
    request = Req(
        timeout_ms=timeout_ms,
        topics=[Req.DeleteRecordsTopic(name=TOPIC, partitions=[
            Req.DeleteRecordsTopic.DeleteRecordsPartition(partition_index=0, offset=offset)
        ])],
    )  # fmt: skip
    response = await conn.call(m.ApiKey.DELETE_RECORDS, DELETE_RECORDS_VERSION, request)
    part = response.topics[0].partitions[0]
    return part.error_code, part.low_watermark


async def produce_acks1(conn: _Conn) -> None:
    Req = m.ProduceRequest
    batch = build_batch([(None, b"uncommitted")], base_timestamp=0)
    request = Req(
        acks=1, timeout_ms=1000,
        topic_data=[Req.TopicProduceData(name=TOPIC, partition_data=[
            Req.TopicProduceData.PartitionProduceData(index=0, records=bytes(batch))
        ])],
    )  # fmt: skip
    response = await conn.call(m.ApiKey.PRODUCE, PRODUCE_VERSION, request)
    assert response.responses[0].partition_responses[0].error_code == ErrorCode.NONE


async def scenario(case: str, result: dict[str, Any]) -> None:
    cluster = SimCluster(BROKER_IDS, random.Random(1))
    network, sims = cluster.network, cluster.sims
    async with trio.open_nursery() as nursery:
        first = await cluster.start(nursery)
        await first.replication.admin.create_topic(TOPIC, 1, 3, {}, {0: [1, 2, 3]})
        producer = Producer(network, TOPIC, BROKER_IDS)
        while len(producer.acks) < 4:
            await producer.produce_once(0)
        assert first.replication.leader_term(TOPIC, 0) is not None, "broker 1 leads"
        conn = _Conn(await network.connect("client", "b1"), "deleter")
        term = first.replication.terms[TOPIC, 0]
        log = first.topics.log(TOPIC, 0)
        assert log is not None
        if case == "all_live":
            result["answer"] = await delete_records(conn, -1, 30_000)
            result["starts"] = log_starts(sims)
            result["hw"] = term.high_watermark
        elif case == "cut_off":
            network.partition("b1", "b3")
            before = trio.current_time()
            result["answer"] = await delete_records(conn, -1, 1000)
            result["waited_s"] = trio.current_time() - before
            result["starts"] = log_starts(sims)
            result["hw"] = term.high_watermark
        else:  # above_hw
            network.partition("b1", "b3")
            hw = term.high_watermark
            await produce_acks1(conn)  # on the leader and broker 2, not broker 3: above the HW
            result["hw_and_end"] = (hw, term.high_watermark, log.log_end_offset)
            result["above"] = await delete_records(conn, log.log_end_offset, 200)
            result["minus_one"] = await delete_records(conn, -1, 200)
            result["leader_start"] = log.log_start_offset
        await conn.stream.aclose()
        await producer.close()
        nursery.cancel_scope.cancel()


def run(case: str) -> dict[str, Any]:
    result: dict[str, Any] = {}
    with _deterministic(1):
        trio.run(scenario, case, result, clock=trio.testing.MockClock(autojump_threshold=0))
    return result


def test_delete_records_answers_once_every_replica_moved_its_log_start() -> None:
    got = run("all_live")
    hw = got["hw"]
    assert hw > 0, got
    assert got["answer"] == (ErrorCode.NONE, hw), got
    # At the answer every replica's log starts at the high watermark (the followers
    # learnt the leader's log start and told theirs back in a fetch).
    assert got["starts"] == {"b1": hw, "b2": hw, "b3": hw}, got


def test_a_follower_that_cannot_fetch_holds_the_answer_until_the_timeout() -> None:
    got = run("cut_off")
    error, low_watermark = got["answer"]
    assert error == ErrorCode.REQUEST_TIMED_OUT, got
    assert low_watermark < got["hw"], got  # broker 3's log start, known at the cut
    assert got["waited_s"] >= 1.0, got  # the request's timeout_ms
    # The leader cut its log all the same; broker 3 never heard of it.
    assert got["starts"]["b1"] == got["hw"] and got["starts"]["b3"] == 0, got


def test_minus_one_is_the_high_watermark_and_above_it_is_out_of_range() -> None:
    got = run("above_hw")
    hw, hw_now, end = got["hw_and_end"]
    assert hw == hw_now < end, got  # the acks=1 record is not committed
    assert got["above"][0] == ErrorCode.OFFSET_OUT_OF_RANGE, got
    # -1 cuts at the HW, not the log end; broker 3 is cut off, so it times out.
    assert got["minus_one"][0] == ErrorCode.REQUEST_TIMED_OUT, got
    assert got["leader_start"] == hw, got
