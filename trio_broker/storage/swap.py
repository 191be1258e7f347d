"""The log cleaner's on-disk protocol: file names, the checkpoint, and half-done swaps.

A cleaning pass rewrites a group of closed segments ``[B, E)`` into one new segment
named ``B`` (storage/cleaner.py). The steps, and what a crash after each leaves:

1. the new data is written to ``<B>.log.cleaned`` and fsynced. A crash: recovery
   deletes the ``.cleaned`` file; the old segments are untouched.
2. ``cleaner-offset.checkpoint`` is raised to at least ``E`` (atomic write). It says
   "segments below this offset may have offset holes" (and where the next pass's
   dirty section starts); raising it early only allows holes, it vouches for no data.
3. ``<B>.log.cleaned`` is renamed to ``<B>.<E>.swap`` and the directory fsynced: the
   commit point. From here recovery finishes the swap: it deletes every segment file
   with a base offset in ``[B, E)`` and renames the swap file to ``<B>.log`` (its
   indexes are then rebuilt by a scan).
4. the old segments' files are unlinked (open descriptors keep serving reads), the
   swap file is renamed to ``<B>.log``, its indexes are written and fsynced, and the
   directory is fsynced.

So a reader of the directory never sees a torn segment: a ``.cleaned`` file is never
read, and a ``.swap`` file is whole (fsynced before it got that name).

This module never imports trio; it blocks only in plain ``os`` calls.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from trio_broker.storage.durable import rename_durably, write_file_atomically
from trio_broker.storage.segment import INDEX_SUFFIX, LOG_SUFFIX, TIMEINDEX_SUFFIX, segment_name

#: The first offset not yet cleaned; offset holes are legal below it (see above).
CLEANER_CHECKPOINT = "cleaner-offset.checkpoint"
CLEANED_SUFFIX = ".cleaned"
SWAP_SUFFIX = ".swap"


def cleaned_name(base_offset: int) -> str:
    return segment_name(base_offset) + LOG_SUFFIX + CLEANED_SUFFIX


def swap_name(base_offset: int, end_offset: int) -> str:
    return f"{segment_name(base_offset)}.{segment_name(end_offset)}{SWAP_SUFFIX}"


def parse_swap_name(name: str) -> tuple[int, int] | None:
    """(B, E) of a ``<B>.<E>.swap`` file name, else None."""
    parts = name.split(".")
    if (
        len(parts) == 3
        and "." + parts[2] == SWAP_SUFFIX
        and all(len(p) == 20 and p.isdigit() for p in parts[:2])
    ):
        return int(parts[0]), int(parts[1])
    return None


def read_cleaner_checkpoint(directory: Path) -> int:
    """The first dirty offset (0 when the log was never cleaned or the file is damaged)."""
    try:
        value = int((directory / CLEANER_CHECKPOINT).read_bytes().decode("ascii").strip())
    except (FileNotFoundError, ValueError):  # UnicodeDecodeError is a ValueError
        return 0
    return max(value, 0)


def write_cleaner_checkpoint(directory: Path, offset: int) -> None:
    write_file_atomically(directory / CLEANER_CHECKPOINT, b"%d\n" % offset)


#: A follower's log holds the holes of its leader's cleaned sections: below this offset
#: a fetched batch may start after the previous one ended (PartitionLog.append_replicated
#: raises it before writing a batch that leaves a hole).
REPLICA_GAPS_CHECKPOINT = "replica-gaps.checkpoint"


def read_replica_gaps_checkpoint(directory: Path) -> int:
    try:
        value = int((directory / REPLICA_GAPS_CHECKPOINT).read_bytes().decode("ascii").strip())
    except (FileNotFoundError, ValueError):
        return 0
    return max(value, 0)


def write_replica_gaps_checkpoint(directory: Path, offset: int) -> None:
    write_file_atomically(directory / REPLICA_GAPS_CHECKPOINT, b"%d\n" % offset)


def read_gaps_below(directory: Path) -> int:
    """Below this offset offset holes are legal in the log: the cleaner's own (its
    checkpoint) and a follower's copies of its leader's (the replica gaps checkpoint)."""
    return max(read_cleaner_checkpoint(directory), read_replica_gaps_checkpoint(directory))


def unlink_segment_files(directory: Path, base_offset: int) -> None:
    stem = segment_name(base_offset)
    for suffix in (LOG_SUFFIX, INDEX_SUFFIX, TIMEINDEX_SUFFIX):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(directory / (stem + suffix))


def finish_interrupted_swaps(directory: Path, names: set[str]) -> bool:
    """Recovery of step 1-4 above: drop ``.cleaned`` files, complete ``.swap`` files.

    Returns whether anything changed (the caller fsyncs the directory). ``names`` is
    the directory listing; it is updated to what is left.
    """
    changed = False
    for name in sorted(names):
        if name.endswith(CLEANED_SUFFIX):
            os.unlink(directory / name)
            names.discard(name)
            changed = True
    for name in sorted(names):
        bounds = parse_swap_name(name)
        if bounds is None:
            continue
        first, end = bounds
        for other in sorted(names):
            stem, _, suffix = other.partition(".")
            if (
                "." + suffix in (LOG_SUFFIX, INDEX_SUFFIX, TIMEINDEX_SUFFIX)
                and len(stem) == 20
                and stem.isdigit()
                and first <= int(stem) < end
            ):
                os.unlink(directory / other)
                names.discard(other)
        rename_durably([(directory / name, directory / (segment_name(first) + LOG_SUFFIX))])
        names.discard(name)
        names.add(segment_name(first) + LOG_SUFFIX)
        changed = True
    return changed
