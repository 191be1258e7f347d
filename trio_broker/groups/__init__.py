"""Consumer groups: the coordinator (Trio) and the durable offsets store.

The group protocol itself is the pure machine in :mod:`trio_broker.state.group`.
"""

from trio_broker.groups.coordinator import GroupCoordinator, StableGeneration, Waiter
from trio_broker.groups.offsets_store import OffsetAndMetadata, OffsetKey, OffsetsStore

__all__ = [
    "GroupCoordinator",
    "OffsetAndMetadata",
    "OffsetKey",
    "OffsetsStore",
    "StableGeneration",
    "Waiter",
]
