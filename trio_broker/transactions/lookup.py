"""The broker's transaction coordinator as the handlers see it: either kind.

A single broker has one table (``coordinator.py``), a cluster broker a table per led
``__transaction_state`` partition (``partitioned.py``, built on the first). Naming the
pair needs both modules, so it lives here, above them: ``coordinator.py`` does not
know the partitioned one exists.
"""

from __future__ import annotations

from typing import Any

from trio_broker.transactions.coordinator import TransactionCoordinator
from trio_broker.transactions.partitioned import PartitionedTransactionCoordinator

__all__ = ["AnyCoordinator", "coordinator_of"]

#: One broker's table, or a cluster broker's tables by partition.
AnyCoordinator = TransactionCoordinator | PartitionedTransactionCoordinator


def coordinator_of(services: Any) -> AnyCoordinator | None:
    """The broker's coordinator (``Services.transactions``): the one table of a single
    broker, the per-partition tables in a cluster, or None."""
    coordinator = getattr(services, "transactions", None)
    if isinstance(coordinator, (TransactionCoordinator, PartitionedTransactionCoordinator)):
        return coordinator
    return None
