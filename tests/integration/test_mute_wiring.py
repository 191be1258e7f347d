"""The connection's mute wiring for the two limits nothing else drives (issue 31).

An in-process broker over real sockets:

* A throttle while throttled (a second quota breach answered while the first throttle
  runs) extends the mute to the later end and never shortens it; the connection is
  muted once, and reads again only when the later throttle ends. A 0 ms throttle does
  not mute, a 1 ms one does.
* The broker-wide memory budget (``queued.max.request.bytes``): a request that fills it
  mutes its connection for MEMORY_PRESSURE, and the budget unmutes it once the request's
  bytes are released, so the next request on that connection is answered.

(The mutation run of server/connection.py's wiring left these paths unkilled.)
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
import trio

from tests.integration.raw_client import RawClient
from trio_broker.config import BrokerConfig
from trio_broker.protocol import messages as m
from trio_broker.server.broker import Broker
from trio_broker.server.connection import Connection
from trio_broker.state.mute import MuteReason

BUDGET = 200  # bytes: one long-poll fetch with a long topic name fills it
TOPIC = "wired-" + "t" * BUDGET


@pytest.fixture
def broker_config(tmp_path: Path) -> BrokerConfig:
    return BrokerConfig(
        port=0, data_dir=tmp_path / "data", storage="memory", queued_max_request_bytes=BUDGET
    )


async def connected(broker: Broker) -> tuple[RawClient, Connection]:
    """A raw client whose connection the broker has registered (and answered once)."""
    host, port = broker.bound[0]
    client = RawClient(await trio.open_tcp_stream(host, port), "wired")
    await client.call(m.ApiKey.API_VERSIONS, 0, m.ApiVersionsRequest())
    (conn,) = broker.connections.values()
    return client, conn


async def test_a_throttle_while_throttled_extends_the_mute_and_never_shortens_it(
    broker: Broker,
) -> None:
    client, conn = await connected(broker)
    times_set = conn.mute.statistics().times_set
    conn.throttle(0)
    assert MuteReason.THROTTLED not in conn.mute.reasons  # nothing to wait for
    conn.throttle(300)
    assert MuteReason.THROTTLED in conn.mute.reasons
    before = trio.current_time()
    conn.throttle(1500)  # a second breach inside the first throttle
    after = trio.current_time()
    assert before + 1.5 <= conn.throttled_until <= after + 1.5
    conn.throttle(100)  # a smaller one does not shorten it
    assert before + 1.5 <= conn.throttled_until <= after + 1.5
    assert (
        conn.mute.statistics().times_set[MuteReason.THROTTLED]
        == times_set.get(MuteReason.THROTTLED, 0) + 1
    )  # muted once, extended twice
    # A request sent now is read only when the later throttle ends.
    with trio.fail_after(60):
        await client.call(m.ApiKey.API_VERSIONS, 0, m.ApiVersionsRequest())
    assert trio.current_time() >= before + 1.5
    assert MuteReason.THROTTLED not in conn.mute.reasons
    conn.throttle(1)  # the smallest throttle mutes (and ends)
    assert (
        conn.mute.statistics().times_set[MuteReason.THROTTLED]
        == times_set.get(MuteReason.THROTTLED, 0) + 2
    )
    with trio.fail_after(60):
        await client.call(m.ApiKey.API_VERSIONS, 0, m.ApiVersionsRequest())


def long_poll(max_wait_ms: int) -> m.FetchRequest:
    Req = m.FetchRequest
    partition = Req.FetchTopic.FetchPartition(
        partition=0, fetch_offset=0, log_start_offset=-1, partition_max_bytes=1 << 20
    )
    return Req(replica_id=-1, max_wait_ms=max_wait_ms, min_bytes=1, max_bytes=1 << 20,
               isolation_level=0, session_id=0, session_epoch=-1,
               topics=[Req.FetchTopic(topic=TOPIC, partitions=[partition])],
               forgotten_topics_data=[], rack_id="")  # fmt: skip


async def test_the_memory_budget_mutes_and_unmutes_the_connection(broker: Broker) -> None:
    broker.topics.create(TOPIC, 1)
    client, conn = await connected(broker)
    fetch = m.encode_request(m.ApiKey.FETCH, 12, 100, "wired", long_poll(500))
    assert len(fetch) >= BUDGET  # this one request exhausts the budget
    versions = m.encode_request(m.ApiKey.API_VERSIONS, 0, 101, "wired", m.ApiVersionsRequest())
    muted_for_memory = False
    await client.stream.send_all(fetch + versions)
    with trio.fail_after(20):
        # While the long poll waits its bytes hold the budget: the reader is muted.
        while not muted_for_memory:
            muted_for_memory = MuteReason.MEMORY_PRESSURE in conn.mute.reasons
            await trio.sleep(0.005)
        answered = []
        for _ in range(2):  # the fetch, then the request read once the budget unmuted
            (size,) = struct.unpack(">i", await client._read_exactly(4))
            body = await client._read_exactly(size)
            answered.append(struct.unpack(">i", body[:4])[0])
    assert answered == [100, 101]
    assert MuteReason.MEMORY_PRESSURE not in conn.mute.reasons
    assert broker.memory.in_use == 0
