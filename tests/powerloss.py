"""An independent recorder of what fsyncs made durable, and the tree a power cut leaves.

The rule is LazyFS's (and POSIX's, strictly read): after a power cut a file holds
only the data it had at its last ``fsync``/``fdatasync``, and a directory lists
only the entries it had at its own last ``fsync``. A created, renamed or removed
entry is therefore durable only once its parent directory was fsynced afterwards.

:class:`PowerCut` wraps ``os.fsync`` and ``os.fdatasync`` and, at each call, reads
back from the real file system what that call made durable (the file's bytes, or
the directory's listing). It also notices inode creation (``os.open``/``open``
with a new name, ``os.mkdir``) so that a reused inode number is not mistaken for
the old file. It knows nothing of the broker's helpers or bookkeeping: what
survives is computed from the calls alone. A cut is simulated by building, in a
fresh directory, the tree that would be left; the code under test is then run
again on that tree, as a restarted broker would.

Used by ``tests/unit/storage/test_durable_writes.py`` (every file the broker reads back)
and ``statemachine/test_storage_machine.py`` (the partition log under random
operations and cuts).
"""

from __future__ import annotations

import builtins
import io
import itertools
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

# The real calls, taken at import, before any test patches them: the recorder
# reads through these.
_open, _fsync, _fdatasync, _mkdir = os.open, os.fsync, os.fdatasync, os.mkdir
_stat, _fstat, _listdir = os.stat, os.fstat, os.listdir
_io_open = io.open

#: (inode number, incarnation): an inode number reused by a new file gets a new key.
Key = tuple[int, int]


class Patcher(Protocol):
    """What the recorder needs of ``pytest.MonkeyPatch``: undoable attribute changes."""

    def setattr(self, target: Any, name: str, value: Any) -> None: ...


class PowerCut:
    """Records what fsyncs made durable under ``root`` and builds the post-cut tree.

    ``real_syncs=False`` records the calls without making them: for simulations
    whose only notion of durability is this recorder's (it saves real disk flushes).
    """

    def __init__(self, root: Path, monkeypatch: Patcher, *, real_syncs: bool = True) -> None:
        self._incarnations = itertools.count(1)
        self._generation: dict[int, int] = {}
        self._cuts = itertools.count()
        self._stem = root.name
        self._rebase(root)
        for name, real in (("open", _open), ("mkdir", _mkdir)):
            monkeypatch.setattr(os, name, getattr(self, f"_hook_{name}")(real))
        fsync, fdatasync = (_fsync, _fdatasync) if real_syncs else (_check_fd, _check_fd)
        monkeypatch.setattr(os, "fsync", self._hook_sync(fsync))
        monkeypatch.setattr(os, "fdatasync", self._hook_sync(fdatasync))
        monkeypatch.setattr(io, "open", self._hook_io_open(_io_open))
        monkeypatch.setattr(builtins, "open", self._hook_io_open(_io_open))

    # -- what is durable
    def _rebase(self, root: Path) -> None:
        """Everything now under ``root`` counts as durable (the state before the test)."""
        _mkdir_p(root)
        self.root = root
        self.device = _stat(root).st_dev
        self.root_key = self._key(_stat(root))
        self._base_data: dict[Key, bytes] = {}
        self._base_listing: dict[Key, dict[str, tuple[Key, bool]]] = {}
        #: ("file" | "dir", key, bytes | listing), one per fsync/fdatasync, in order.
        self.events: list[tuple[str, Key, Any]] = []
        for directory, _dirs, files in os.walk(root):
            self._base_listing[self._key(_stat(directory))] = self._listing(directory)
            for name in files:
                path = os.path.join(directory, name)
                with _io_open(path, "rb") as f:
                    self._base_data[self._key(_stat(path))] = f.read()

    def _key(self, st: os.stat_result) -> Key:
        return st.st_ino, self._generation.get(st.st_ino, 0)

    def _listing(self, directory: str) -> dict[str, tuple[Key, bool]]:
        entries = {}
        for name in _listdir(directory):
            st = _stat(os.path.join(directory, name), follow_symlinks=False)
            entries[name] = (self._key(st), stat.S_ISDIR(st.st_mode))
        return entries

    def _born(self, st: os.stat_result) -> None:
        if st.st_dev == self.device:
            self._generation[st.st_ino] = next(self._incarnations)

    def _synced(self, fd: int) -> None:
        st = _fstat(fd)
        proc = f"/proc/self/fd/{fd}"
        if st.st_dev != self.device or not _is_under(os.readlink(proc), self.root):
            return  # e.g. a tree an earlier cut left, being run on by a test
        if stat.S_ISDIR(st.st_mode):
            self.events.append(("dir", self._key(st), self._listing(proc)))
        else:
            with _io_open(proc, "rb") as f:
                self.events.append(("file", self._key(st), f.read()))

    # -- hooks
    def _hook_sync(self, real: Callable[[Any], None]) -> Callable[[Any], None]:
        def sync(fd: Any) -> None:
            real(fd)
            self._synced(fd if isinstance(fd, int) else fd.fileno())

        return sync

    def _hook_open(self, real: Callable[..., int]) -> Callable[..., int]:
        def open_(path: Any, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
            existed = not flags & os.O_CREAT or _exists(path, dir_fd)
            fd = real(path, flags, mode, dir_fd=dir_fd)
            if not existed:
                self._born(_fstat(fd))
            return fd

        return open_

    def _hook_mkdir(self, real: Callable[..., None]) -> Callable[..., None]:
        def mkdir(path: Any, mode: int = 0o777, *, dir_fd: int | None = None) -> None:
            real(path, mode, dir_fd=dir_fd)
            self._born(_stat(path, dir_fd=dir_fd))

        return mkdir

    def _hook_io_open(self, real: Callable[..., Any]) -> Callable[..., Any]:
        def open_(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
            named = isinstance(file, (str, bytes, os.PathLike))
            existed = not named or not set(mode) & set("wxa+") or _exists(file, None)
            f = real(file, mode, *args, **kwargs)
            if not existed:
                self._born(_fstat(f.fileno()))
            return f

        return open_

    # -- the cut
    def survivors(self, upto: int | None = None) -> dict[str, bytes | None]:
        """Relative path -> bytes (None for a directory) left by a cut after ``upto`` syncs."""
        data = dict(self._base_data)
        listing = dict(self._base_listing)
        for kind, key, value in self.events[:upto]:
            (listing if kind == "dir" else data)[key] = value
        tree: dict[str, bytes | None] = {}

        def walk(key: Key, prefix: str) -> None:
            for name, (child, is_dir) in sorted(listing.get(key, {}).items()):
                path = prefix + name
                if is_dir:
                    tree[path] = None
                    walk(child, path + "/")
                else:
                    tree[path] = data.get(child, b"")

        walk(self.root_key, "")
        return tree

    def materialize(self, upto: int | None = None) -> Path:
        """Write, next to ``root``, the tree a cut after ``upto`` syncs (None: all) leaves."""
        tree = self.survivors(upto)
        target = self.root.with_name(f"{self._stem}-cut{next(self._cuts)}")
        _mkdir_p(target)
        for rel, content in tree.items():  # in walk order: a directory before its entries
            path = target / rel
            if content is None:
                _mkdir(path)
            else:
                with _io_open(path, "wb") as f:
                    f.write(content)
        return target

    def continue_on(self, target: Path) -> None:
        """Record under ``target`` from now on, counting all it holds as durable.

        For a tree from :meth:`materialize` (perhaps edited since): the disk the
        restarted broker finds.
        """
        self._rebase(target)

    def settle(self) -> None:
        """Count everything now under ``root`` as durable (set-up done before the test proper)."""
        self._rebase(self.root)

    def snapshot(self) -> Path:
        """The tree a cut now would leave, while the live process goes on under ``root``."""
        return self.materialize(None)

    def power_cut(self, upto: int | None = None) -> Path:
        """The tree a cut now (or after ``upto`` syncs) leaves; recording goes on there."""
        target = self.materialize(upto)
        self._rebase(target)
        return target

    def every_cut(self, start: int = 0) -> Iterator[Path]:
        """The tree left by a cut after each sync so far, from the ``start``-th one."""
        for upto in range(start, len(self.events) + 1):
            yield self.materialize(upto)


def _check_fd(fd: Any) -> None:
    """Stands in for a real sync: fails as it would on a bad descriptor, flushes nothing."""
    _fstat(fd if isinstance(fd, int) else fd.fileno())


def _is_under(path: str, root: Path) -> bool:
    return path == str(root) or path.startswith(f"{root}/")


def _exists(path: Any, dir_fd: int | None) -> bool:
    try:
        _stat(path, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def _mkdir_p(path: Path) -> None:
    if not path.is_dir():
        _mkdir_p(path.parent)
        _mkdir(path)
