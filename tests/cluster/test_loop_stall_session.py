"""An event loop stall of half the ZooKeeper session timeout costs a cluster broker nothing.

A cluster broker in process (so that the test holds the broker's own event loop), on a
real ZooKeeper with a 4 s session, leading one partition. The test holds the loop for
2 s, as a CPU-bound request would, two ways:

- ``python``: a pure-Python loop. The interpreter hands the GIL to kazoo's connection
  thread every switch interval (5 ms), so its pings go on.
- ``gil``: one C call that keeps the GIL throughout (libc's ``poll`` through
  ``ctypes.PyDLL``; Python's ``re`` held it so in issue 28). kazoo's thread cannot run;
  ZooKeeper hears nothing for up to a ping interval (a third of the session) plus the
  stall, still under 4 s.

Then the test watches for a session timeout and a second more (an expiry, a reconnect or
a fence would land in that window): kazoo's connection never changed state, the session
and the registration's owner are the same, the broker is not fenced, the partition's
state in ZooKeeper (leader, epoch, ISR) is unchanged, and the watchdog logged the stall.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from trio_broker.cluster.zk_layout import broker_path, partition_state_path
from trio_broker.config import BrokerConfig
from trio_broker.server.broker import Broker

SESSION_MS = 4000
STALL_S = SESSION_MS / 1000 / 2
TOPIC = "stalled"


def python_stall(seconds: float) -> None:
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        pass


def gil_stall(seconds: float) -> None:
    # One C call made through ctypes.PyDLL, which keeps the GIL: libc's poll() with no
    # descriptors waits out its timeout. Unlike a CPU-bound call (``sum`` over a range,
    # as Python's ``re`` was in issue 28), its length is wall-clock time, so a busy
    # machine neither shortens nor stretches the stall.
    ctypes.PyDLL(None).poll(None, 0, int(seconds * 1000))


STALLS: dict[str, Callable[[float], None]] = {"python": python_stall, "gil": gil_stall}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", list(STALLS))
async def test_a_stall_of_half_the_session_timeout_costs_nothing(
    zookeeper: str, tmp_path: Path, kind: str
) -> None:
    config = BrokerConfig(
        host="127.0.0.1", port=0, storage="memory", data_dir=tmp_path, node_id=1,
        zookeeper_connect=zookeeper, zookeeper_session_timeout_ms=SESSION_MS,
    )  # fmt: skip
    broker = Broker(config)
    async with trio.open_nursery() as nursery:
        with trio.fail_after(60):
            await nursery.start(broker.run)
            manager: Any = broker.replication
            await manager.admin.create_topic(TOPIC, 1, 1, {}, None)
        client = manager.coord._client  # kazoo's, to watch its connection and session
        states: list[str] = []
        client.add_listener(states.append)  # called on kazoo's thread
        session = client.client_id
        state_path = partition_state_path(TOPIC, 0)

        def read_znodes() -> tuple[int, bytes]:
            _, registration = client.get(broker_path(1))
            partition, _ = client.get(state_path)
            return registration.ephemeralOwner, partition

        # The controller writes the partition's state after the topic: wait for the znode.
        with trio.fail_after(60):
            while not await trio.to_thread.run_sync(client.exists, state_path):  # noqa: ASYNC110
                await trio.sleep(0.05)
        owner, partition_state = await trio.to_thread.run_sync(read_znodes)
        assert owner == session[0]

        started = time.perf_counter()
        STALLS[kind](STALL_S)
        stalled = time.perf_counter() - started
        assert stalled >= 0.9 * STALL_S
        # An observation window, not a synchronisation: an expired session, a reconnect
        # or a fence would all have happened within a session timeout of the stall.
        await trio.sleep(SESSION_MS / 1000 + 1)

        assert states == [], f"kazoo's connection changed state: {states}"
        assert client.client_id == session
        assert await trio.to_thread.run_sync(read_znodes) == (owner, partition_state)
        assert not manager.fenced
        assert manager.leader_term(TOPIC, 0) is not None
        assert broker.loop_watchdog.max_lag >= 0.9 * STALL_S
        print(f"\n{kind}: stalled {stalled:.2f}s, session {session[0]:#x} kept")
        nursery.cancel_scope.cancel()
