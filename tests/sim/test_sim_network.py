"""sim/network.py does to connections what TCP does, and nothing else."""

from __future__ import annotations

import random

import pytest
import trio
import trio.testing

from sim.network import CONNECT_TIMEOUT_S, Network, SimSocket


async def _network_with_server(
    nursery: trio.Nursery,
) -> tuple[Network, list[SimSocket]]:
    network = Network(random.Random(1))
    accepted: list[SimSocket] = []
    network.listeners["b1"] = lambda sock, _client: accepted.append(sock)
    return network, accepted


async def test_bytes_arrive_in_order_after_the_latency(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with trio.open_nursery() as nursery:
        network, accepted = await _network_with_server(nursery)
        stream = await network.connect("client", "b1")
        sent_at = trio.current_time()
        for chunk in (b"one ", b"two ", b"three"):
            await stream.send_all(chunk)
        server = accepted[0]
        received = b""
        while len(received) < len(b"one two three"):
            received += await server.recv(100)
        assert received == b"one two three"
        assert trio.current_time() > sent_at  # not before the link's latency
        assert await server.sendmsg([b"an", b"swer"]) == 6
        assert await stream.receive_some(100) == b"answer"
        nursery.cancel_scope.cancel()


async def test_a_partition_holds_bytes_until_it_heals(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with trio.open_nursery() as nursery:
        network, accepted = await _network_with_server(nursery)
        stream = await network.connect("client", "b1")
        network.partition("client", "b1")
        await stream.send_all(b"retransmitted")
        with trio.move_on_after(5.0) as waited:
            await accepted[0].recv(100)
        assert waited.cancelled_caught  # nothing crosses a partition
        network.heal("client", "b1")
        with trio.fail_after(1.0):
            assert await accepted[0].recv(100) == b"retransmitted"
        # A new connection across a partition times out.
        network.partition("client", "b1")
        started = trio.current_time()
        with pytest.raises(OSError):
            await network.connect("client", "b1")
        assert trio.current_time() - started == pytest.approx(CONNECT_TIMEOUT_S)
        nursery.cancel_scope.cancel()


async def test_a_reset_breaks_both_ends_and_eof_ends_a_read(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with trio.open_nursery() as nursery:
        network, accepted = await _network_with_server(nursery)
        stream = await network.connect("client", "b1")
        network.reset_node("b1")
        with pytest.raises(OSError):
            await accepted[0].recv(100)
        with pytest.raises(trio.BrokenResourceError):
            await stream.send_all(b"late")
        with pytest.raises(OSError):
            await stream.receive_some(100)
        # A connection closed by the client: the server reads what was sent, then EOF.
        second = await network.connect("client", "b1")
        await second.send_all(b"last words")
        await second.aclose()
        assert await accepted[1].recv(100) == b"last words"
        assert await accepted[1].recv(100) == b""
        # A node that is down refuses connections.
        del network.listeners["b1"]
        with pytest.raises(OSError):
            await network.connect("client", "b1")
        nursery.cancel_scope.cancel()
