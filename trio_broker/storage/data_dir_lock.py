"""One broker process per data directory.

Two brokers appending to (and recovering) the same segment files would corrupt them:
the second's recovery truncates what it takes for a torn tail while the first is still
writing. As Kafka does with the ``.lock`` file of each log dir, a broker takes an
exclusive lock on ``<data_dir>/.lock`` before it opens any log, and gives up with a
clear error when another process holds it. The lock is a POSIX record lock
(``fcntl.lockf``): the kernel drops it when its holder exits, ``kill -9`` included, so
a restart never finds a stale one. Within one process it does not conflict (tests run
several brokers, one after another, on one directory).
"""

from __future__ import annotations

import fcntl
from pathlib import Path
from typing import BinaryIO

__all__ = ["LOCK_FILE", "DataDirInUse", "lock_data_dir"]

LOCK_FILE = ".lock"


class DataDirInUse(OSError):
    """Another process holds the data directory's lock."""


def lock_data_dir(data_dir: Path, holder: str = "broker process") -> BinaryIO:
    """Lock ``data_dir`` for this process; close the returned file to release it.
    ``holder``: what the error calls the process that has it (``cluster up`` locks its
    own data dir too, over its ZooKeeper's and brokers' dirs)."""
    path = data_dir / LOCK_FILE
    handle = open(path, "a+b")  # noqa: SIM115 - held open for the broker's lifetime
    try:
        fcntl.lockf(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.close()
        raise DataDirInUse(
            f"data dir {data_dir} is in use by another {holder} (it holds {path}); "
            f"stop that {holder}, or give this one its own --data-dir"
        ) from None
    return handle
