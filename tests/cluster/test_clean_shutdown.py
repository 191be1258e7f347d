"""SIGTERM at any moment of a cluster broker's life ends it cleanly: exit status 0, and no
ERROR or traceback in its log.

A nemesis run found stops logging ``ERROR ... applying the cluster view`` with
``RuntimeError: Nursery is closed to new arrivals``: the broker was taking over
``__consumer_offsets`` partitions (its replica manager finishing an election in a
worker thread) when the shutdown had already closed the group coordinator. Here brokers
are stopped at several points after they start (registering, electing, loading the
internal topics' tables) and while they take over the partitions of a broker stopped
just before them.
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tests.cluster.test_cluster_e2e import every_broker_lists
from tests.cluster.test_cluster_faults import SESSION_MS, ConfiguredBroker, running, servers
from trio_broker.services.internal_topics import CONSUMER_OFFSETS

pytestmark = pytest.mark.timeout(400)

# Many internal partitions: every election moves many coordinator tables at once; a
# leader rebalance every second gives a restarted broker its preferred partitions back
# (more leadership changes, soon after its start).
CONFIG = (
    "min.insync.replicas=2\n"
    "default.replication.factor=3\n"
    f"zookeeper.session.timeout.ms={SESSION_MS}\n"
    "offsets.topic.num.partitions=30\n"
    "transaction.state.log.num.partitions=30\n"
    "leader.imbalance.check.interval.seconds=1\n"
    # The one consumer's group forms at once, not after Kafka's 3 s wait for more members.
    "group.initial.rebalance.delay.ms=0\n"
)
#: Seconds between a broker's "listening on" and its SIGTERM, one drawn from each range:
#: the fault's timing is what these vary (before it joins the cluster, while it
#: registers and elects, after it leads). Drawn afresh each run from a printed seed
#: (``CLEAN_SHUTDOWN_SEED`` replays one): runs between them cover the ranges, where the
#: same three fixed points repeated in three rounds checked one thing three times.
DELAY_RANGES = ((0.0, 0.2), (0.2, 1.0), (1.0, 2.0))
BAD = re.compile(r" ERROR |Traceback|CRITICAL")


def _since_last_start(broker: ConfiguredBroker) -> str:
    return broker.log_text().rsplit("===== e2e: start #", 1)[-1]


def _stop_cleanly(broker: ConfiguredBroker, when: str, *, signalled: bool = False) -> None:
    """SIGTERM (unless ``signalled`` already: a second one would be no graceful stop)
    and check how it ended."""
    if signalled:
        assert broker.proc is not None
        try:
            broker.proc.wait(60)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{when}: still running 60 s after SIGTERM\n{broker.log_tail()}")
    code = broker.stop()
    text = _since_last_start(broker)
    bad = [line for line in text.splitlines() if BAD.search(line)]
    assert code == 0, f"{when}: exit status {code}\n{broker.log_tail()}"
    assert not bad, f"{when}:\n" + "\n".join(bad[:20]) + "\n" + broker.log_tail()


def _use_the_internal_topics(bootstrap: str) -> None:
    """Make __consumer_offsets (a committed group) and __transaction_state (a
    transactional producer), so that brokers lead their partitions."""
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": "shutdown"})
    producer.init_transactions(60)
    producer.begin_transaction()
    producer.produce("work", value=b"x")
    producer.commit_transaction(60)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "shutdown",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})  # fmt: skip
    consumer.subscribe(["work"])
    deadline = time.monotonic() + 60
    msg = None
    while msg is None and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is not None and msg.error() is not None:
            msg = None
    assert msg is not None, "nothing consumed"
    consumer.commit(msg, asynchronous=False)
    consumer.close()


def _sigterm_once_it_logs(
    broker: ConfiguredBroker, text: str, *, after: int = 0, timeout_s: float = 60
) -> None:
    """SIGTERM the broker the moment its log since its start (past ``after``
    characters) shows ``text``."""
    deadline = time.monotonic() + timeout_s
    while text not in _since_last_start(broker)[after:]:
        assert time.monotonic() < deadline, f"no {text!r} in\n{broker.log_tail()}"
        time.sleep(0.005)  # polling its log file
    broker.signal(signal.SIGTERM)


def test_sigterm_at_any_point_of_start_and_leadership_changes_exits_cleanly(
    tmp_path: Path, zookeeper: str
) -> None:
    seed = int(os.environ.get("CLEAN_SHUTDOWN_SEED") or random.randrange(1 << 32))
    rng = random.Random(seed)
    delays = [round(rng.uniform(low, high), 3) for low, high in DELAY_RANGES]
    print(f"CLEAN_SHUTDOWN_SEED={seed}: SIGTERM {delays} s after 'listening on'")
    config = tmp_path / "broker.properties"
    config.write_text(CONFIG)
    brokers = {
        b: ConfiguredBroker(tmp_path / f"broker{b}", b, zookeeper, config) for b in (1, 2, 3)
    }
    with running(brokers):
        bootstrap = servers(brokers)
        admin = AdminClient({"bootstrap.servers": bootstrap})

        def three_brokers() -> None:
            # Every broker, not one: CreateTopics assigns replicas from the list of the
            # broker it reaches (ci20: "replication factor 3 is larger than the 2 live
            # brokers" after another broker had listed three).
            every_broker_lists(brokers, {1, 2, 3})

        three_brokers()
        [future] = admin.create_topics([NewTopic("work", num_partitions=3)]).values()
        future.result(timeout=60)
        _use_the_internal_topics(bootstrap)
        for delay in delays:  # while it starts: joining, registering, electing
            _stop_cleanly(brokers[3], "broker 3")
            brokers[3].start()
            time.sleep(delay)  # the fault's timing, not a wait for a condition
            _stop_cleanly(brokers[3], f"broker 3 stopped {delay} s after it listened")
            brokers[3].start()
        # Taking its preferred leaderships back (the leader rebalance).
        three_brokers()
        _stop_cleanly(brokers[3], "broker 3")
        brokers[3].start()
        _sigterm_once_it_logs(brokers[3], f"leading {CONSUMER_OFFSETS}-")
        _stop_cleanly(brokers[3], "broker 3 taking back its leaderships", signalled=True)
        brokers[3].start()
        # Taking over the partitions of broker 2, which leaves.
        three_brokers()
        mark = len(_since_last_start(brokers[3]))
        brokers[2].signal(signal.SIGTERM)
        _sigterm_once_it_logs(brokers[3], f"leading {CONSUMER_OFFSETS}-", after=mark)
        _stop_cleanly(brokers[3], "broker 3 taking over from broker 2", signalled=True)
        _stop_cleanly(brokers[2], "broker 2 leaving", signalled=True)
        brokers[2].start()
        brokers[3].start()
        three_brokers()
        _stop_cleanly(brokers[1], "broker 1 at the end")
