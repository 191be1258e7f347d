"""The cluster-wide default of a dynamic broker config reaches every broker (the simulator).

On the simulator's in-memory brokers: three partitions, one led by each broker. An
IncrementalAlterConfigs of the BROKER resource "" (``kafka-configs --entity-type brokers
--entity-default``) sent to broker 1 sets min.insync.replicas=3: every broker's leader
term takes it without a restart (stored in ZooKeeper as Kafka's
``/config/brokers/<default>``, applied by each broker's config watch), and a broker that
restarts afterwards has it too. Before, the default stayed in broker 1's data dir and
brokers 2 and 3 went on with 2. Then the topic's own min.insync.replicas=1 (its config
znode, ``kafka-configs --entity-type topics --alter``), which overrides the default:
every leader term takes it too, as Kafka's brokers apply a topic's changed configs
without a restart.
"""

from __future__ import annotations

import random
from typing import Any

import trio
import trio.testing

from sim.client import _Conn
from sim.cluster import SESSION_TIMEOUT_MS, SimBroker, SimCluster
from sim.simulation import BROKER_IDS, _deterministic
from tests.waits import poll
from trio_broker.protocol import messages as m

TOPIC = "t"
TOPIC_RESOURCE, BROKER_RESOURCE, SET = 2, 4, 0
#: Virtual seconds for the config watches to apply the change (well under one).
APPLY_S = 10.0


def min_insync(sims: list[SimBroker]) -> dict[str, int | None]:
    """Each broker's min.insync.replicas on the partition it leads (None: leads none)."""
    out: dict[str, int | None] = {}
    for s in sims:
        replication = s.broker.replication if s.broker is not None else None
        terms = [] if replication is None else [
            t for (name, _), t in replication.terms.items() if name == TOPIC
        ]  # fmt: skip
        out[s.node] = terms[0].min_insync_replicas if terms else None
    return out


async def wait_for(condition: Any) -> None:
    await poll(condition, APPLY_S, 0.05)


async def scenario(result: dict[str, Any]) -> None:
    cluster = SimCluster(BROKER_IDS, random.Random(1))
    network, sims = cluster.network, cluster.sims
    async with trio.open_nursery() as nursery:
        first = await cluster.start(nursery)
        await first.replication.admin.create_topic(
            TOPIC, 3, 3, {}, {0: [1, 2, 3], 1: [2, 3, 1], 2: [3, 1, 2]}
        )
        await wait_for(lambda: None not in min_insync(sims).values())
        result["before"] = min_insync(sims)
        conn = _Conn(await network.connect("client", "b1"), "admin")

        async def set_min_insync(resource_type: int, name: str, value: str) -> int:
            """IncrementalAlterConfigs SET of min.insync.replicas; its error code."""
            Req = m.IncrementalAlterConfigsRequest
            Res = Req.AlterConfigsResource
            request = Req(
                validate_only=False,
                resources=[Res(resource_type=resource_type, resource_name=name, configs=[
                    Res.AlterableConfig(
                        name="min.insync.replicas", config_operation=SET, value=value
                    )
                ])],
            )  # fmt: skip
            response = await conn.call(m.ApiKey.INCREMENTAL_ALTER_CONFIGS, 1, request)
            return int(response.responses[0].error_code)

        result["error"] = await set_min_insync(BROKER_RESOURCE, "", "3")
        await wait_for(lambda: set(min_insync(sims).values()) == {3})
        result["after"] = min_insync(sims)
        # The topic's own override, changed after its config znode was first read.
        result["topic error"] = await set_min_insync(TOPIC_RESOURCE, TOPIC, "1")
        await wait_for(lambda: set(min_insync(sims).values()) == {1})
        result["topic"] = min_insync(sims)
        # Broker 3 restarts: its config watch reads the default again.
        await sims[2].crash(power_cut=False)
        await trio.sleep(SESSION_TIMEOUT_MS / 1000)
        sims[2].session_expires()
        await sims[2].start(nursery)
        restarted = sims[2]

        def restarted_has_it() -> bool:
            broker = restarted.broker
            return broker is not None and (
                broker.topics.broker_configs.value("min.insync.replicas") == "3"
            )

        await wait_for(restarted_has_it)
        result["restarted"] = restarted_has_it()
        await conn.stream.aclose()
        nursery.cancel_scope.cancel()


def test_the_cluster_wide_default_reaches_every_broker_without_a_restart() -> None:
    result: dict[str, Any] = {}
    with _deterministic(1):
        trio.run(scenario, result, clock=trio.testing.MockClock(autojump_threshold=0))
    assert result["before"] == {"b1": 2, "b2": 2, "b3": 2}, result  # the config file's
    assert result["error"] == 0, result
    assert result["after"] == {"b1": 3, "b2": 3, "b3": 3}, result
    assert result["topic error"] == 0, result
    assert result["topic"] == {"b1": 1, "b2": 1, "b3": 1}, (
        f"a topic's changed min.insync.replicas did not reach every leader: {result['topic']}"
    )
    assert result["restarted"], result
