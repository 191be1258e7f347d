"""Several log dirs (``log.dirs``, JBOD): where a partition lives, and moving it.

A partition's directory ``<topic>-<partition>`` is in exactly one of the broker's log
dirs. A new one goes to the online dir holding the fewest partitions (Kafka's rule; ties
go to the first in config order: ``log_dir_state.LogDirs.choose``, beside each dir's
health). A partition found in two dirs at start is refused, as Kafka refuses it: the
broker cannot tell which copy is current.

Moving a partition (AlterReplicaLogDirs) copies its closed log, so nothing appends
during the copy, and commits in durable renames. Each name says how far it got:

1. ``<dst>/<tp>.<id>-move``: the copy being written (fsynced file by file).
2. renamed to ``<dst>/<tp>.<id>-future``: the copy is complete and durable.
3. ``<src>/<tp>`` renamed to ``<src>/<tp>.<id>-delete``: the old copy is retired.
4. ``<dst>/<tp>.<id>-future`` renamed to ``<dst>/<tp>``: the move is done.
5. the ``-delete`` directory is removed.

:func:`recover_moves` (at start, before any log opens) finishes or undoes a move a
crash interrupted at any step: a ``-move`` directory is discarded (the source is
intact), a ``-future`` one is completed (steps 3 and 4), a ``-delete`` one removed. So
exactly one complete copy survives a kill -9 anywhere.

Plain blocking calls (the durable copy is storage/durable.py's), no trio.
"""

from __future__ import annotations

import re
import shutil
import uuid
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from trio_broker.storage.durable import (
    copy_dir_durably,
    fsync_dir,
    make_dirs_durable,
    rename_durably,
)
from trio_broker.storage.errors import StorageError

__all__ = [
    "DuplicateLogDirs",
    "find_partition_dir",
    "move_partition",
    "recover_moves",
]

_DELETED = re.compile(r".+-\d+\.[0-9a-f]{32}-delete")
_MOVE = re.compile(r"(?P<tp>.+-\d+)\.(?P<id>[0-9a-f]{32})-(?P<stage>move|future)")
#: The names of the steps :func:`move_partition` reports to its ``step`` hook.
STEPS = ("copied", "completed", "retired", "swapped", "removed")


class DuplicateLogDirs(StorageError):
    """A partition directory is in two log dirs: the broker does not start."""


def find_partition_dir(log_dirs: Sequence[Path], name: str) -> Path | None:
    """The log dir holding partition directory ``name`` (``<topic>-<p>``), if any."""
    found = [d for d in log_dirs if (d / name).is_dir()]
    if len(found) > 1:
        raise DuplicateLogDirs(
            f"partition directory {name} is in both {found[0]} and {found[1]}: delete the "
            "one that is not current (as Kafka, the broker will not guess)"
        )
    return found[0] if found else None


def move_partition(
    source: Path, destination_dir: Path, *, step: Callable[[str], None] | None = None
) -> Path:
    """Move the closed partition directory ``source`` into log dir ``destination_dir``;
    return its new path. ``step`` is called after each step (tests kill the process there).
    """
    mark = step or (lambda _name: None)
    move_id = uuid.uuid4().hex
    make_dirs_durable(destination_dir)
    copying = destination_dir / f"{source.name}.{move_id}-move"
    future = destination_dir / f"{source.name}.{move_id}-future"
    retired = source.with_name(f"{source.name}.{move_id}-delete")
    target = destination_dir / source.name
    if target.exists():  # a rename would replace an empty one: never two copies
        raise FileExistsError(f"{target} exists: {source.name} is already in {destination_dir}")
    copy_dir_durably(source, copying)
    fsync_dir(destination_dir)
    mark("copied")
    rename_durably([(copying, future)])
    mark("completed")
    rename_durably([(source, retired)])
    mark("retired")
    rename_durably([(future, target)])
    mark("swapped")
    shutil.rmtree(retired, ignore_errors=True)
    mark("removed")
    return target


def recover_moves(log_dirs: Iterable[Path]) -> None:
    """Finish or undo the moves a crash interrupted (see the module docstring)."""
    dirs = [d for d in log_dirs if d.is_dir()]
    for log_dir in dirs:
        for path in sorted(log_dir.iterdir()):
            match = _MOVE.fullmatch(path.name)
            if match is None or not path.is_dir():
                continue
            if match["stage"] == "move":
                shutil.rmtree(path, ignore_errors=True)  # incomplete: the source is intact
                continue
            # Complete: retire the old copy (if step 3 did not), then the new one takes
            # the name; each rename durable before the next.
            tp = match["tp"]
            old = [(d / tp, d / f"{tp}.{match['id']}-delete") for d in dirs if (d / tp).is_dir()]
            rename_durably(old)
            rename_durably([(path, log_dir / tp)])
    for log_dir in dirs:
        for path in log_dir.iterdir():
            if path.is_dir() and _DELETED.fullmatch(path.name):
                shutil.rmtree(path, ignore_errors=True)
