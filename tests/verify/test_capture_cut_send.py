"""A response whose send is cut short is not captured (in-process broker, no Spark).

The tap stamps a response before its send (so an answer is ordered before the request
it caused) but adds it to the capture only once the send completed: a response that a
reset cut off never reached the client, and a pcap of the link holds no such frame.
"""

from __future__ import annotations

import socket
import struct
from pathlib import Path

import pytest
import trio

pytest.importorskip("pyarrow", reason="the verify extra (pyarrow) is not installed")

from tests.integration.test_metrics_topics import fetch_request
from tests.integration.test_produce_acks0 import read_frame
from tests.verify.helpers import read_capture
from tests.waits import eventually
from trio_broker.config import BrokerConfig
from trio_broker.protocol import messages as m
from trio_broker.protocol.records import build_batch
from trio_broker.server.broker import Broker

TOPIC = "big-answers"
#: Far more than loopback's socket buffers hold, so the broker's send of one Fetch
#: response blocks until the client reads, or resets.
BATCHES, VALUE_BYTES = 24, 900_000
FETCH_MAX_BYTES = 64 << 20


def _produce(correlation_id: int) -> bytes:
    batch = build_batch([(b"k", b"x" * VALUE_BYTES)])
    partition = m.ProduceRequest.TopicProduceData.PartitionProduceData(
        index=0, records=bytes(batch)
    )
    request = m.ProduceRequest(
        acks=1,
        timeout_ms=5000,
        topic_data=[m.ProduceRequest.TopicProduceData(name=TOPIC, partition_data=[partition])],
    )
    return m.encode_request(m.ApiKey.PRODUCE, 9, correlation_id, "cut-send", request)


def _big_fetch(correlation_id: int) -> bytes:
    request = fetch_request(TOPIC, 0)
    request.max_bytes = FETCH_MAX_BYTES
    request.topics[0].partitions[0].partition_max_bytes = FETCH_MAX_BYTES
    return m.encode_request(m.ApiKey.FETCH, 4, correlation_id, "cut-send", request)


async def test_a_response_cut_off_by_a_reset_is_not_captured(tmp_path: Path) -> None:
    capture_dir = tmp_path / "capture"
    config = BrokerConfig(
        port=0, data_dir=tmp_path / "data", storage="file", capture_dir=capture_dir
    )
    async with trio.open_nursery() as nursery:
        broker: Broker = await nursery.start(Broker(config).run)
        broker.topics.create(TOPIC, 1)
        host, port = broker.bound[0]
        stream = await trio.open_tcp_stream(host, port)
        with trio.fail_after(60):
            for correlation_id in range(BATCHES):
                await stream.send_all(_produce(correlation_id))
                assert await read_frame(stream) is not None
            # Ask for everything and read nothing: the broker's send blocks part-way.
            await stream.send_all(_big_fetch(100))
            (connection,) = broker.connections.values()
            await eventually(lambda: connection.send_progress is not None, "the blocked send")
            # A reset (linger 0) cuts the send off: the broker's send fails.
            stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            await stream.aclose()
            await eventually(lambda: not broker.connections, "the broker to drop the connection")
        nursery.cancel_scope.cancel()  # the broker stops: the tap writes what it holds
    rows = read_capture(capture_dir).to_pylist()
    fetches = [(r["direction"], r["correlation_id"]) for r in rows if r["api_key"] == 1]
    assert fetches == [("request", 100)]
    answered = [r["correlation_id"] for r in rows if r["direction"] == "response"]
    assert answered == list(range(BATCHES))
