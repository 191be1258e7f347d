"""Crash-safe files and directories: the one place the broker makes them durable.

The rule (POSIX read strictly, and what LazyFS enforces): after a power cut a
file holds only the data it had at its last ``fsync``/``fdatasync``, and a
directory holds only the entries it had at its own last ``fsync``. A created,
renamed or removed name is therefore durable only once its *parent directory*
has been fsynced afterwards. Everything the broker reads back after a restart
(``meta.properties``, the catalogue, ACLs, credentials, quotas, producer-id
blocks and snapshots, checkpoints, the clean-shutdown marker) is written with
:func:`write_file_atomically`, and every directory it creates is made with
:func:`make_dirs_durable`. Partition logs sync their own segment files
(``PartitionLog.flush``) and use :func:`fsync_dir` for the directory.

Plain blocking ``os`` calls, no trio: run them in a worker thread where the
event loop must not block.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from collections.abc import Iterable
from pathlib import Path

#: Suffix of the temporary file of an atomic write. The partition log loader
#: deletes leftovers with it (a write that crashed before its rename).
TMP_SUFFIX = ".tmp"


def fsync_dir(directory: Path | str) -> None:
    """Make the creations, renames and removals of names in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        if n <= 0:  # pragma: no cover - regular files report errors by raising
            raise OSError(errno.EIO, "short write")
        view = view[n:]


def write_file_atomically(path: Path, data: bytes, *, mode: int = 0o644) -> None:
    """Replace ``path`` so that a crash leaves either the old or the new content, durably.

    Temp file in the same directory, fsync, rename over ``path``, fsync of the
    directory: without the file fsync a crash can leave the new name pointing at
    empty data; without the directory fsync the rename itself may be lost. The
    directory must exist (see :func:`make_dirs_durable`). ``mode`` is the new
    file's permission bits (less the umask).
    """
    path = Path(path)
    tmp = path.with_name(path.name + TMP_SUFFIX)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, mode)
    try:
        try:
            # A leftover temp file keeps its old mode through O_TRUNC: never wider than asked.
            current = os.fstat(fd).st_mode & 0o777
            if current & ~mode:
                os.fchmod(fd, current & mode)
            write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def publish_file(tmp: Path, path: Path) -> None:
    """Make ``tmp`` (written by someone else, e.g. a library) durable as ``path``.

    The same steps as :func:`write_file_atomically` after the write: fsync the
    file, rename it over ``path`` (same directory), fsync the directory.
    """
    fd = os.open(tmp, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    rename_durably([(Path(tmp), Path(path))])


def rename_durably(moves: Iterable[tuple[Path, Path]]) -> None:
    """``os.replace`` each (source, target), then fsync every directory involved once.

    The renames are durable when this returns; a crash before that leaves each
    one done or not (never half of one).
    """
    directories: dict[Path, None] = {}
    for source, target in moves:
        os.replace(source, target)
        directories[Path(source).parent] = None
        directories[Path(target).parent] = None
    for directory in directories:
        fsync_dir(directory)


def make_dirs_durable(path: Path, *, sync_existing: bool = False) -> bool:
    """Create ``path`` and any missing parents so that they survive a power cut.

    Each missing level is created and then its parent is fsynced, top down, so
    no level is durable without the ones above it. Returns whether anything was
    created. With ``sync_existing`` the parent of an already existing ``path`` is
    fsynced too: for the data directory, whose entry an earlier run may have
    created without making it durable (a process crash between the two steps).
    """
    path = Path(path)
    missing: list[Path] = []
    level = path
    while not level.is_dir():
        missing.append(level)
        if level.parent == level:
            break
        level = level.parent
    for level in reversed(missing):
        try:
            os.mkdir(level)
        except FileExistsError:
            if not level.is_dir():
                raise
            # Made meanwhile by someone else, maybe not durably: sync it all the same.
        fsync_dir(level.parent)
    if not missing and sync_existing:
        fsync_dir(path.parent)
    return bool(missing)


def copy_dir_durably(source: Path, target: Path) -> None:
    """Copy directory ``source`` to a new ``target``, every file and directory in it
    fsynced (moving a partition between log dirs). ``target``'s own entry in its parent
    is durable only once the caller fsyncs the parent."""
    os.mkdir(target)
    for entry in sorted(source.iterdir()):
        if entry.is_dir():
            copy_dir_durably(entry, target / entry.name)
            continue
        shutil.copyfile(entry, target / entry.name)
        fd = os.open(target / entry.name, os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    fsync_dir(target)
