"""The web console and ListConfigResources in a three-broker cluster.

Real ZooKeeper, three ``trio-broker serve`` processes, each with its metrics listener
and console writes on. A topic created through broker 1's console gets three replicas
that every broker's console shows in sync; every broker's ListConfigResources names the
three brokers. After broker 3 is killed, the consoles of the survivors list two brokers
and the topic's partitions without broker 3 in the ISR.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.test_cluster_e2e import eventually, every_broker_lists
from tests.cluster.test_cluster_faults import Cluster, ConfiguredBroker, three_brokers
from tests.e2e.conftest import METRICS_LINE
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode

pytestmark = pytest.mark.timeout(300)

CONFIG = "metrics.listener=127.0.0.1:0\nconsole.writes.enable=true\nmin.insync.replicas=2\n"
TOPIC = "console-replicated"
BROKER, BROKER_LOGGER = 4, 8


@pytest.fixture
def brokers(tmp_path: Path, zookeeper: str) -> Iterator[Cluster]:
    with three_brokers(tmp_path, zookeeper, CONFIG) as cluster:
        yield cluster


def console(broker: ConfiguredBroker, method: str, path: str, body: Any = None) -> Any:
    [port, *_] = METRICS_LINE.findall(broker.current_log())
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method,
                                     headers={"Content-Type": "application/json"})  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def in_sync(broker: ConfiguredBroker, replicas: list[int]) -> bool:
    status, topic = console(broker, "GET", f"/api/topics/{TOPIC}")
    return status == 200 and all(
        sorted(p["replicas"]) == replicas and sorted(p["isr"]) == replicas and p["leader"] > 0
        for p in topic["partitions"]
    )


def test_consoles_and_config_resources_follow_the_cluster(brokers: Cluster) -> None:
    every_broker_lists(brokers)
    for broker in brokers.values():
        # A broker's list and its controller come from two ZooKeeper watches: one that
        # lists the others may not have read the controller yet.
        def three_one_controller(broker: ConfiguredBroker = broker) -> bool:
            _, overview = console(broker, "GET", "/api/overview")
            states = [b["state"] for b in overview["brokers"]]
            ids = sorted(b["id"] for b in overview["brokers"])
            return ids == [1, 2, 3] and states.count("controller") == 1

        eventually(three_one_controller,
                   f"broker {broker.broker_id}'s console: three brokers, one the controller")  # fmt: skip
        with broker.connect() as conn:
            answer = conn.request(m.ApiKey.LIST_CONFIG_RESOURCES, 1,
                                  m.ListConfigResourcesRequest(resource_types=[BROKER]))  # fmt: skip
        assert answer.error_code == ErrorCode.NONE
        assert [(r.resource_type, r.resource_name) for r in answer.config_resources] == [
            (BROKER, "1"), (BROKER, "2"), (BROKER, "3")]  # fmt: skip

    status, created = console(brokers[1], "POST", "/api/topics", {
        "name": TOPIC, "partitions": 3, "replication_factor": 3})  # fmt: skip
    assert status == 201, created
    for broker in brokers.values():
        eventually(lambda broker=broker: in_sync(broker, [1, 2, 3]),  # type: ignore[misc]
                   f"broker {broker.broker_id}'s console shows three replicas in sync")  # fmt: skip

    brokers[3].kill9()
    for survivor in (1, 2):
        broker = brokers[survivor]

        def two_left(broker: ConfiguredBroker = broker) -> bool:
            _, overview = console(broker, "GET", "/api/overview")
            _, topic = console(broker, "GET", f"/api/topics/{TOPIC}")
            return sorted(b["id"] for b in overview["brokers"]) == [1, 2] and all(
                3 not in p["isr"] and p["leader"] in (1, 2) for p in topic["partitions"]
            )

        eventually(two_left, f"broker {survivor}'s console without broker 3")
