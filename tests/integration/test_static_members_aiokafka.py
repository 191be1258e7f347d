"""Static members (KIP-345) with the real aiokafka client: what its test_kip_345_enabled
checks, written our own way, against an in-process broker with file storage.

Two consumers with a ``group.instance.id`` share a two-partition topic:

1. the first one alone gets both partitions;
2. the second joins: once it has its partition, the first must already have given up
   that one. The broker used to answer the second (a follower syncing while the
   leader's assignment was being fsynced) from memory before the leader, so the first
   still owned both partitions when the second owned one of them;
3. the second unsubscribes and subscribes again: as a static member it gets the same
   partition back without the first being rebalanced;
4. the second stops without leaving (static members do not send LeaveGroup); when its
   session runs out the first gets both partitions again.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.integration.test_groups_clients import in_thread
from trio_broker.server.broker import Broker

TOPIC = "kip345"
GROUP = "kip345-group"
SESSION_MS = 6_000  # the broker's group.min.session.timeout.ms: step 4 waits for it


def run_static_members(bootstrap: str) -> None:
    async def main() -> None:
        from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition

        class Listener(ConsumerRebalanceListener):  # type: ignore[misc]
            def __init__(self) -> None:
                self.revoked: list[set[Any]] = []
                self.assigned: list[set[Any]] = []

            async def on_partitions_revoked(self, revoked: Any) -> None:
                self.revoked.append(set(revoked))

            async def on_partitions_assigned(self, assigned: Any) -> None:
                self.assigned.append(set(assigned))

        async def eventually(condition: Any, what: str) -> None:
            async def poll() -> None:
                # Polling: the listeners are plain callbacks of the client, no event to await.
                while not condition():  # noqa: ASYNC110
                    await asyncio.sleep(0.05)

            try:
                await asyncio.wait_for(poll(), 30)
            except TimeoutError:
                raise AssertionError(f"timed out waiting for {what}") from None

        def consumer(instance: str) -> Any:
            return AIOKafkaConsumer(
                bootstrap_servers=bootstrap, group_id=GROUP, group_instance_id=instance,
                auto_offset_reset="earliest", session_timeout_ms=SESSION_MS,
                heartbeat_interval_ms=500,
            )  # fmt: skip

        both = {TopicPartition(TOPIC, 0), TopicPartition(TOPIC, 1)}
        first, second = consumer("static-1"), consumer("static-2")
        listen1, listen2 = Listener(), Listener()
        first.subscribe([TOPIC], listener=listen1)
        second.subscribe([TOPIC], listener=listen2)
        try:
            # 1. Alone: both partitions.
            await first.start()
            await first.seek_to_committed()  # (waits for the assignment)
            assert first.assignment() == both and listen1.assigned == [both]

            # 2. The second joins; as soon as it owns a partition the first owns only the
            # other (both were answered when the generation was stored, the leader too).
            await second.start()
            await second.seek_to_committed()
            mine, theirs = set(first.assignment()), set(second.assignment())
            assert len(theirs) == 1 and mine == both - theirs, (mine, theirs)
            # (The client calls the listener after it took the assignment.)
            await eventually(lambda: len(listen1.assigned) == 2, "the first's second assignment")
            assert listen1.revoked == [set(), both] and listen1.assigned == [both, mine]
            assert listen2.revoked == [set()] and listen2.assigned == [theirs]

            # 3. Unsubscribe and subscribe again: same partition, the first not rebalanced.
            second.unsubscribe()
            second.subscribe([TOPIC], listener=listen2)
            await asyncio.wait_for(second._subscription.wait_for_assignment(), 30)
            assert set(second.assignment()) == theirs
            await eventually(lambda: len(listen2.assigned) == 2, "the second's assignment again")
            assert listen2.assigned == [theirs, theirs]
            assert listen1.assigned == [both, mine] and set(first.assignment()) == mine

            # 4. The second stops without leaving: after its session the first has both.
            await second.stop()

            await eventually(lambda: len(listen1.assigned) == 3, "the second's session to end")
            assert listen1.revoked[-1] == mine and listen1.assigned[-1] == both
            assert first.assignment() == both
        finally:
            await second.stop()
            await first.stop()

    asyncio.run(main())


@pytest.mark.timeout(300)
async def test_static_members_see_consistent_assignments(broker: Broker, bootstrap: str) -> None:
    broker.topics.create(TOPIC, 2)
    await in_thread(lambda: run_static_members(bootstrap))
