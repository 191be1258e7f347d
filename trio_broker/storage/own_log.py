"""The log a node alone's coordinator keeps for itself (``__consumer_offsets-0``,
``__transaction_state-0``): compacted, never deleted by age or size.

This module never imports trio.
"""

from __future__ import annotations

from pathlib import Path

import attrs

from trio_broker.storage.log import PartitionLog
from trio_broker.storage.log_protocol import Log
from trio_broker.storage.log_types import LogConfig
from trio_broker.storage.memory import MemoryLog


def open_compacted_log(
    data_dir: Path | str | None, name: str, config: LogConfig, segment_bytes: int
) -> Log:
    """``<data_dir>/<name>``, or a ``MemoryLog`` if ``data_dir`` is None. Its records must
    outlive any retention setting: the cleaner compacts it instead (the latest record per
    key stays), in segments of at most ``segment_bytes`` (Kafka's ``*.segment.bytes``)."""
    config = attrs.evolve(
        config,
        retention_ms=None,
        retention_bytes=None,
        compact=True,
        delete=False,
        segment_bytes=min(config.segment_bytes, segment_bytes),
    )
    if data_dir is None:
        return MemoryLog(config)
    return PartitionLog.open(Path(data_dir) / name, config)
