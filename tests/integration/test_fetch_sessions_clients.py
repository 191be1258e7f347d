"""A kafka-python consumer whose fetch session the broker loses, or finds out of step.

The broker runs in-process, so the test can do what a restart or an eviction does to a
session without the connection dropping (a dropped connection makes the client start
over with a full fetch by itself): it removes the session, or moves its epoch. The
client's next incremental fetch is refused (FETCH_SESSION_ID_NOT_FOUND,
INVALID_FETCH_SESSION_EPOCH); it falls back to a full fetch, opens a new session and
goes on reading, every record once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

import trio
from confluent_kafka import Producer
from kafka import KafkaConsumer, TopicPartition

from tests.waits import eventually
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.server.broker import Broker

T = TypeVar("T")
TOPIC, PARTITIONS, PER_ROUND = "lost-sessions", 3, 60
WAIT_S = 60.0


async def in_thread(fn: Callable[[], T]) -> T:
    return await trio.to_thread.run_sync(fn)


def produce(bootstrap: str, first: int) -> list[str]:
    producer = Producer({"bootstrap.servers": bootstrap})
    values = [f"v{i}" for i in range(first, first + PER_ROUND)]
    for i, value in enumerate(values):
        producer.produce(TOPIC, value=value.encode(), partition=i % PARTITIONS)
    assert producer.flush(20) == 0
    return values


class Reader:
    """A kafka-python consumer (partitions assigned, no group) polling in its own thread."""

    def __init__(self, bootstrap: str) -> None:
        self.consumer = KafkaConsumer(
            bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
            fetch_max_wait_ms=100,
        )  # fmt: skip
        self.consumer.assign([TopicPartition(TOPIC, p) for p in range(PARTITIONS)])
        self.consumer.seek_to_beginning()
        self.read: list[str] = []
        self.stop = threading.Event()

    def run(self) -> None:
        deadline = time.monotonic() + 3 * WAIT_S
        while not self.stop.is_set() and time.monotonic() < deadline:
            for records in self.consumer.poll(timeout_ms=100).values():
                self.read.extend(r.value.decode() for r in records)
        self.consumer.close()


async def test_a_lost_or_stale_session_makes_kafka_python_start_a_new_one(
    broker: Broker, bootstrap: str
) -> None:
    broker.topics.create(TOPIC, PARTITIONS)
    sessions = broker.fetch_sessions
    produced = await in_thread(lambda: produce(bootstrap, 0))
    reader = await in_thread(lambda: Reader(bootstrap))  # it bootstraps: not on the loop
    async with trio.open_nursery() as nursery:
        nursery.start_soon(in_thread, reader.run)
        try:
            await eventually(lambda: len(reader.read) == PER_ROUND, "round 1")
            await eventually(lambda: sessions.incremental_fetches > 0, "incremental fetches")
            (first,) = sessions.sessions

            # Lost: as after an eviction. The next incremental fetch is not found.
            sessions.remove(first)
            produced += await in_thread(lambda: produce(bootstrap, PER_ROUND))
            await eventually(lambda: len(reader.read) == 2 * PER_ROUND, "round 2")
            # Round 2 may have come in the answer to a long poll under the lost session
            # (started before it was removed): then the refusal comes with the client's
            # next incremental fetch, after round 2 is read, and the full fetch after it
            # opens the new session when it answers, up to fetch.max.wait.ms later.
            await eventually(
                lambda: sessions.errors.get(ErrorCode.FETCH_SESSION_ID_NOT_FOUND, 0) >= 1,
                "the lost session's refusal",
            )
            await eventually(lambda: len(sessions.sessions) == 1, "a new session")
            (second,) = sessions.sessions
            assert second != first

            # Out of step: the session expects another epoch than the client sends (or,
            # if a long poll is under way, than the one its answer was meant to leave).
            sessions.sessions[second].epoch += 5
            taken = sessions.incremental_fetches
            produced += await in_thread(lambda: produce(bootstrap, 2 * PER_ROUND))
            await eventually(lambda: len(reader.read) == 3 * PER_ROUND, "round 3")
            # The same order as round 2's: round 3 may come under the stale session.
            await eventually(
                lambda: sessions.errors.get(ErrorCode.INVALID_FETCH_SESSION_EPOCH, 0) >= 1,
                "the stale session's refusal",
            )
            # The client closed the stale session with a full fetch and opened a third.
            await eventually(lambda: sessions.incremental_fetches > taken, "a new session")
            (third,) = sessions.sessions
            assert third not in (first, second)
        finally:
            reader.stop.set()
    assert sorted(reader.read) == sorted(produced)
    assert len(set(reader.read)) == len(reader.read)
