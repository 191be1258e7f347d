"""kafka-python group consumers that subscribe: let the client learn its topics before it joins.

kafka-python (3.0.12, and its main branch as of 2026-08) can strand a subscribing group
member for good. Its first JoinGroup usually leaves before its own metadata holds the
subscribed topic (the refresh for the topic waits out ``retry_backoff_ms`` after the
bootstrap answer, which named no topic), so as the group's leader it assigns nothing
("No partition metadata for topic ..."). When the topic's metadata arrives the
coordinator's metadata snapshot no longer matches the one it assigned from, and it
rejoins. If that JoinGroup + SyncGroup outlasts the ``poll()`` that started it, poll
returns and leaves the attempt in flight; the attempt's own assignment step copies the
current snapshot, so the next poll's ``need_rejoin()`` is False and
``join_group_async`` (``while self.need_rejoin():``) never collects the finished
attempt. Its ``_on_join_complete`` never runs: the member gets no partitions and sends
no heartbeat (disabled for the join), the coordinator drops it after
``session.timeout.ms``, and it never hears so. Kafka's Java client loops while a rejoin
is needed *or a join is pending*, which this lacks. Seen as "timed out waiting for the
Python members" in tests/e2e/test_java_client.py and a 90 s timeout in
tests/integration/test_groups_clients.py (issue 30), about one join in twelve with
``poll(timeout_ms=200)`` under a one-core CPU hog.

The broker answers as Kafka does (the topic, with every partition and its leader);
Kafka's default ``group.initial.rebalance.delay.ms`` of 3 s merely hides the race for a
group without members, and the tests set it to 0. A user of kafka-python avoids the rejoin by asking
for the topic's partitions before the first poll: the answer goes through the same
metadata update that sets the coordinator's snapshot, so the first assignment already
covers every partition and no metadata-driven rejoin follows.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kafka import KafkaConsumer

#: A broker that has just created the topic may not list it yet; a loaded one answers slowly.
KNOW_TOPICS_S = 60.0


def knows_its_topics(consumer: KafkaConsumer, timeout_s: float = KNOW_TOPICS_S) -> KafkaConsumer:
    """Wait until ``consumer`` (subscribed, not yet polled) has metadata listing the
    partitions of each topic it subscribed to; returns it. Call before the first poll."""
    deadline = time.monotonic() + timeout_s
    for topic in sorted(consumer.subscription() or ()):
        # partitions_for_topic asks the cluster when its metadata lacks the topic.
        while not consumer.partitions_for_topic(topic):
            assert time.monotonic() < deadline, f"kafka-python's metadata never listed {topic}"
            time.sleep(0.05)
    return consumer
