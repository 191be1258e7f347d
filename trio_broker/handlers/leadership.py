"""Who may answer for a partition in a cluster: its leader, in the epoch the client knows.

A broker that runs alone leads everything (``services.replication`` is None, and every
check here passes). In a cluster, Produce, Fetch and ListOffsets for a partition are for
its leader only: others answer NOT_LEADER_OR_FOLLOWER (or LEADER_NOT_AVAILABLE while it
has none), and a client that names a leader epoch (KIP-320) learns whether it is behind
(FENCED_LEADER_EPOCH) or ahead (UNKNOWN_LEADER_EPOCH) of the leader's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trio_broker.handlers.base import RequestContext
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.replication.controller_rules import NO_LEADER

if TYPE_CHECKING:
    from trio_broker.replication.leader import LeaderPartition

__all__ = ["check_leader"]


def check_leader(
    ctx: RequestContext, topic: str, partition: int, current_leader_epoch: int = -1
) -> tuple[ErrorCode, LeaderPartition | None]:
    """(NONE, this broker's term) if it may answer; else the error (and None)."""
    replication = ctx.services.replication
    if replication is None:
        return ErrorCode.NONE, None
    term = replication.leader_term(topic, partition)
    if term is None:
        info = replication.partition(topic, partition)
        if info is None or info.leader == NO_LEADER:
            return ErrorCode.LEADER_NOT_AVAILABLE, None
        return ErrorCode.NOT_LEADER_OR_FOLLOWER, None
    if current_leader_epoch >= 0:
        if current_leader_epoch < term.leader_epoch:
            return ErrorCode.FENCED_LEADER_EPOCH, None
        if current_leader_epoch > term.leader_epoch:
            return ErrorCode.UNKNOWN_LEADER_EPOCH, None
    return ErrorCode.NONE, term
