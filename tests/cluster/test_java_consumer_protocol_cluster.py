"""The Java consumer (kafka-clients 4.x, ``group.protocol=consumer``) across a kill -9 of
its group coordinator in a three-broker cluster.

Real ``serve`` processes on a real ZooKeeper, RF=3 everywhere (``__consumer_offsets``
too, 50 partitions as in Kafka). Maven runs ``tests/jvm``'s ``ConsumerProtocolClusterTest``
alone (the pom leaves it out of the full Java run) with the cluster's bootstrap and each
broker's PID: two Java members split a six-partition topic, read and commit 60 records;
the test asks describeConsumerGroups for the coordinator and kills that broker's process
with SIGKILL; 60 more records are produced; the members go on with the new coordinator,
which restored the group from its replica of the offsets partition. Asserted there: the
120 records read exactly once between them (none lost, none read again after its
commit), the same member ids with the same partitions on the new coordinator (no
rejoin), and every partition's committed offset at its end (20). Here: the JVM killed
exactly one broker, and the others are up.
"""

from __future__ import annotations

import shutil

import pytest

from tests.cluster import test_groups_replicated as replicated_groups
from tests.cluster.test_cluster_e2e import every_broker_lists
from tests.cluster.test_cluster_faults import Cluster, servers
from tests.e2e.test_java_client import MAVEN_TIMEOUT_S, run_maven

#: The brokers of the classic groups' failover tests (50 offsets partitions, RF=3).
cluster = replicated_groups.cluster

pytestmark = pytest.mark.timeout(MAVEN_TIMEOUT_S + 120)

#: What Maven prints when it cannot download kafka-clients, JUnit or a plugin.
UNRESOLVED = ("Could not resolve dependencies", "Could not transfer artifact",
              "or one of its dependencies could not be resolved")  # fmt: skip


def run_java_cluster_test(cluster: Cluster, properties: dict[str, object]) -> list[int]:
    """Runs one of ``tests/jvm``'s cluster tests with Maven, told the brokers (as
    ``bootstrap`` and ``bootstrap.cluster``) and each broker's PID (the
    Java test kills the ones it means to); asserts the Java test passed. Skips when Maven
    cannot resolve the module's artifacts. Returns the brokers the test killed."""
    if shutil.which("java") is None or shutil.which("mvn") is None:
        pytest.skip("the Java client needs Java 17 and Maven (scripts/install-system-deps.sh)")
    pids = {b: broker.proc.pid for b, broker in cluster.items() if broker.proc is not None}
    try:
        totals = run_maven({
            **properties, "bootstrap": servers(cluster), "bootstrap.cluster": servers(cluster),
            "cluster.pids": ",".join(f"{b}:{pid}" for b, pid in sorted(pids.items())),
        })  # fmt: skip
    except AssertionError as failed:
        if any(marker in str(failed) for marker in UNRESOLVED):
            pytest.skip(f"Maven could not resolve the Java test module's artifacts: {failed}")
        raise
    killed = [b for b, broker in cluster.items() if not broker.running]
    for b in killed:
        cluster[b].down_on_purpose = True
    logs = "\n".join(broker.log_tail() for broker in cluster.values())
    assert totals == {"tests": 1, "failures": 0, "errors": 0, "skipped": 0}, (totals, logs)
    return killed


def test_java_consumers_go_on_after_a_kill_9_of_their_coordinator(cluster: Cluster) -> None:
    every_broker_lists(cluster)  # a CreateTopics on any broker can place three replicas
    killed = run_java_cluster_test(cluster, {"test": "ConsumerProtocolClusterTest"})
    assert len(killed) == 1, killed
