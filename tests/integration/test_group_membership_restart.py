"""Group membership survives a broker restart: no rebalance, same generation.

Two confluent-kafka consumers form a Stable group; the broker stops and starts again
on the same port and data directory. It restores the group from the offsets log as
Stable with both members, so the consumers' heartbeats go on: neither is asked to
rebalance (no revoke/assign callback after the restart), the generation and member
ids stay, and consumption resumes from the committed offsets.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.integration.test_groups_clients import TOPIC, Consumed, in_thread, produce
from tests.ports import free_port
from tests.waits import eventually
from trio_broker.config import BrokerConfig
from trio_broker.protocol import messages as m
from trio_broker.server.broker import Broker
from trio_broker.state.group import GroupState

GROUP = "survivors"
PARTITIONS = 4


class Member:
    """One consumer thread; records its rebalance callbacks and member id."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.callbacks: list[str] = []
        self.member_id = ""
        self.lock = threading.Lock()

    def run(self, bootstrap: str, consumed: Consumed, stop: threading.Event) -> None:
        from confluent_kafka import Consumer, KafkaException

        consumer = Consumer({
            "bootstrap.servers": bootstrap, "group.id": GROUP, "auto.offset.reset": "earliest",
            "enable.auto.commit": False, "session.timeout.ms": 10_000,
            "heartbeat.interval.ms": 300, "reconnect.backoff.max.ms": 200,
        })  # fmt: skip

        def on_assign(_consumer: Any, partitions: list[Any]) -> None:
            with self.lock:
                self.callbacks.append(f"assign {sorted(p.partition for p in partitions)}")

        def on_revoke(_consumer: Any, partitions: list[Any]) -> None:
            with self.lock:
                self.callbacks.append(f"revoke {sorted(p.partition for p in partitions)}")

        consumer.subscribe([TOPIC], on_assign=on_assign, on_revoke=on_revoke)
        try:
            while not stop.is_set():
                messages = consumer.consume(100, timeout=0.2)
                with self.lock:
                    self.member_id = consumer.memberid() or ""
                values = [bytes(m.value() or b"").decode() for m in messages if not m.error()]
                if values:
                    consumed.add(self.name, values)
                    try:
                        consumer.commit(asynchronous=False)
                    except KafkaException:
                        pass  # the broker is restarting; the next commit covers it
        finally:
            consumer.close()

    def seen(self) -> list[str]:
        with self.lock:
            return list(self.callbacks)


def committed_total(broker: Broker) -> int:
    return sum(v.offset for v in broker.groups.committed_for_group(GROUP).values())


@pytest.mark.timeout(300)
async def test_members_keep_their_generation_across_a_restart(tmp_path: Path) -> None:
    config = BrokerConfig(port=free_port(), data_dir=tmp_path / "data",
                          group_initial_rebalance_delay_ms=0)  # fmt: skip
    bootstrap = f"127.0.0.1:{config.port}"
    members = [Member("a"), Member("b")]
    consumed, stop = Consumed(), threading.Event()
    first = [f"before-{i}" for i in range(40)]
    second = [f"after-{i}" for i in range(40)]
    async with trio.open_nursery() as clients:
        try:
            async with trio.open_nursery() as running:
                broker: Broker = await running.start(Broker(config).run)
                broker.topics.create(TOPIC, PARTITIONS)
                await in_thread(lambda: produce(bootstrap, TOPIC, first, PARTITIONS))
                for member in members:
                    clients.start_soon(in_thread, lambda m=member: m.run(bootstrap, consumed, stop))

                def settled() -> bool:
                    group = broker.groups.groups.get(GROUP)
                    return (
                        group is not None and group.state is GroupState.STABLE
                        and len(group.members) == 2 and committed_total(broker) == len(first)
                        and all(m.seen() and m.seen()[-1].startswith("assign") for m in members)
                    )  # fmt: skip

                await eventually(settled, "a Stable group of two that committed everything")
                group = broker.groups.groups[GROUP]
                generation, member_ids = group.generation_id, set(group.members)
                assignments = {mid: m.assignment for mid, m in group.members.items()}
                callbacks = [m.seen() for m in members]
                running.cancel_scope.cancel()  # stop the broker; the consumers keep running

            async with trio.open_nursery() as running:
                broker = await running.start(Broker(config).run)
                # Restored before any client could connect: Stable, same generation and members.
                group = broker.groups.groups[GROUP]
                assert group.state is GroupState.STABLE and group.generation_id == generation
                assert {mid: m.assignment for mid, m in group.members.items()} == assignments
                delivered_before = {name: consumed.count(name) for name in ("a", "b")}
                await in_thread(lambda: produce(bootstrap, TOPIC, second, PARTITIONS))
                await eventually(lambda: set(second) <= consumed.all(), "records after restart")
                await eventually(
                    lambda: committed_total(broker) == len(first) + len(second), "the commits"
                )
                # A few more heartbeats (300 ms apart) from every member on the restored group.
                beats = broker.handler_pool.latency.count(m.ApiKey.HEARTBEAT)
                await eventually(
                    lambda: (
                        broker.handler_pool.latency.count(m.ApiKey.HEARTBEAT)
                        >= beats + 3 * len(member_ids)
                    ),
                    "more heartbeats",
                )
                group = broker.groups.groups[GROUP]
                assert group.state is GroupState.STABLE and group.generation_id == generation
                assert set(group.members) == member_ids
                assert {m.member_id for m in members} == member_ids
                assert [m.seen() for m in members] == callbacks, "a member was asked to rebalance"
                # DescribeGroups over the wire says the same.
                described = await in_thread(lambda: describe(bootstrap))
                assert described == ("STABLE", member_ids)
                stop.set()
                await eventually(lambda: not broker.groups.groups[GROUP].members, "members leave")
                running.cancel_scope.cancel()
        finally:
            stop.set()  # (on failure too: the client threads end)
    # Resumed from the committed offsets: nothing from before was delivered again.
    with consumed.lock:
        again = [v for name, skip in delivered_before.items()
                 for v in consumed.by_client.get(name, [])[skip:]]  # fmt: skip
    assert sorted(again) == sorted(second)


def describe(bootstrap: str) -> tuple[str, set[str]]:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    description = admin.describe_consumer_groups([GROUP])[GROUP].result(timeout=60)
    return description.state.name, {m.member_id for m in description.members}
