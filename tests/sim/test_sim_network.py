"""sim/network.py does to connections what TCP does, and nothing else."""

from __future__ import annotations

import random

import pytest
import trio
import trio.testing

from sim import timers as wakes
from sim.network import CONNECT_TIMEOUT_S, Network, SimSocket
from sim.timers import virtual_clock


@pytest.fixture(params=["MockClock", "virtual_clock"])
def autojump_clock(request: pytest.FixtureRequest) -> trio.testing.MockClock:
    """Each test under both clocks: a test's MockClock (a reader waits in a cancel
    scope) and the simulation's (it parks on the clock's wake-ups, sim/timers.py)."""
    if request.param == "MockClock":
        return trio.testing.MockClock(autojump_threshold=0)
    return virtual_clock()


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


def test_wake_ups_come_on_time_and_a_cancelled_one_wakes_nothing() -> None:
    """sim/timers.py on the simulation's clock: a parked sleep ends at its time, with
    Trio's deadlines in time order; a cancelled one is taken off (its entry is stale:
    the task, parked again, is not woken early by it)."""
    woke: list[tuple[str, float]] = []

    async def sleeper(name: str, seconds: float) -> None:
        await wakes.sleep(seconds)
        woke.append((name, trio.current_time()))

    async def main() -> None:
        assert wakes.current_timers() is not None
        start = trio.current_time()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sleeper, "park 0.3", 0.3)
            nursery.start_soon(sleeper, "park 0.1", 0.1)

            async def trio_sleeper() -> None:
                await trio.sleep(0.2)
                woke.append(("trio 0.2", trio.current_time()))

            nursery.start_soon(trio_sleeper)
            with trio.move_on_after(0.05) as cancelled:
                await wakes.sleep(0.15)  # its entry at +0.15 stays in the heap, stale
            assert cancelled.cancelled_caught
            await wakes.sleep(0.25 - 0.05)  # parked again: not woken at +0.15
            woke.append(("park again 0.25", trio.current_time()))
        assert [(name, round(t - start, 9)) for name, t in woke] == [
            ("park 0.1", 0.1), ("trio 0.2", 0.2), ("park again 0.25", 0.25), ("park 0.3", 0.3),
        ]  # fmt: skip

    trio.run(main, clock=virtual_clock())

    async def under_mock_clock() -> None:
        # Under another clock the same calls are Trio's own sleeps.
        assert wakes.current_timers() is None
        start = trio.current_time()
        await wakes.sleep(0.1)
        assert trio.current_time() - start == pytest.approx(0.1)

    trio.run(under_mock_clock, clock=trio.testing.MockClock(autojump_threshold=0))
