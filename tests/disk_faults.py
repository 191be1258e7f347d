"""Disk faults injected into an in-process broker's group commit (no FUSE needed).

``fail_fsyncs_in`` makes every fsync of a log in one log dir fail with EIO while a
flag is up: the dir goes offline alone (storage/log_dir_state.py); with the flag down,
the flusher's probe brings it back. Used by the single-broker JBOD tests and the
cluster's failover of a failed dir.
"""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any

from trio_broker.server.broker import Broker
from trio_broker.server.flusher import flush_log


def fail_fsyncs_in(broker: Broker, log_dir: Path, failing: list[bool]) -> None:
    """Every fsync of a log in ``log_dir`` fails with EIO while ``failing[0]``."""

    def sync(log: Any) -> int:
        if failing[0] and Path(log.directory).parent == log_dir:
            raise OSError(errno.EIO, "injected EIO")
        return flush_log(log)

    broker.flusher.sync = sync
