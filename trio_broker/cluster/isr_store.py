"""A leader's ISR change, written to the partition's state znode.

A term proposes an ISR change (a follower caught up, or fell behind for longer than
replica.lag.time.max.ms); the leader writes it to ``/brokers/topics/T/partitions/P/state``
conditionally on the znode's version, and only while the znode still names it leader in
the term's epoch. A refused write (the controller or another leader moved first) drops
the proposal, and the next view change brings the truth (``LeaderPartition.isr_refused``).
"""

from __future__ import annotations

import logging

from trio_broker.cluster.coordination import BadVersion, Coordination, CoordinationError, NoNode
from trio_broker.cluster.zk_layout import PartitionState, partition_state_path
from trio_broker.replication.leader import IsrProposal, LeaderPartition

__all__ = ["store_isr"]

log = logging.getLogger(__name__)


async def store_isr(
    coord: Coordination,
    broker_id: int,
    topic: str,
    partition: int,
    term: LeaderPartition,
    proposal: IsrProposal,
) -> bool:
    """Write ``proposal`` for ``term`` (this broker's, as ``broker_id``) and tell the term
    how it went; True if the stored ISR moved the term's high watermark."""
    path = partition_state_path(topic, partition)
    try:
        node = await coord.get(path)
        if node is None:
            raise NoNode(path)
        current = PartitionState.decode(node.data, path)
        if current.leader != broker_id or current.leader_epoch != term.leader_epoch:
            raise BadVersion(path)
        state = PartitionState(current.leader, current.leader_epoch, tuple(sorted(proposal.isr)),
                               current.controller_epoch)  # fmt: skip
        await coord.set(path, state.encode(), node.version)
    except (CoordinationError, ValueError) as exc:
        log.info("%s: ISR change %s not stored (%s)", path, sorted(proposal.isr), exc)
        if term.pending == proposal:
            term.isr_refused()
        return False
    moved = False
    if term.pending == proposal:
        moved = term.isr_stored(proposal)
        log.info("%s: ISR now %s", path, sorted(proposal.isr))
    return moved
