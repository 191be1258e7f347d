"""The FUSE daemon: a pass-through filesystem over a backing directory that also keeps track
of what a power cut would leave behind.

The model
---------
Every file, directory and symlink is a ``Node``. Directories hold two maps name -> node id:
``live`` (what processes see, mirrored exactly by the backing directory) and ``durable`` (the
entries as they were at the directory's last fsync). A node's ``durable_refs`` counts the
durable maps that name it.

A regular file's data lives in one place only: its backing file (the "live" bytes). Its durable
content is described relative to that:

* ``dsize``: the size at the last fsync/fdatasync;
* ``saved``/``pieces``: for every byte below ``dsize`` that has been overwritten or truncated
  away since that fsync, its durable value (copied aside just before it was changed);
* ``written``: the ranges written (or zero-extended) since that fsync.

Every byte below ``dsize`` that is not in ``saved`` is still its durable value in the live
file, and everything from ``dsize`` to the live size is in ``written``. So appending and
fsyncing cost nothing beyond the write itself (no copies), and an fsync is O(1).

When the last live name of a file goes while a durable entry still names it (an unlink or
rename-over that no directory fsync has made durable yet), the backing file is hard-linked
into the state directory first (copied if that is another filesystem), so the power cut can
bring it back.

A power cut (``Daemon._cut``, then ``FaultOps.rebuild`` in the main thread) freezes the
filesystem (every operation fails with EIO), pulls the mount (umount2 MNT_FORCE aborts the FUSE
connection at once; without root, a lazy unmount and, if the mount stays busy, fusectl's
abort), waits for the FUSE session to end, then rebuilds the backing directory from the durable
namespace: the backing file of every durable file moves into a hold directory inside the
backing directory (same filesystem: a rename), its un-synced bytes are rolled back in place
per the mode (restore the saved pieces, truncate to the durable size; tear keeps the un-synced
bytes below a random cut point; garble overwrites them with random bytes), everything else is
wiped, and the durable tree is put back (directories, files renamed into place, hard links,
symlinks). The result is rescanned as the new, fully durable state and mounted again, so the
kernel caches nothing from before. Cost: proportional to the un-synced bytes and the number of
entries, not to the data size.
"""

from __future__ import annotations

import contextlib
import errno
import faulthandler
import json
import logging
import os
import random
import shutil
import socket
import stat
import sys
import threading
import time
import traceback
from collections.abc import Callable
from ctypes.util import find_library
from pathlib import Path
from typing import Any

from ._common import (
    FSNAME_PREFIX,
    INFO_FILE,
    MODES,
    FaultFSError,
    abort_connection,
    force_unmount,
    lazy_unmount,
    mount_entry,
    resolve_mountpoint,
    socket_name,
)
from ._intervals import IntervalSet
from .report import CutReport, FileCut

# mfusepy picks libfuse2 when both are installed; this filesystem wants libfuse3 (fsyncdir and
# rename flags reach the daemon unchanged, hard_remove is a config field).
if "FUSE_LIBRARY_PATH" not in os.environ and (_fuse3 := find_library("fuse3")):
    os.environ["FUSE_LIBRARY_PATH"] = _fuse3
import mfusepy

log = logging.getLogger("tests.faultfs")

RENAME_NOREPLACE = 1
FALLOC_FL_KEEP_SIZE = 1
RENAME_EXCHANGE = 2
UTIME_NOW = (1 << 30) - 1
UTIME_OMIT = (1 << 30) - 2
SECTOR = 512
COPY_CHUNK = 1 << 24
HOLD_PREFIX = ".faultfs-hold-"
# Open flags the backing file must not get: the daemon decides offsets (O_APPEND: the kernel
# passes the end of file as the offset), truncation and creation itself, and durability is
# simulated (an O_SYNC write reaches the daemon as a write and an fsync).
_STRIP_FLAGS = (
    os.O_APPEND
    | os.O_TRUNC
    | os.O_CREAT
    | os.O_EXCL
    | os.O_ACCMODE
    | getattr(os, "O_DIRECT", 0)
    | os.O_SYNC
    | os.O_DSYNC
)


_KIND_MODE = {"f": stat.S_IFREG, "d": stat.S_IFDIR, "l": stat.S_IFLNK}


def _err(code: int) -> mfusepy.FuseOSError:
    return mfusepy.FuseOSError(code)


def _check_chance(value: float) -> float:
    if not 0.0 <= value <= 1.0:
        raise FaultFSError(f"dir_survival must be between 0 and 1, not {value}")
    return value


class Node:
    __slots__ = (
        "dsize",
        "durable",
        "durable_refs",
        "handles",
        "kind",
        "live",
        "live_links",
        "mode",
        "nid",
        "pieces",
        "saved",
        "size",
        "target",
        "unlinked_copy",
        "written",
    )

    def __init__(self, nid: int, kind: str) -> None:
        self.nid = nid
        self.kind = kind  # "f" regular file, "d" directory, "l" symlink
        self.live_links = 0
        self.durable_refs = 0
        self.handles: list[Handle] = []
        # directories
        self.live: dict[str, int] = {}
        self.durable: dict[str, int] = {}
        self.mode = 0o755
        # symlinks
        self.target = ""
        # regular files
        self.size = 0
        self.dsize = 0
        self.saved = IntervalSet()
        self.pieces: list[tuple[int, bytes]] = []
        self.written = IntervalSet()
        self.unlinked_copy: str | None = None  # the live bytes, once no live name is left


class Handle:
    __slots__ = ("fd", "fh", "node")

    def __init__(self, fh: int, node: Node, fd: int) -> None:
        self.fh = fh
        self.node = node
        self.fd = fd  # -1 for a directory handle


def _stat_dict(st: os.stat_result) -> dict[str, Any]:
    return {
        "st_mode": st.st_mode,
        "st_ino": st.st_ino,
        "st_nlink": st.st_nlink,
        "st_uid": st.st_uid,
        "st_gid": st.st_gid,
        "st_size": st.st_size,
        "st_blocks": st.st_blocks,
        "st_blksize": st.st_blksize,
        "st_atime": st.st_atime_ns,
        "st_mtime": st.st_mtime_ns,
        "st_ctime": st.st_ctime_ns,
    }


def _copy_fd(src: int, dst: int, length: int) -> None:
    """Copy ``length`` bytes from offset 0 of ``src`` to offset 0 of ``dst``."""
    pos = 0
    while pos < length:
        n = min(COPY_CHUNK, length - pos)
        try:
            done = os.copy_file_range(src, dst, n, pos, pos)
        except OSError:
            data = os.pread(src, n, pos)
            done = os.pwrite(dst, data, pos) if data else 0
        if done <= 0:
            break
        pos += done


def _copy_file(src_path: str, dst_path: str) -> None:
    src = os.open(src_path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        _copy_from_fd(src, dst_path)
    finally:
        os.close(src)


def _copy_from_fd(src: int, dst_path: str) -> None:
    st = os.fstat(src)
    dst = os.open(dst_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        _copy_fd(src, dst, st.st_size)
        os.ftruncate(dst, st.st_size)
        os.fchmod(dst, stat.S_IMODE(st.st_mode))
        with contextlib.suppress(OSError):
            os.fchown(dst, st.st_uid, st.st_gid)
    finally:
        os.close(dst)


def _pwrite_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view = view[n:]
        offset += n


class FaultOps(mfusepy.Operations):
    """The FUSE operations and the durability model. Every operation runs under one lock."""

    use_ns = True

    def __init__(self, backing: str, state: str, on_init: Any = None) -> None:
        self.backing = os.path.realpath(backing)
        self.state = os.path.realpath(state)
        self.nodes_dir = os.path.join(self.state, "nodes")
        self.mutex = threading.Lock()
        self.frozen = False
        self.on_init = on_init
        self.nodes: dict[int, Node] = {}
        self.handles: dict[int, Handle] = {}
        self.next_nid = 1
        self.next_fh = 1
        self.root = self._new_node("d")
        self.is_root = os.geteuid() == 0
        self.scan()

    # ---------------------------------------------------------------- model helpers

    def _new_node(self, kind: str) -> Node:
        node = Node(self.next_nid, kind)
        self.next_nid += 1
        self.nodes[node.nid] = node
        return node

    def scan(self) -> None:
        """Take the backing directory as it is as the fully durable state."""
        self.nodes = {}
        self.handles = {}
        self.next_nid = 1
        self.root = self._new_node("d")
        self.root.live_links = 1
        self.root.mode = stat.S_IMODE(os.lstat(self.backing).st_mode)
        shutil.rmtree(self.nodes_dir, ignore_errors=True)
        os.makedirs(self.nodes_dir, exist_ok=True)
        by_inode: dict[tuple[int, int], Node] = {}
        stack = [(self.root, self.backing)]
        while stack:
            parent, path = stack.pop()
            with os.scandir(path) as it:
                entries = sorted(it, key=lambda e: e.name)
            for entry in entries:
                st = entry.stat(follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    node = self._new_node("d")
                    node.mode = stat.S_IMODE(st.st_mode)
                    stack.append((node, entry.path))
                elif stat.S_ISREG(st.st_mode):
                    key = (st.st_dev, st.st_ino)
                    found = by_inode.get(key)
                    if found is None:
                        node = self._new_node("f")
                        node.size = node.dsize = st.st_size
                        by_inode[key] = node
                    else:
                        node = found
                elif stat.S_ISLNK(st.st_mode):
                    node = self._new_node("l")
                    node.target = os.readlink(entry.path)
                else:
                    raise FaultFSError(
                        f"{entry.path}: faultfs handles only files, directories and symlinks"
                    )
                parent.live[entry.name] = parent.durable[entry.name] = node.nid
                node.live_links += 1
                node.durable_refs += 1

    def _check(self) -> None:
        if self.frozen:
            raise _err(errno.EIO)

    def _bpath(self, path: str) -> str:
        return self.backing + path if path != "/" else self.backing

    def _lookup(self, path: str | None) -> Node:
        if path is None:
            raise _err(errno.ENOENT)
        node = self.root
        if path == "/":
            return node
        for part in path.split("/")[1:]:
            if node.kind != "d":
                raise _err(errno.ENOTDIR)
            nid = node.live.get(part)
            if nid is None:
                raise _err(errno.ENOENT)
            node = self.nodes[nid]
        return node

    def _parent(self, path: str) -> tuple[Node, str]:
        head, _, name = path.rpartition("/")
        parent = self._lookup(head or "/")
        if parent.kind != "d":
            raise _err(errno.ENOTDIR)
        return parent, name

    def _handle(self, fh: int | None) -> Handle:
        handle = self.handles.get(fh) if fh is not None else None
        if handle is None:
            raise _err(errno.EBADF)
        return handle

    def _new_handle(self, node: Node, fd: int) -> int:
        fh = self.next_fh
        self.next_fh += 1
        handle = Handle(fh, node, fd)
        self.handles[fh] = handle
        node.handles.append(handle)
        return fh

    def _node_file(self, node: Node) -> str:
        return os.path.join(self.nodes_dir, str(node.nid))

    def _chown_to_caller(self, path: str | None = None, fd: int | None = None) -> None:
        if not self.is_root:
            return
        uid, gid, _pid = mfusepy.fuse_get_context()
        if uid == 0 and gid == 0:
            return
        if fd is not None:
            os.fchown(fd, uid, gid)
        elif path is not None:
            os.chown(path, uid, gid, follow_symlinks=False)

    def _maybe_free(self, node: Node) -> None:
        if node.live_links or node.durable_refs or node.handles or node is self.root:
            return
        self.nodes.pop(node.nid, None)
        if node.unlinked_copy is not None:
            with contextlib.suppress(OSError):
                os.unlink(node.unlinked_copy)
            node.unlinked_copy = None
        if node.kind == "d":
            for nid in node.durable.values():
                child = self.nodes.get(nid)
                if child is not None:
                    child.durable_refs -= 1
                    self._maybe_free(child)
            node.durable = {}

    def _keep_unlinked(self, node: Node, bpath: str) -> bool:
        """Before the last live name of ``node`` goes: if a durable entry still names it, keep
        its bytes (hard link into the state directory). True if there is something to undo."""
        if node.kind != "f" or node.live_links != 1 or not node.durable_refs:
            return False
        if node.unlinked_copy is not None:
            return False
        dst = self._node_file(node)
        try:
            os.link(bpath, dst)
        except OSError:
            if node.handles:
                return False  # copied from an open handle at its release (or at the cut)
            _copy_file(bpath, dst)
        node.unlinked_copy = dst
        return True

    def _undo_keep(self, node: Node) -> None:
        if node.unlinked_copy is not None:
            with contextlib.suppress(OSError):
                os.unlink(node.unlinked_copy)
            node.unlinked_copy = None

    def _save(self, node: Node, fd: int, start: int, end: int) -> None:
        """Copy aside the durable value of [start, end) (below dsize) before it changes."""
        end = min(end, node.dsize)
        for a, b in node.saved.gaps(start, end):
            data = os.pread(fd, b - a, a)
            if len(data) < b - a:  # cannot happen unless the backing file changed under us
                data += bytes(b - a - len(data))
            node.pieces.append((a, data))
            node.saved.add(a, b)

    def _truncate(self, node: Node, length: int, fd: int | None, bpath: str | None) -> None:
        if node.kind != "f":
            raise _err(errno.EISDIR if node.kind == "d" else errno.EINVAL)
        own_fd = None
        if length < node.dsize and node.saved.gaps(length, node.dsize):
            if fd is None:
                assert bpath is not None
                own_fd = fd = os.open(bpath, os.O_RDONLY | os.O_CLOEXEC)
            try:
                self._save(node, fd, length, node.dsize)
            finally:
                if own_fd is not None:
                    os.close(own_fd)
                    fd = None
        if fd is not None:
            os.ftruncate(fd, length)
        else:
            assert bpath is not None
            os.truncate(bpath, length)
        if length > node.size:
            node.written.add(node.size, length)
        else:
            node.written.truncate(length)
        node.size = length

    def _commit_file(self, node: Node) -> None:
        node.dsize = node.size
        node.saved.clear()
        node.pieces = []
        node.written.clear()

    def _commit_dir(self, node: Node) -> None:
        old = node.durable
        new = dict(node.live)
        for nid in new.values():
            self.nodes[nid].durable_refs += 1
        for nid in old.values():
            child = self.nodes.get(nid)
            if child is not None:
                child.durable_refs -= 1
        node.durable = new
        for nid in old.values():
            child = self.nodes.get(nid)
            if child is not None:
                self._maybe_free(child)

    def _open_backing(self, bpath: str, flags: int, create_mode: int | None = None) -> int:
        extra = (flags & ~_STRIP_FLAGS) | os.O_CLOEXEC
        if create_mode is not None:
            extra |= os.O_CREAT | os.O_EXCL
        try:
            return os.open(bpath, os.O_RDWR | extra, create_mode or 0)
        except OSError as e:
            if e.errno not in (errno.EACCES, errno.EPERM, errno.ETXTBSY, errno.EROFS):
                raise
            return os.open(bpath, (flags & os.O_ACCMODE) | extra, create_mode or 0)

    # ---------------------------------------------------------------- status

    def unsynced(self) -> dict[str, int]:
        data = 0
        entries = 0
        for node in self.nodes.values():
            if node.kind == "f":
                data += node.written.total()
            elif node.kind == "d" and node.live != node.durable:
                entries += len(set(node.live.items()) ^ set(node.durable.items()))
        return {"unsynced_bytes": data, "unsynced_entries": entries}

    # ---------------------------------------------------------------- FUSE operations

    def init_with_config(self, conn_info: Any, config_3: Any) -> None:
        if config_3 is not None:
            config_3.hard_remove = 1  # unlink of an open file: no .fuse_hidden rename
            config_3.use_ino = 1  # st_ino of the backing file: hard links share it
        if self.on_init is not None:
            self.on_init()

    def destroy(self, path: str) -> None:
        return None

    def getattr(self, path: str | None, fh: int | None = None) -> dict[str, Any]:
        with self.mutex:
            self._check()
            handle = self.handles.get(fh) if fh is not None else None
            if handle is not None and handle.fd >= 0:
                return _stat_dict(os.fstat(handle.fd))
            self._lookup(path)
            assert path is not None
            return _stat_dict(os.lstat(self._bpath(path)))

    def access(self, path: str, amode: int) -> int:
        with self.mutex:
            self._check()
            self._lookup(path)
            if not os.access(self._bpath(path), amode, follow_symlinks=False):
                raise _err(errno.EACCES)
            return 0

    def statfs(self, path: str) -> dict[str, int]:
        with self.mutex:
            self._check()
            sv = os.statvfs(self.backing)
            return {
                key: getattr(sv, key)
                for key in (
                    "f_bsize",
                    "f_frsize",
                    "f_blocks",
                    "f_bfree",
                    "f_bavail",
                    "f_files",
                    "f_ffree",
                    "f_favail",
                    "f_flag",
                    "f_namemax",
                )
            }

    def readlink(self, path: str) -> str:
        with self.mutex:
            self._check()
            node = self._lookup(path)
            if node.kind != "l":
                raise _err(errno.EINVAL)
            return node.target

    def opendir(self, path: str) -> int:
        with self.mutex:
            self._check()
            node = self._lookup(path)
            if node.kind != "d":
                raise _err(errno.ENOTDIR)
            return self._new_handle(node, -1)

    def readdir(self, path: str | None, fh: int) -> list[str | tuple[str, dict[str, int], int]]:
        with self.mutex:
            self._check()
            handle = self.handles.get(fh)
            node = handle.node if handle is not None else self._lookup(path)
            out: list[str | tuple[str, dict[str, int], int]] = [".", ".."]
            if not node.live or path is None:
                return out
            # use_ino: each entry carries the backing inode number (0 would hide it)
            with os.scandir(self._bpath(path)) as it:
                inodes = {entry.name: entry.inode() for entry in it}
            for name, nid in node.live.items():
                attrs = {"st_mode": _KIND_MODE[self.nodes[nid].kind], "st_ino": inodes.get(name, 1)}
                out.append((name, attrs, 0))
            return out

    def releasedir(self, path: str | None, fh: int) -> int:
        with self.mutex:
            handle = self.handles.pop(fh, None)
            if handle is not None:
                handle.node.handles.remove(handle)
                self._maybe_free(handle.node)
            return 0

    def fsyncdir(self, path: str | None, datasync: int, fh: int) -> int:
        with self.mutex:
            self._check()
            handle = self.handles.get(fh)
            node = handle.node if handle is not None else self._lookup(path)
            if node.kind == "d" and node.nid in self.nodes:
                self._commit_dir(node)
            return 0

    def _create_entry(self, path: str, kind: str, make: Callable[[str], None]) -> Node:
        """A new directory or symlink at ``path``: made in the backing dir by ``make``,
        owned by the caller, and a live (not yet durable) entry of its parent."""
        parent, name = self._parent(path)
        if name in parent.live:
            raise _err(errno.EEXIST)
        bpath = self._bpath(path)
        make(bpath)
        self._chown_to_caller(path=bpath)
        node = self._new_node(kind)
        node.live_links = 1
        parent.live[name] = node.nid
        return node

    def mkdir(self, path: str, mode: int) -> int:
        with self.mutex:
            self._check()
            node = self._create_entry(path, "d", lambda bpath: os.mkdir(bpath, mode))
            node.mode = stat.S_IMODE(mode)
            return 0

    def rmdir(self, path: str) -> int:
        with self.mutex:
            self._check()
            parent, name = self._parent(path)
            nid = parent.live.get(name)
            if nid is None:
                raise _err(errno.ENOENT)
            node = self.nodes[nid]
            if node.kind != "d":
                raise _err(errno.ENOTDIR)
            if node.live:
                raise _err(errno.ENOTEMPTY)
            os.rmdir(self._bpath(path))
            del parent.live[name]
            node.live_links = 0
            self._maybe_free(node)
            return 0

    def symlink(self, target: str, source: str) -> int:
        # mfusepy: ``target`` is the new link's path, ``source`` what it points to
        with self.mutex:
            self._check()
            node = self._create_entry(target, "l", lambda bpath: os.symlink(source, bpath))
            node.target = source
            return 0

    def link(self, target: str, source: str) -> int:
        # mfusepy: ``target`` is the new name, ``source`` the existing file
        with self.mutex:
            self._check()
            node = self._lookup(source)
            if node.kind == "d":
                raise _err(errno.EPERM)
            parent, name = self._parent(target)
            if name in parent.live:
                raise _err(errno.EEXIST)
            os.link(self._bpath(source), self._bpath(target), follow_symlinks=False)
            parent.live[name] = node.nid
            node.live_links += 1
            return 0

    def unlink(self, path: str) -> int:
        with self.mutex:
            self._check()
            parent, name = self._parent(path)
            nid = parent.live.get(name)
            if nid is None:
                raise _err(errno.ENOENT)
            node = self.nodes[nid]
            if node.kind == "d":
                raise _err(errno.EISDIR)
            bpath = self._bpath(path)
            kept = self._keep_unlinked(node, bpath)
            try:
                os.unlink(bpath)
            except OSError:
                if kept:
                    self._undo_keep(node)
                raise
            del parent.live[name]
            node.live_links -= 1
            self._maybe_free(node)
            return 0

    def rename(self, old: str, new: str, flags: int = 0) -> int:
        with self.mutex:
            self._check()
            if flags & RENAME_EXCHANGE:
                raise _err(errno.EINVAL)
            src_parent, src_name = self._parent(old)
            nid = src_parent.live.get(src_name)
            if nid is None:
                raise _err(errno.ENOENT)
            node = self.nodes[nid]
            dst_parent, dst_name = self._parent(new)
            victim_nid = dst_parent.live.get(dst_name)
            if victim_nid is not None and flags & RENAME_NOREPLACE:
                raise _err(errno.EEXIST)
            if victim_nid == nid:
                return 0  # two names of one file: rename(2) does nothing
            victim = self.nodes[victim_nid] if victim_nid is not None else None
            if victim is not None:
                if node.kind == "d" and victim.kind != "d":
                    raise _err(errno.ENOTDIR)
                if node.kind != "d" and victim.kind == "d":
                    raise _err(errno.EISDIR)
                if victim.kind == "d" and victim.live:
                    raise _err(errno.ENOTEMPTY)
            bnew = self._bpath(new)
            kept = victim is not None and self._keep_unlinked(victim, bnew)
            try:
                os.rename(self._bpath(old), bnew)
            except OSError:
                if kept and victim is not None:
                    self._undo_keep(victim)
                raise
            del src_parent.live[src_name]
            dst_parent.live[dst_name] = nid
            if victim is not None:
                victim.live_links -= 1
                self._maybe_free(victim)
            return 0

    def chmod(self, path: str | None, mode: int, fh: int | None = None) -> int:
        with self.mutex:
            self._check()
            handle = self.handles.get(fh) if fh is not None else None
            if handle is not None and handle.fd >= 0:
                os.fchmod(handle.fd, mode)
                return 0
            node = self._lookup(path)
            assert path is not None
            os.chmod(self._bpath(path), mode, follow_symlinks=False)
            if node.kind == "d":
                node.mode = stat.S_IMODE(mode)
            return 0

    def chown(self, path: str | None, uid: int, gid: int, fh: int | None = None) -> int:
        with self.mutex:
            self._check()
            handle = self.handles.get(fh) if fh is not None else None
            if handle is not None and handle.fd >= 0:
                os.fchown(handle.fd, uid, gid)
                return 0
            self._lookup(path)
            assert path is not None
            os.chown(self._bpath(path), uid, gid, follow_symlinks=False)
            return 0

    def utimens(
        self,
        path: str | None,
        times: tuple[tuple[int, int], tuple[int, int]] | None = None,
        fh: int | None = None,
    ) -> int:
        with self.mutex:
            self._check()
            handle = self.handles.get(fh) if fh is not None else None
            target: int | str
            if handle is not None and handle.fd >= 0:
                target = handle.fd
                st = os.fstat(handle.fd)
            else:
                self._lookup(path)
                assert path is not None
                target = self._bpath(path)
                st = os.lstat(target)
            now = time.time_ns()
            if times is None:
                ns = (now, now)
            else:
                current = (st.st_atime_ns, st.st_mtime_ns)
                picked = []
                for (sec, nsec), cur in zip(times, current):
                    if nsec == UTIME_NOW:
                        picked.append(now)
                    elif nsec == UTIME_OMIT:
                        picked.append(cur)
                    else:
                        picked.append(sec * 1_000_000_000 + nsec)
                ns = (picked[0], picked[1])
            if isinstance(target, int):
                os.utime(target, ns=ns)
            else:
                os.utime(target, ns=ns, follow_symlinks=False)
            return 0

    def create(self, path: str, mode: int, flags: int = os.O_RDWR) -> int:
        with self.mutex:
            self._check()
            parent, name = self._parent(path)
            nid = parent.live.get(name)
            bpath = self._bpath(path)
            if nid is not None:  # the kernel normally opens an existing file with open()
                if flags & os.O_EXCL:
                    raise _err(errno.EEXIST)
                node = self.nodes[nid]
                if node.kind != "f":
                    raise _err(errno.EISDIR if node.kind == "d" else errno.EEXIST)
                fd = self._open_backing(bpath, flags)
                if flags & os.O_TRUNC:
                    self._truncate(node, 0, fd, None)
                return self._new_handle(node, fd)
            fd = self._open_backing(bpath, flags, create_mode=mode)
            self._chown_to_caller(fd=fd)
            node = self._new_node("f")
            node.live_links = 1
            parent.live[name] = node.nid
            return self._new_handle(node, fd)

    def open(self, path: str, flags: int) -> int:
        with self.mutex:
            self._check()
            node = self._lookup(path)
            if node.kind != "f":
                raise _err(errno.EISDIR if node.kind == "d" else errno.ELOOP)
            fd = self._open_backing(self._bpath(path), flags)
            if flags & os.O_TRUNC:
                try:
                    self._truncate(node, 0, fd, None)
                except BaseException:
                    os.close(fd)
                    raise
            return self._new_handle(node, fd)

    def read(self, path: str | None, size: int, offset: int, fh: int) -> bytes:
        with self.mutex:
            self._check()
            handle = self._handle(fh)
            return os.pread(handle.fd, size, offset)

    def write(self, path: str | None, data: bytes, offset: int, fh: int) -> int:
        with self.mutex:
            self._check()
            handle = self._handle(fh)
            node = handle.node
            if offset < node.dsize:
                self._save(node, handle.fd, offset, offset + len(data))
            n = os.pwrite(handle.fd, data, offset)
            end = offset + n
            node.written.add(min(offset, node.size), end)
            if end > node.size:
                node.size = end
            return n

    def truncate(self, path: str | None, length: int, fh: int | None = None) -> int:
        with self.mutex:
            self._check()
            handle = self.handles.get(fh) if fh is not None else None
            if handle is not None and handle.fd >= 0:
                self._truncate(handle.node, length, handle.fd, None)
                return 0
            node = self._lookup(path)
            assert path is not None
            self._truncate(node, length, None, self._bpath(path))
            return 0

    def fallocate(self, path: str | None, mode: int, offset: int, size: int, fh: int) -> int:
        # posix_fallocate: plain allocation (grows the file, zero-filled) or KEEP_SIZE (a
        # space reservation, nothing to track); hole punching and the rest: EOPNOTSUPP.
        with self.mutex:
            self._check()
            handle = self._handle(fh)
            if mode & ~FALLOC_FL_KEEP_SIZE:
                raise _err(errno.EOPNOTSUPP)
            if not mode & FALLOC_FL_KEEP_SIZE and offset + size > handle.node.size:
                self._truncate(handle.node, offset + size, handle.fd, None)
            return 0

    def flush(self, path: str | None, fh: int) -> int:
        return 0

    def fsync(self, path: str | None, datasync: int, fh: int) -> int:
        with self.mutex:
            self._check()
            handle = self._handle(fh)
            if handle.node.kind == "f":
                self._commit_file(handle.node)
            elif handle.node.kind == "d":
                self._commit_dir(handle.node)
            return 0

    def release(self, path: str | None, fh: int) -> int:
        with self.mutex:  # runs even when frozen: the kernel is closing the file
            handle = self.handles.pop(fh, None)
            if handle is None:
                return 0
            node = handle.node
            node.handles.remove(handle)
            try:
                if (
                    node.kind == "f"
                    and not node.live_links
                    and node.durable_refs
                    and not node.handles
                    and node.unlinked_copy is None
                ):
                    dst = self._node_file(node)
                    _copy_from_fd(handle.fd, dst)
                    node.unlinked_copy = dst
            finally:
                os.close(handle.fd)
                self._maybe_free(node)
            return 0

    # ---------------------------------------------------------------- the power cut

    def _walk(
        self, durable: bool
    ) -> tuple[list[tuple[str, Node]], dict[int, list[str]], list[str]]:
        """The tree as (directories in BFS order, file node id -> paths, other paths) from the
        root, through the live or the durable maps. A directory reachable twice (a rename
        durable at both ends) is kept at its first path."""
        dirs: list[tuple[str, Node]] = [("", self.root)]
        files: dict[int, list[str]] = {}
        others: list[str] = []
        seen = {self.root.nid}
        i = 0
        while i < len(dirs):
            path, d = dirs[i]
            i += 1
            entries = d.durable if durable else d.live
            for name in sorted(entries):
                node = self.nodes.get(entries[name])
                if node is None:
                    continue
                p = f"{path}/{name}"
                if node.kind == "d":
                    if node.nid not in seen:
                        seen.add(node.nid)
                        dirs.append((p, node))
                elif node.kind == "f":
                    files.setdefault(node.nid, []).append(p)
                else:
                    others.append(p)
        return dirs, files, others

    def _tear_point(self, dirty: list[tuple[int, int]], total: int, rng: random.Random) -> int:
        keep = rng.randint(0, total)
        pos = dirty[0][0]
        acc = 0
        for a, b in dirty:
            if acc + (b - a) >= keep:
                pos = a + (keep - acc)
                break
            acc += b - a
        if rng.random() < 0.5:
            pos -= pos % SECTOR  # torn at a sector boundary
        return pos

    def _roll_back(self, fd: int, node: Node, mode: str, rng: random.Random, path: str) -> FileCut:
        """Turn the live bytes in ``fd`` into what the power cut leaves of ``node``."""
        dirty = node.written.clipped(0, node.size)
        total = sum(b - a for a, b in dirty)
        kept = garbled = 0
        if mode == "garble":
            for off, data in node.pieces:
                _pwrite_all(fd, data, off)
            result = max(node.dsize, node.size)
            os.ftruncate(fd, result)
            for a, b in dirty:
                pos = a
                while pos < b:
                    n = min(COPY_CHUNK, b - pos)
                    _pwrite_all(fd, rng.randbytes(n), pos)
                    pos += n
            garbled = total
        else:
            cut = self._tear_point(dirty, total, rng) if mode == "tear" and total else 0
            keep = IntervalSet()
            for a, b in dirty:
                if a < cut:
                    keep.add(a, min(b, cut))
            kept = keep.total()
            for off, data in node.pieces:
                for a, b in keep.gaps(off, off + len(data)):
                    _pwrite_all(fd, data[a - off : b - off], a)
            result = max(node.dsize, min(cut, node.size))
            os.ftruncate(fd, result)
        return FileCut(
            path=path,
            live_size=node.size,
            durable_size=node.dsize,
            result_size=result,
            unsynced_bytes=total,
            dropped_bytes=total - kept - garbled,
            kept_bytes=kept,
            garbled_bytes=garbled,
        )

    def rebuild(
        self, mode: str, seed: str, cut_number: int, dir_survival: float = 0.0
    ) -> CutReport:
        """Make the backing directory what a power cut leaves (the mount is down), then take
        that as the new durable state. ``dir_survival`` is the chance that a directory's
        un-synced entry changes are kept anyway (as if it had been fsynced just before)."""
        started = time.monotonic()
        rng = random.Random(f"{seed}/{cut_number}")
        report = CutReport(mode=mode, seed=seed, cut_number=cut_number)
        report.open_handles = sum(1 for h in self.handles.values() if h.fd >= 0)

        live_dirs, live_files, live_others = self._walk(durable=False)
        if dir_survival > 0:
            for path, d in live_dirs:
                if d.live != d.durable and rng.random() < dir_survival:
                    self._commit_dir(d)
                    report.dirs_synced_anyway.append(path or "/")
        dur_dirs, dur_files, dur_others = self._walk(durable=True)
        live_path = {nid: paths[0] for nid, paths in live_files.items()}
        handle_fd: dict[int, int] = {}
        for h in self.handles.values():
            if h.fd >= 0:
                handle_fd.setdefault(h.node.nid, h.fd)

        hold = os.path.join(self.backing, f"{HOLD_PREFIX}{os.getpid()}")
        shutil.rmtree(hold, ignore_errors=True)
        os.mkdir(hold, 0o700)
        placed: list[tuple[str, list[str]]] = []
        for nid, paths in sorted(dur_files.items(), key=lambda kv: kv[1][0]):
            node = self.nodes[nid]
            held = os.path.join(hold, str(nid))
            if nid in live_path:
                os.rename(self._bpath(live_path[nid]), held)
            elif node.unlinked_copy is not None:
                try:
                    os.rename(node.unlinked_copy, held)
                except OSError:
                    _copy_file(node.unlinked_copy, held)
            elif nid in handle_fd:
                _copy_from_fd(handle_fd[nid], held)
            else:  # cannot happen: a durable file always has its bytes somewhere
                log.error("faultfs: no bytes for %s, restoring it empty", paths[0])
                os.close(os.open(held, os.O_WRONLY | os.O_CREAT, 0o644))
            fd = os.open(held, os.O_RDWR | os.O_CLOEXEC)
            try:
                if node.written or node.pieces or node.size != node.dsize:
                    fc = self._roll_back(fd, node, mode, rng, paths[0])
                    report.files.append(fc)
                    report.bytes_dropped += fc.dropped_bytes
                    report.bytes_kept += fc.kept_bytes
                    report.bytes_garbled += fc.garbled_bytes
            finally:
                os.close(fd)
            placed.append((held, paths))

        for h in list(self.handles.values()):
            if h.fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(h.fd)
        self.handles = {}

        for entry in os.scandir(self.backing):
            if entry.path == hold:
                continue
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)
            else:
                os.unlink(entry.path)
        for path, dnode in dur_dirs[1:]:
            os.mkdir(self._bpath(path), 0o700)
            os.chmod(self._bpath(path), dnode.mode)
        for dirpath, d in dur_dirs:
            for name, nid in d.durable.items():
                lnode = self.nodes.get(nid)
                if lnode is not None and lnode.kind == "l":
                    os.symlink(lnode.target, self._bpath(f"{dirpath}/{name}"))
        for held, paths in placed:
            os.rename(held, self._bpath(paths[0]))
            for other in paths[1:]:
                os.link(self._bpath(paths[0]), self._bpath(other))
        os.rmdir(hold)

        before_files = {p for paths in live_files.values() for p in paths} | set(live_others)
        after_files = {p for paths in dur_files.values() for p in paths} | set(dur_others)
        before_dirs = {p for p, _ in live_dirs[1:]}
        after_dirs = {p for p, _ in dur_dirs[1:]}
        report.files_lost = sorted(before_files - after_files)
        report.files_restored = sorted(after_files - before_files)
        live_ids = {p: nid for nid, paths in live_files.items() for p in paths}
        dur_ids = {p: nid for nid, paths in dur_files.items() for p in paths}
        report.files_replaced = sorted(
            p for p in before_files & after_files if live_ids.get(p) != dur_ids.get(p)
        )
        report.dirs_lost = sorted(before_dirs - after_dirs)
        report.dirs_restored = sorted(after_dirs - before_dirs)

        self.scan()
        report.seconds = round(time.monotonic() - started, 6)
        return report


class _FUSE(mfusepy.FUSE):
    """mfusepy's libfuse3 wrappers drop the file handle of truncate/chmod/chown/utimens and the
    flags of rename; these pass them on."""

    def _dec(self, path: bytes | None) -> str | None:
        return None if path is None else path.decode(self.encoding, self.errors)

    @staticmethod
    def _fh(fip: Any) -> int | None:
        return fip.contents.fh if fip else None

    def truncate_fuse_3(self, path: bytes | None, length: int, fip: Any) -> int:
        return int(self.operations.truncate(self._dec(path), length, self._fh(fip)))

    def chmod_fuse_3(self, path: bytes | None, mode: int, fip: Any) -> int:
        return int(self.operations.chmod(self._dec(path), mode, self._fh(fip)))

    def chown_fuse_3(self, path: bytes | None, uid: int, gid: int, fip: Any) -> int:
        if uid == 0xFFFFFFFF:
            uid = -1
        if gid == 0xFFFFFFFF:
            gid = -1
        return int(self.operations.chown(self._dec(path), uid, gid, self._fh(fip)))

    def rename_fuse_3(self, old: bytes, new: bytes, flags: int) -> int:
        return int(self.operations.rename(self._dec(old), self._dec(new), flags))

    def utimens_fuse_3(self, path: bytes | None, buf: Any, fip: Any) -> int:
        times = None
        if buf:
            t = buf.contents
            times = ((t.actime.tv_sec, t.actime.tv_nsec), (t.modtime.tv_sec, t.modtime.tv_nsec))
        return int(self.operations.utimens(self._dec(path), times, self._fh(fip)))


class _Request:
    def __init__(
        self, kind: str, mode: str = "drop", seed: str = "", dir_survival: float = 0.0
    ) -> None:
        self.kind = kind
        self.mode = mode
        self.seed = seed
        self.dir_survival = dir_survival
        self.exited = threading.Event()  # the FUSE session ended
        self.done = threading.Event()  # rebuilt and mounted again (or failed)
        self.report: CutReport | None = None
        self.rebuilt = False
        self.error: str | None = None


class Daemon:
    """One mount, kept across power cuts: the main thread runs the FUSE session (again after
    each cut); a thread answers the control socket."""

    def __init__(
        self,
        backing: str,
        mountpoint: str,
        state: str,
        mode: str = "drop",
        seed: str = "0",
        dir_survival: float = 0.0,
        allow_other: bool = False,
        watch_parent: int | None = None,
        cut_timeout: float = 10.0,
        debug: bool = False,
    ) -> None:
        if mode not in MODES:
            raise FaultFSError(f"unknown mode {mode!r} (one of {', '.join(MODES)})")
        self.backing = os.path.realpath(backing)
        self.mountpoint = resolve_mountpoint(mountpoint)
        self.state = os.path.realpath(state)
        self.mode = mode
        self.seed = seed
        self.dir_survival = _check_chance(dir_survival)
        self.allow_other = allow_other
        self.watch_parent = watch_parent
        self.cut_timeout = cut_timeout
        self.debug = debug
        self.cond = threading.Condition()
        self.mounted = False
        self.device: str | None = None
        self.cuts = 0
        self.request: _Request | None = None
        self.stopping = False
        self.fatal: str | None = None
        os.makedirs(self.state, exist_ok=True)
        for inner, outer, what in (
            (self.state, self.backing, "the state directory must not be inside the backing"),
            (self.state, self.mountpoint, "the state directory must not be inside the mount"),
            (self.backing, self.mountpoint, "the backing directory must not be inside the mount"),
            (self.mountpoint, self.backing, "the mountpoint must not be inside the backing"),
        ):
            if os.path.commonpath([inner, outer]) == outer:
                raise FaultFSError(f"{what} ({inner} in {outer})")
        self.ops = FaultOps(self.backing, self.state, on_init=self._on_init)

    # ------------------------------------------------------------ main loop

    def run(self) -> int:
        os.umask(0)
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            server.bind(socket_name(self.state))
        except OSError as e:
            raise FaultFSError(f"another faultfs daemon uses {self.state}: {e}") from e
        server.listen(16)
        threading.Thread(target=self._serve, args=(server,), daemon=True).start()
        if self.watch_parent is not None:
            threading.Thread(target=self._watch_parent, daemon=True).start()
        info = {
            "pid": os.getpid(),
            "backing": self.backing,
            "mountpoint": self.mountpoint,
            "mode": self.mode,
            "seed": self.seed,
        }
        Path(self.state, INFO_FILE).write_text(json.dumps(info) + "\n")
        status = 0
        try:
            while True:
                error: BaseException | None = None
                try:
                    self._mount_once()
                except (RuntimeError, OSError) as e:
                    error = e
                with self.cond:
                    self.mounted = False
                    req = self.request
                    stopping = self.stopping
                if req is not None and req.kind == "cut" and not req.rebuilt:
                    req.exited.set()
                    try:
                        with self.ops.mutex:
                            self.cuts += 1
                            req.report = self.ops.rebuild(
                                req.mode, req.seed, self.cuts, req.dir_survival
                            )
                            req.rebuilt = True
                            self.ops.frozen = False
                    except Exception:
                        req.error = traceback.format_exc()
                        log.error("faultfs: rebuild failed:\n%s", req.error)
                        with self.cond:
                            self.fatal = req.error
                        status = 1
                        break
                    if stopping:
                        req.error = "the faultfs daemon was stopped during the cut"
                        break
                    continue
                if req is not None and req.kind == "cut":
                    req.error = f"the remount after the cut failed: {error}"
                    status = 1
                elif error is not None and not stopping:
                    log.error("faultfs: FUSE session ended: %s", error)
                    status = 1
                break
        finally:
            with self.cond:
                self.mounted = False
                req = self.request
                self.request = None
            if req is not None:
                if req.kind == "cut" and req.error is None and req.report is None:
                    req.error = "the faultfs daemon stopped"
                req.exited.set()
                req.done.set()
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(self.state, INFO_FILE))
            server.close()
        return status

    def _mount_once(self) -> None:
        opts: dict[str, Any] = {
            "foreground": True,
            "fsname": f"{FSNAME_PREFIX}{self.state}",
            "subtype": "faultfs",
            "default_permissions": True,
            "hard_remove": True,
            "use_ino": True,
            "debug": self.debug,
        }
        if "," in self.state or " " in self.state:
            opts["fsname"] = "faultfs"
        if self.allow_other:
            opts["allow_other"] = True
        if (mfusepy.fuse_version_major, mfusepy.fuse_version_minor) >= (3, 12):
            opts["max_threads"] = 16  # libfuse 3.14.0 complains when these are left unset
            opts["max_idle_threads"] = 8
        _FUSE(self.ops, self.mountpoint, **opts)

    def _on_init(self) -> None:
        entry = mount_entry(self.mountpoint)
        with self.cond:
            self.mounted = True
            self.device = entry["device"] if entry else None
            req = self.request
            if req is not None and req.kind == "cut":
                self.request = None
                req.done.set()
            self.cond.notify_all()

    # ------------------------------------------------------------ control

    def _serve(self, server: socket.socket) -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            try:
                buf = bytearray()
                while not buf.endswith(b"\n"):
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    buf += chunk
                msg = json.loads(buf)
                reply = self._dispatch(msg)
            except Exception as e:
                reply = {"ok": False, "error": f"{type(e).__name__}: {e}"}
            with contextlib.suppress(OSError):
                conn.sendall(json.dumps(reply).encode() + b"\n")

    def _dispatch(self, msg: dict[str, Any]) -> dict[str, Any]:
        cmd = msg.get("cmd")
        if cmd == "status":
            with self.cond:
                status: dict[str, Any] = {
                    "ok": True,
                    "pid": os.getpid(),
                    "mounted": self.mounted,
                    "cuts": self.cuts,
                    "mode": self.mode,
                    "seed": self.seed,
                    "dir_survival": self.dir_survival,
                    "backing": self.backing,
                    "mountpoint": self.mountpoint,
                    "fatal": self.fatal,
                }
            with self.ops.mutex:
                status["open_handles"] = len(self.ops.handles)
                status["nodes"] = len(self.ops.nodes)
                status.update(self.ops.unsynced())
            return status
        if cmd == "cut":
            mode = msg.get("mode") or self.mode
            if mode not in MODES:
                return {"ok": False, "error": f"unknown mode {mode!r}"}
            seed = msg.get("seed")
            chance = msg.get("dir_survival")
            return self._cut(
                mode,
                str(self.seed if seed is None else seed),
                self.dir_survival if chance is None else _check_chance(float(chance)),
            )
        if cmd == "stop":
            self._stop()
            return {"ok": True}
        return {"ok": False, "error": f"unknown command {cmd!r}"}

    def _cut(self, mode: str, seed: str, dir_survival: float) -> dict[str, Any]:
        req = _Request("cut", mode, seed, dir_survival)
        with self.cond:
            if self.fatal is not None:
                return {"ok": False, "error": f"the daemon failed earlier: {self.fatal}"}
            if self.request is not None or self.stopping or not self.mounted:
                return {"ok": False, "error": "not mounted, or a cut or stop is under way"}
            self.request = req
            device = self.device
        with self.ops.mutex:
            self.ops.frozen = True
        forced, busy = force_unmount(self.mountpoint)
        if not forced:
            lazy_unmount(self.mountpoint)
        if not req.exited.wait(self.cut_timeout):
            # Something still holds a file or directory on the mount: end the session anyway.
            busy = device is not None and abort_connection(device)
            # A loaded machine may take long to wind the session's threads down; a hang
            # leaves every thread's stack in the log (the error shows its tail).
            if not req.exited.wait(self.cut_timeout * 3):
                faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
                return {"ok": False, "error": "the FUSE session did not end after the unmount"}
        if not req.done.wait(max(60.0, self.cut_timeout * 6)):
            return {"ok": False, "error": "rebuild and remount did not finish in time"}
        if req.error is not None or req.report is None:
            return {"ok": False, "error": req.error or "no report"}
        req.report.aborted_connection = busy
        return {"ok": True, "report": req.report.to_dict()}

    def _stop(self) -> None:
        with self.cond:
            self.stopping = True
        lazy_unmount(self.mountpoint)

    def _watch_parent(self) -> None:
        while True:
            time.sleep(0.5)
            if os.getppid() != self.watch_parent:
                log.warning("faultfs: parent %s went away, unmounting", self.watch_parent)
                self._stop()
                return


def main_mount(
    backing: str,
    mountpoint: str,
    state: str,
    mode: str,
    seed: str,
    dir_survival: float,
    allow_other: bool,
    watch_parent: int | None,
    cut_timeout: float,
    debug: bool,
) -> int:
    logging.basicConfig(
        level=logging.DEBUG if debug else logging.WARNING,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    daemon = Daemon(
        backing,
        mountpoint,
        state,
        mode=mode,
        seed=seed,
        dir_survival=dir_survival,
        allow_other=allow_other,
        watch_parent=watch_parent,
        cut_timeout=cut_timeout,
        debug=debug,
    )
    return daemon.run()
