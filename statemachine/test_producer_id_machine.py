"""Producer ids never repeat: the allocator (services/producers.py) and the cluster's
id blocks (cluster/producer_id_blocks.py) under claims that interleave and restarts.

Kafka's promise (KIP-98, and KIP-730 for how a ZooKeeper-mode cluster keeps it): an id
InitProducerId hands out is never handed out again, by this broker or another, before
or after a restart. Here three clustered brokers each keep a real ``ProducerIdAllocator``
supplied as ``supply_producer_id_blocks`` supplies it: when the allocator says it needs a
block, a real ``claim_producer_id_block`` runs against a ZooKeeper stand-in whose every
call is a point where the machine may run another broker's claim first (a read, then a
conditional write that fails on a version moved meanwhile). A fourth broker runs alone,
its blocks reserved in its own file, and restarts. The machine's record is every id
handed out and every block claimed; it checks:

1. no id is handed out twice, across brokers and restarts;
2. a clustered broker hands out the ids of the blocks it claimed, in the order it
   claimed them, each once, and refuses (SnapshotError) only with every one used;
3. claimed blocks never overlap and each starts where the last claimed one ended;
4. every id a broker handed out is below its ``issued_below``;
5. the allocator asks for a block (``on_needs_block``) when fewer than half a block is
   left and none is waiting, and only then.
"""

from __future__ import annotations

import tempfile
from collections.abc import Coroutine, Generator
from pathlib import Path
from typing import Any

from hypothesis import note, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from trio_broker.cluster.coordination import BadVersion, NodeExists, Znode
from trio_broker.cluster.producer_id_blocks import claim_producer_id_block
from trio_broker.cluster.zk_layout import PRODUCER_ID_BLOCK
from trio_broker.services.producers import ProducerIdAllocator
from trio_broker.state.producer import SnapshotError

BLOCK = 4
CLUSTERED = (1, 2, 3)


class _Pause:
    def __await__(self) -> Generator[None, None, None]:
        yield None


class SteppedZooKeeper:
    """The one znode the claims use; every call first yields to the machine."""

    def __init__(self) -> None:
        self.node: Znode | None = None

    async def get(self, path: str) -> Znode | None:
        assert path == PRODUCER_ID_BLOCK
        await _Pause()
        return self.node

    async def create(self, path: str, data: bytes, *, ephemeral: bool = False) -> None:
        await _Pause()
        if self.node is not None:
            raise NodeExists(path)
        self.node = Znode(data, 0)

    async def set(self, path: str, data: bytes, version: int) -> int:
        await _Pause()
        # ZooKeeper's rule: version -1 matches any (an unconditional write).
        if self.node is None or version not in (-1, self.node.version):
            raise BadVersion(path)
        self.node = Znode(data, self.node.version + 1)
        return self.node.version


class Broker:
    def __init__(self) -> None:
        self.allocator = ProducerIdAllocator(None, block_size=BLOCK)
        self.allocator.use_cluster_blocks()
        self.asked = 0
        self.allocator.on_needs_block = self._asked
        #: The claim running now (one at a time, as the supplying task runs them).
        self.claim: Coroutine[Any, Any, tuple[int, int]] | None = None
        #: The model: the ids left of the block in use, and a claimed block waiting.
        self.current: list[int] = []
        self.spare: list[int] | None = None
        self.handed: list[int] = []

    def short(self) -> bool:
        """Under half a block left and none waiting: time to claim one."""
        return self.spare is None and len(self.current) < BLOCK // 2

    def _asked(self) -> None:
        self.asked += 1


class ProducerIdMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.zk = SteppedZooKeeper()
        self.brokers = {b: Broker() for b in CLUSTERED}
        self.claimed: list[tuple[int, int]] = []
        self.every_id: set[int] = set()
        self._dir = tempfile.TemporaryDirectory(prefix="producer-ids.")
        self.alone_path = Path(self._dir.name) / "producer_id_block.json"
        self.alone = ProducerIdAllocator(self.alone_path, block_size=BLOCK)
        self.alone_handed: list[int] = []

    def teardown(self) -> None:
        for broker in self.brokers.values():
            if broker.claim is not None:
                broker.claim.close()
        self._dir.cleanup()

    def _hand_out(self, pid: int) -> None:
        assert pid not in self.every_id, f"producer id {pid} handed out twice"
        self.every_id.add(pid)

    # -- clustered brokers
    @rule(b=st.sampled_from(CLUSTERED))
    def claim_starts(self, b: int) -> None:
        broker = self.brokers[b]
        if broker.claim is not None or not broker.allocator.needs_block:
            return  # the supplying task claims only when asked, one claim at a time
        broker.claim = claim_producer_id_block(self.zk, b, broker.allocator.block_size)  # type: ignore[arg-type]
        self.claim_steps(b)

    @rule(b=st.sampled_from(CLUSTERED))
    def claim_steps(self, b: int) -> None:
        """The claim runs to its next ZooKeeper call (another broker's may come first)."""
        broker = self.brokers[b]
        if broker.claim is None:
            return
        try:
            broker.claim.send(None)
        except StopIteration as done:
            start, end = done.value
            broker.claim = None
            note(f"broker {b} claimed [{start}, {end})")
            expected_start = self.claimed[-1][1] if self.claimed else 0
            assert (start, end) == (expected_start, expected_start + BLOCK), (
                f"broker {b} claimed [{start}, {end}): a block is {BLOCK} ids from where the "
                f"last claimed one ended, {expected_start}"
            )
            self.claimed.append((start, end))
            broker.allocator.offer_block(start, end)
            if broker.current:
                broker.spare = list(range(start, end))
            else:
                broker.current = list(range(start, end))

    @rule(b=st.sampled_from(CLUSTERED))
    def allocate(self, b: int) -> None:
        broker = self.brokers[b]
        asked_before = broker.asked
        try:
            pid = broker.allocator.allocate()
        except SnapshotError:
            note(f"broker {b}: no id")
            assert not broker.current and broker.spare is None, "refused with claimed ids unused"
            return
        note(f"broker {b} -> {pid}")
        if not broker.current and broker.spare is not None:
            broker.current, broker.spare = broker.spare, None
        assert broker.current and pid == broker.current.pop(0)
        broker.handed.append(pid)
        self._hand_out(pid)
        assert broker.asked - asked_before == int(broker.short())

    @precondition(lambda self: any(b.current for b in self.brokers.values()))
    @rule(b=st.sampled_from(CLUSTERED))
    def block_lands_with_ids_left(self, b: int) -> None:
        """A claim ends while the block in use still has an id (it was asked for below
        half a block): that id comes first, then the new block's. The random rules
        seldom end a claim just there."""
        broker = self.brokers[b]
        while len(broker.current) > 1:
            self.allocate(b)
        if len(broker.current) != 1:
            return
        self.claim_starts(b)
        while broker.claim is not None:
            self.claim_steps(b)
        self.allocate(b)

    @rule(b=st.sampled_from(CLUSTERED))
    def broker_restarts(self, b: int) -> None:
        """A fresh process: the blocks it held are lost (ZooKeeper has moved past them)."""
        old = self.brokers[b]
        if old.claim is not None:
            old.claim.close()
        self.brokers[b] = Broker()

    # -- a broker alone, its blocks in a file
    @rule(n=st.integers(1, 6))
    def alone_allocates(self, n: int) -> None:
        for _ in range(n):
            pid = self.alone.allocate()
            assert not self.alone_handed or pid > self.alone_handed[-1]
            self.alone_handed.append(pid)
            assert pid < self.alone.issued_below

    @rule()
    def alone_restarts(self) -> None:
        self.alone = ProducerIdAllocator(self.alone_path, block_size=BLOCK)

    # -- invariants
    @invariant()
    def ids_within_what_each_issued(self) -> None:
        for broker in self.brokers.values():
            if broker.handed:
                assert max(broker.handed) < broker.allocator.issued_below
        assert len(set(self.alone_handed)) == len(self.alone_handed)

    @invariant()
    def asks_exactly_when_short(self) -> None:
        for broker in self.brokers.values():
            assert broker.allocator.needs_block == broker.short()


TestProducerIds = ProducerIdMachine.TestCase
# No explain phase, as every profile (conftest.py): on Python 3.11 it re-ran this
# machine's catch of a planted block one id too long (found and shrunk in 1.6 CPU s)
# under sys.settrace past pytest's 300 s guard, hiding the catch.
TestProducerIds.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
