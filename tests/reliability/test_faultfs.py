"""The power-loss fault filesystem (tests/faultfs) on real mounts: each durability rule, each
mode, the pass-through of ordinary file operations, the CLI and the clean-up paths.

These need FUSE (/dev/fuse, fusermount3, mfusepy). Where it is missing they fail loudly:
an oracle that silently does not run would hide the crash-safety bugs it is there to find.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.faultfs import CutReport, FaultFS, FaultFSError, fuse_available
from tests.faultfs._common import is_fuse_mounted
from tests.faultfs._intervals import IntervalSet

ROOT = Path(__file__).resolve().parents[2]

MakeFS = Callable[..., FaultFS]


@pytest.fixture
def make_fs(tmp_path: Path) -> Iterator[MakeFS]:
    """Mount fault filesystems under tmp_path; every one is unmounted at the end."""
    made: list[FaultFS] = []

    def make(mode: str = "drop", seed: int | str = 1, name: str = "fs", **kw: Any) -> FaultFS:
        ok, why = fuse_available()
        if not ok:  # in the test itself, so that it counts as failed, not as an error
            pytest.fail(f"FUSE unavailable: {why}", pytrace=False)
        base = tmp_path / name
        backing = base / "backing"
        backing.mkdir(parents=True)
        fs = FaultFS(backing, base / "mnt", base / "state", mode=mode, seed=seed, **kw)
        made.append(fs)
        fs.mount()
        return fs

    yield make
    errors = []
    for fs in made:
        try:
            fs.unmount()
        except FaultFSError as e:
            errors.append(str(e))
    for fs in made:
        assert not is_fuse_mounted(fs.mountpoint), f"{fs.mountpoint} left mounted"
    assert not errors, errors


def write(path: Path, data: bytes, sync: bool = True) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


def append(path: Path, data: bytes, sync: bool = False) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, data)
        if sync:
            os.fdatasync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def durable_file(fs: FaultFS, name: str, data: bytes) -> Path:
    """A file whose data and directory entry are both durable."""
    path = fs.mountpoint / name
    write(path, data)
    fsync_dir(path.parent)
    return path


# ------------------------------------------------------------------------------- file data


def test_synced_data_survives_a_cut(make_fs: MakeFS) -> None:
    fs = make_fs()
    path = durable_file(fs, "a", b"hello world")
    report = fs.power_cut()
    assert path.read_bytes() == b"hello world"
    assert not report.changed, report.summary()


def test_unsynced_append_is_dropped(make_fs: MakeFS) -> None:
    fs = make_fs("drop")
    path = durable_file(fs, "log", b"A" * 1000)
    append(path, b"B" * 5000)
    assert path.stat().st_size == 6000
    assert (fs.backing_dir / "log").stat().st_size == 6000  # write-through: no page cache games
    report = fs.power_cut()
    assert path.read_bytes() == b"A" * 1000
    assert report.bytes_dropped == 5000
    entry = report.file("/log")
    assert entry is not None
    assert (entry.live_size, entry.durable_size, entry.result_size) == (6000, 1000, 1000)


def test_fdatasync_makes_appends_durable_and_only_the_rest_is_dropped(make_fs: MakeFS) -> None:
    fs = make_fs("drop")
    path = durable_file(fs, "log", b"")
    for i in range(50):
        append(path, b"%04d" % i, sync=True)
    append(path, b"lost")
    fs.power_cut()
    assert path.read_bytes() == b"".join(b"%04d" % i for i in range(50))


def test_unsynced_overwrite_is_dropped(make_fs: MakeFS) -> None:
    fs = make_fs("drop")
    path = durable_file(fs, "f", bytes(range(256)) * 40)
    fd = os.open(path, os.O_RDWR)
    os.pwrite(fd, b"X" * 300, 1000)
    os.pwrite(fd, b"Y" * 100, 1200)  # overlaps the first overwrite
    os.pwrite(fd, b"Z" * 50, 10_230)  # past the end: extends the file
    os.close(fd)
    fs.power_cut()
    assert path.read_bytes() == bytes(range(256)) * 40


def test_unsynced_append_is_torn(make_fs: MakeFS) -> None:
    results = set()
    for seed in range(6):
        fs = make_fs("tear", seed=seed, name=f"tear{seed}")
        path = durable_file(fs, "log", b"A" * 1000)
        tail = bytes(i % 251 for i in range(20_000))
        append(path, tail)
        report = fs.power_cut()
        got = path.read_bytes()
        assert got == (b"A" * 1000 + tail)[: len(got)], "a torn write keeps a prefix"
        assert 1000 <= len(got) <= 21_000
        entry = report.file("/log")
        assert entry is not None and entry.result_size == len(got)
        assert entry.kept_bytes == len(got) - 1000
        assert entry.kept_bytes + entry.dropped_bytes == 20_000
        results.add(len(got))
        fs.unmount()
    assert len(results) > 1, "different seeds tear at different places"


def test_tear_is_repeatable_with_the_same_seed(make_fs: MakeFS) -> None:
    sizes = []
    for name in ("one", "two"):
        fs = make_fs("tear", seed=42, name=name)
        path = durable_file(fs, "log", b"x" * 100)
        append(path, b"y" * 50_000)
        fs.power_cut()
        sizes.append(path.stat().st_size)
        fs.unmount()
    assert sizes[0] == sizes[1]


def test_unsynced_data_is_garbled(make_fs: MakeFS) -> None:
    fs = make_fs("garble", seed=7)
    path = durable_file(fs, "f", b"A" * 4096)
    fd = os.open(path, os.O_RDWR)
    os.pwrite(fd, b"C" * 100, 1000)  # overwrite inside the durable part
    os.pwrite(fd, b"B" * 3000, 4096)  # append
    os.close(fd)
    report = fs.power_cut()
    got = path.read_bytes()
    assert len(got) == 7096, "garbled ranges keep their length"
    assert got[:1000] == b"A" * 1000 and got[1100:4096] == b"A" * 2996
    assert got[1000:1100] not in (b"A" * 100, b"C" * 100)
    assert got[4096:] != b"B" * 3000
    assert report.bytes_garbled == 3100


def test_per_cut_mode_overrides_the_mount_mode(make_fs: MakeFS) -> None:
    fs = make_fs("drop")
    path = durable_file(fs, "f", b"A" * 100)
    append(path, b"B" * 100)
    report = fs.power_cut(mode="garble")
    assert report.mode == "garble"
    assert path.stat().st_size == 200


def test_truncation_after_fsync(make_fs: MakeFS) -> None:
    fs = make_fs("drop")
    path = durable_file(fs, "f", b"0123456789" * 1000)
    os.truncate(path, 100)  # not synced: undone
    fs.power_cut()
    assert path.read_bytes() == b"0123456789" * 1000

    fd = os.open(path, os.O_RDWR)
    os.ftruncate(fd, 100)
    os.fsync(fd)  # synced: kept
    os.ftruncate(fd, 50_000)  # growing again, not synced: undone
    os.pwrite(fd, b"late", 200)
    os.close(fd)
    fs.power_cut()
    assert path.read_bytes() == (b"0123456789" * 1000)[:100]


def test_o_trunc_rewrite_without_fsync_keeps_the_old_content(make_fs: MakeFS) -> None:
    fs = make_fs("drop")
    path = durable_file(fs, "f", b"old content")
    path.write_bytes(b"new")
    fs.power_cut()
    assert path.read_bytes() == b"old content"


def test_o_sync_writes_are_durable(make_fs: MakeFS) -> None:
    fs = make_fs("drop")
    path = durable_file(fs, "f", b"")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_SYNC)
    os.write(fd, b"synced by O_SYNC")
    os.close(fd)
    fs.power_cut()
    assert path.read_bytes() == b"synced by O_SYNC"


def _random_history(path: Path, rng: random.Random) -> tuple[bytes, bytes, set[int]]:
    """Random writes, appends, truncations and fsyncs on ``path`` (durable at the start);
    returns the content at the last fsync, the live content and the offsets written (or
    zero-extended) since then."""
    durable = path.read_bytes()
    live = bytearray(durable)
    dirty: set[int] = set()
    fd = os.open(path, os.O_RDWR)
    try:
        for _ in range(rng.randint(5, 40)):
            op = rng.random()
            if op < 0.65:
                off = rng.randint(0, len(live) + 3000) if op < 0.45 else len(live)
                data = rng.randbytes(rng.randint(1, 5000))
                os.pwrite(fd, data, off)
                dirty.update(range(min(off, len(live)), off + len(data)))
                if off > len(live):
                    live.extend(bytes(off - len(live)))
                live[off : off + len(data)] = data
            elif op < 0.8:
                size = rng.randint(0, len(live) + 2000)
                os.ftruncate(fd, size)
                if size > len(live):
                    dirty.update(range(len(live), size))
                else:
                    dirty = {i for i in dirty if i < size}
                live = live[:size] + bytearray(max(0, size - len(live)))
            else:
                os.fdatasync(fd)
                durable = bytes(live)
                dirty = set()
        assert os.pread(fd, len(live) + 10, 0) == live
    finally:
        os.close(fd)
    return durable, bytes(live), dirty


@pytest.mark.parametrize("mode", ["drop", "tear", "garble"])
def test_random_histories_against_a_reference(make_fs: MakeFS, mode: str) -> None:
    fs = make_fs(mode, seed=3)
    path = durable_file(fs, "f", b"")
    for round_ in range(12):
        rng = random.Random(f"{mode}/{round_}")
        durable, live, dirty = _random_history(path, rng)
        report = fs.power_cut()
        got = path.read_bytes()
        if mode == "drop":
            assert got == durable
            continue
        # bytes not written since the fsync keep their durable value
        for i in range(len(got)):
            if i not in dirty:
                assert i < len(durable) and got[i] == durable[i], f"byte {i} changed"
        if mode == "garble":
            assert len(got) == max(len(durable), len(live))
            assert report.bytes_garbled == len(dirty)
            continue
        # tear: each written byte is durable or live, and the live ones that differ from the
        # durable ones all come before the reverted ones (a prefix, in file order, is kept)
        assert len(durable) <= len(got) <= max(len(durable), len(live))
        kept: list[int] = []
        reverted: list[int] = []
        for i in sorted(dirty):
            d = durable[i] if i < len(durable) else None
            v = live[i]
            b = got[i] if i < len(got) else None
            assert b in (d, v), f"byte {i} is neither durable nor live"
            if d != v:
                (kept if b == v else reverted).append(i)
        assert not kept or not reverted or max(kept) < min(reverted)


# ------------------------------------------------------------------------ directory entries


def test_created_file_without_dir_fsync_vanishes(make_fs: MakeFS) -> None:
    fs = make_fs()
    path = fs.mountpoint / "new"
    write(path, b"data", sync=True)  # the data is durable, the entry is not
    report = fs.power_cut()
    assert not path.exists()
    assert report.files_lost == ["/new"]


def test_created_file_with_dir_fsync_survives(make_fs: MakeFS) -> None:
    fs = make_fs()
    path = fs.mountpoint / "new"
    write(path, b"data", sync=True)
    fsync_dir(fs.mountpoint)
    other = fs.mountpoint / "empty"
    write(other, b"never synced", sync=False)
    fsync_dir(fs.mountpoint)  # the entry is durable, the data is not
    fs.power_cut()
    assert path.read_bytes() == b"data"
    assert other.read_bytes() == b""


def test_rename_without_dir_fsync_reverts(make_fs: MakeFS) -> None:
    fs = make_fs()
    old = durable_file(fs, "old", b"content")
    new = fs.mountpoint / "new"
    os.rename(old, new)
    report = fs.power_cut()
    assert old.read_bytes() == b"content"
    assert not new.exists()
    assert report.files_lost == ["/new"] and report.files_restored == ["/old"]


def test_rename_with_dir_fsync_sticks(make_fs: MakeFS) -> None:
    fs = make_fs()
    old = durable_file(fs, "old", b"content")
    new = fs.mountpoint / "new"
    os.rename(old, new)
    fsync_dir(fs.mountpoint)
    fs.power_cut()
    assert new.read_bytes() == b"content"
    assert not old.exists()


def test_rename_across_directories_needs_both_fsyncs(make_fs: MakeFS) -> None:
    fs = make_fs()
    (fs.mountpoint / "a").mkdir()
    (fs.mountpoint / "b").mkdir()
    fsync_dir(fs.mountpoint)
    src = durable_file(fs, "a/f", b"x")
    dst = fs.mountpoint / "b" / "f"
    os.rename(src, dst)
    fsync_dir(dst.parent)  # only the destination: the old entry is still durable too
    fs.power_cut()
    assert src.read_bytes() == b"x" and dst.read_bytes() == b"x"
    assert src.stat().st_ino == dst.stat().st_ino  # one file, two names
    src.unlink()
    fsync_dir(src.parent)
    fs.power_cut()
    assert not src.exists() and dst.read_bytes() == b"x"


def test_unlink_without_dir_fsync_brings_the_file_back(make_fs: MakeFS) -> None:
    fs = make_fs()
    path = durable_file(fs, "f", b"durable")
    append(path, b" and not durable")
    path.unlink()
    report = fs.power_cut()
    assert path.read_bytes() == b"durable"
    assert report.files_restored == ["/f"]

    path.unlink()
    fsync_dir(fs.mountpoint)
    fs.power_cut()
    assert not path.exists()


def test_unlinked_open_file_written_and_synced_comes_back_with_the_new_data(
    make_fs: MakeFS,
) -> None:
    fs = make_fs()
    path = durable_file(fs, "f", b"v1")
    fd = os.open(path, os.O_RDWR)
    path.unlink()
    os.pwrite(fd, b"v2", 0)
    os.fsync(fd)
    os.close(fd)
    fs.power_cut()
    assert path.read_bytes() == b"v2"


def test_rename_over_an_existing_file(make_fs: MakeFS) -> None:
    fs = make_fs()
    target = durable_file(fs, "target", b"old")
    tmp = fs.mountpoint / "tmp"
    write(tmp, b"new")
    os.rename(tmp, target)
    assert target.read_bytes() == b"new"
    report = fs.power_cut()
    assert target.read_bytes() == b"old"
    assert report.files_replaced == ["/target"]


def test_crash_safe_replace_pattern(make_fs: MakeFS) -> None:
    """write tmp, fsync, rename over, fsync the directory: the new content survives; without
    the last fsync the old content (and no tmp) is what a cut leaves."""
    fs = make_fs()
    target = durable_file(fs, "config", b"version 1")
    for version, sync_dir in ((b"version 2", True), (b"version 3", False)):
        tmp = fs.mountpoint / "config.tmp"
        write(tmp, version, sync=True)
        os.rename(tmp, target)
        if sync_dir:
            fsync_dir(fs.mountpoint)
        fs.power_cut()
        assert not tmp.exists()
        assert target.read_bytes() == b"version 2"
    assert sorted(os.listdir(fs.mountpoint)) == ["config"]


def test_dir_survival_keeps_unsynced_entries_but_not_unsynced_data(make_fs: MakeFS) -> None:
    """With dir_survival=1 every directory's un-synced entries survive, as if a journaling
    filesystem had committed them: the rename of a never-fsynced file leaves it empty (the
    classic zero-length file after a crash)."""
    fs = make_fs(dir_survival=1.0)
    target = durable_file(fs, "config", b"version 1")
    tmp = fs.mountpoint / "config.tmp"
    write(tmp, b"version 2", sync=False)
    os.rename(tmp, target)
    write(fs.mountpoint / "created", b"synced data", sync=True)
    report = fs.power_cut()
    assert report.dirs_synced_anyway == ["/"]
    assert target.read_bytes() == b""
    assert (fs.mountpoint / "created").read_bytes() == b"synced data"

    write(fs.mountpoint / "again", b"x", sync=True)
    report = fs.power_cut(dir_survival=0.0)
    assert not (fs.mountpoint / "again").exists() and report.dirs_synced_anyway == []


def test_mkdir_and_rmdir_need_the_parent_fsync(make_fs: MakeFS) -> None:
    fs = make_fs()
    sub = fs.mountpoint / "sub"
    sub.mkdir()
    durable_file(fs, "sub/f", b"inside")  # durable inside sub, but sub itself is not
    report = fs.power_cut()
    assert not sub.exists()
    assert report.dirs_lost == ["/sub"] and report.files_lost == ["/sub/f"]

    sub.mkdir()
    fsync_dir(fs.mountpoint)
    durable_file(fs, "sub/f", b"inside")
    (sub / "f").unlink()
    sub.rmdir()  # neither the unlink nor the rmdir is durable
    report = fs.power_cut()
    assert (sub / "f").read_bytes() == b"inside"
    assert report.dirs_restored == ["/sub"]

    (sub / "f").unlink()
    fsync_dir(sub)
    sub.rmdir()
    fsync_dir(fs.mountpoint)
    fs.power_cut()
    assert not sub.exists()


def test_symlinks_and_hard_links_follow_the_same_rules(make_fs: MakeFS) -> None:
    fs = make_fs()
    target = durable_file(fs, "target", b"t")
    os.symlink("target", fs.mountpoint / "sym")
    os.link(target, fs.mountpoint / "hard")
    fsync_dir(fs.mountpoint)
    os.symlink("target", fs.mountpoint / "sym2")
    fs.power_cut()
    assert os.readlink(fs.mountpoint / "sym") == "target"
    assert (fs.mountpoint / "hard").read_bytes() == b"t"
    assert (fs.mountpoint / "hard").stat().st_ino == target.stat().st_ino
    assert not (fs.mountpoint / "sym2").exists()


def test_several_cuts_in_a_row_and_what_was_there_before_the_mount(make_fs: MakeFS) -> None:
    fs = make_fs()
    fs.unmount()
    (fs.backing_dir / "pre").write_bytes(b"existing")
    (fs.backing_dir / "dir").mkdir()
    (fs.backing_dir / "dir" / "inner").write_bytes(b"deep")
    fs.mount()
    pre = fs.mountpoint / "pre"
    append(pre, b" more")
    (fs.mountpoint / "dir" / "inner").unlink()
    fs.power_cut()
    assert pre.read_bytes() == b"existing"
    assert (fs.mountpoint / "dir" / "inner").read_bytes() == b"deep"
    for i in range(3):
        append(pre, b"+%d" % i, sync=True)
        fs.power_cut()
    assert pre.read_bytes() == b"existing+0+1+2"
    assert [c.cut_number for c in fs.cuts] == [1, 2, 3, 4]


def test_a_killed_writer_keeps_every_acknowledged_record(make_fs: MakeFS) -> None:
    """The harness's use: a process appends records, acknowledging each after fdatasync; it is
    killed -9 mid-stream and the power cut; every acknowledged record is still there."""
    fs = make_fs("tear", seed=11)
    log = fs.mountpoint / "log"
    writer = (
        "import os, sys\n"
        "fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)\n"
        "d = os.open(os.path.dirname(sys.argv[1]), os.O_RDONLY); os.fsync(d)\n"
        "i = 0\n"
        "while True:\n"
        "    os.write(fd, b'record %08d\\n' % i)\n"
        "    if i % 3 == 0:\n"
        "        os.fdatasync(fd)\n"
        "        print(i, flush=True)\n"
        "    i += 1\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", writer, str(log)], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    acked = -1
    for line in proc.stdout:
        acked = int(line)
        if acked >= 600:
            break
    proc.kill()
    proc.wait()
    report = fs.power_cut()
    data = log.read_bytes()
    records = b"".join(b"record %08d\n" % i for i in range(acked + 1))
    assert data.startswith(records)
    assert report.bytes_kept + report.bytes_dropped == sum(f.unsynced_bytes for f in report.files)


# ------------------------------------------------------------------------ pass-through ops


def test_ordinary_file_operations_pass_through(make_fs: MakeFS) -> None:
    fs = make_fs()
    m = fs.mountpoint
    # O_APPEND from two descriptors
    path = m / "log"
    fd1 = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640)
    fd2 = os.open(path, os.O_WRONLY | os.O_APPEND)
    os.write(fd1, b"one,")
    os.write(fd2, b"two,")
    os.write(fd1, b"three")
    os.close(fd1)
    os.close(fd2)
    assert path.read_bytes() == b"one,two,three"
    assert path.stat().st_mode & 0o777 == 0o640
    # pread / pwrite at offsets, holes
    fd = os.open(m / "sparse", os.O_RDWR | os.O_CREAT, 0o644)
    os.pwrite(fd, b"end", 1 << 20)
    os.pwrite(fd, b"start", 0)
    assert os.pread(fd, 5, 0) == b"start" and os.pread(fd, 3, 1 << 20) == b"end"
    assert os.fstat(fd).st_size == (1 << 20) + 3
    os.ftruncate(fd, 10)
    assert os.fstat(fd).st_size == 10
    os.close(fd)
    # posix_fallocate grows the file (zero-filled); the growth is un-synced data like any other
    fd = os.open(m / "prealloc", os.O_RDWR | os.O_CREAT, 0o644)
    os.posix_fallocate(fd, 0, 1 << 20)
    assert os.fstat(fd).st_size == 1 << 20 and os.pread(fd, 4, 4096) == bytes(4)
    os.close(fd)
    # sendfile from a file on the mount
    left, right = socket.socketpair()
    with left, right, open(path, "rb") as f:
        sent = os.sendfile(left.fileno(), f.fileno(), 4, 9)
        assert right.recv(100) == b"two,three"[:sent]
    # chmod, utime, statfs, readdir
    os.chmod(path, 0o600)
    assert path.stat().st_mode & 0o777 == 0o600
    os.utime(path, ns=(1_000_000_000, 2_000_000_000))
    assert path.stat().st_mtime_ns == 2_000_000_000
    assert os.statvfs(m).f_bsize > 0
    (m / "d").mkdir()
    assert sorted(os.listdir(m)) == ["d", "log", "prealloc", "sparse"]
    assert [e.name for e in os.scandir(m) if e.is_dir()] == ["d"]
    # rename over an existing file, rename flags refused cleanly
    (m / "x").write_bytes(b"x")
    os.replace(m / "x", m / "log")
    assert (m / "log").read_bytes() == b"x"
    with pytest.raises(FileNotFoundError):
        os.rename(m / "missing", m / "y")
    with pytest.raises(OSError):
        os.rmdir(m / "log")
    # a file of tens of MB
    big = os.urandom(1 << 20) * 24
    with open(m / "big", "wb") as f:
        f.write(big)
        f.flush()
        os.fdatasync(f.fileno())
    assert (m / "big").read_bytes() == big
    # a clean unmount keeps everything, durable or not
    fs.unmount()
    assert (fs.backing_dir / "log").read_bytes() == b"x"
    assert (fs.backing_dir / "big").stat().st_size == len(big)
    assert (fs.backing_dir / "sparse").stat().st_size == 10


def test_many_appends_with_fdatasync(make_fs: MakeFS) -> None:
    # The rate is printed, not asserted: speed belongs to bench/, and a busy machine
    # (load 20) ran this at 193/s where a quiet one runs thousands.
    fs = make_fs()
    path = durable_file(fs, "log", b"")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    n = 2000
    started = time.monotonic()
    for _ in range(n):
        os.write(fd, b"r" * 200)
        os.fdatasync(fd)
    elapsed = time.monotonic() - started
    os.close(fd)
    assert path.stat().st_size == 200 * n
    print(f"{n / elapsed:.0f} append+fdatasync per second through the FUSE layer")


# ------------------------------------------------------------------ control and clean-up


def test_cli_status_and_cut(make_fs: MakeFS) -> None:
    fs = make_fs()
    path = durable_file(fs, "f", b"kept")
    append(path, b" lost")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    status = subprocess.run(
        [sys.executable, "-m", "tests.faultfs", "status", str(fs.mountpoint)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert json.loads(status.stdout)["unsynced_bytes"] == 5
    cut = subprocess.run(
        [sys.executable, "-m", "tests.faultfs", "cut", str(fs.mountpoint), "--json"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    report = CutReport.from_dict(json.loads(cut.stdout))
    assert report.bytes_dropped == 5
    assert path.read_bytes() == b"kept"


def test_a_cut_does_not_hang_on_a_file_still_open(make_fs: MakeFS) -> None:
    fs = make_fs(cut_timeout=1.0)
    path = durable_file(fs, "f", b"durable")
    fd = os.open(path, os.O_RDWR)
    os.write(fd, b"DURABLE + more")
    try:
        report = fs.power_cut()
        assert report.aborted_connection
        with pytest.raises(OSError):
            os.pread(fd, 10, 0)  # the old mount is gone for whoever still holds it
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)  # its flush fails too
    assert path.read_bytes() == b"durable"


def test_unmount_cleans_up_after_the_daemon_died(make_fs: MakeFS) -> None:
    fs = make_fs()
    assert fs.pid is not None
    os.kill(fs.pid, signal.SIGKILL)
    assert fs.process is not None
    fs.process.wait(timeout=10)
    assert fs.is_mounted()  # a dead daemon leaves its mount behind
    fs.unmount()
    assert not fs.is_mounted()
    with pytest.raises(FaultFSError):
        fs.power_cut()


def test_the_mount_goes_when_its_owner_dies(tmp_path: Path) -> None:
    ok, why = fuse_available()
    if not ok:
        pytest.fail(f"FUSE unavailable: {why}", pytrace=False)
    (tmp_path / "backing").mkdir()
    script = (
        "import sys; from tests.faultfs import FaultFS; "
        "fs = FaultFS(*sys.argv[1:4]); fs.mount(); print(fs.pid, flush=True)"
    )
    args = [str(tmp_path / d) for d in ("backing", "mnt", "state")]
    owner = subprocess.run(
        [sys.executable, "-c", script, *args],
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    daemon_pid = int(owner.stdout.split()[0])
    deadline = time.monotonic() + 60
    while is_fuse_mounted(tmp_path / "mnt") and time.monotonic() < deadline:
        time.sleep(0.05)
    mounted = is_fuse_mounted(tmp_path / "mnt")
    if mounted:  # clean up before failing
        FaultFS(*args).unmount()
        with contextlib.suppress(ProcessLookupError):
            os.kill(daemon_pid, signal.SIGKILL)
    assert not mounted, "the daemon outlived the process that mounted it"


def test_context_manager_and_bad_arguments(tmp_path: Path) -> None:
    ok, why = fuse_available()
    if not ok:
        pytest.fail(f"FUSE unavailable: {why}", pytrace=False)
    backing = tmp_path / "backing"
    backing.mkdir()
    with pytest.raises(ValueError):
        FaultFS(backing, tmp_path / "mnt", tmp_path / "state", mode="shred")
    with pytest.raises(FaultFSError):
        FaultFS(tmp_path / "missing", tmp_path / "mnt", tmp_path / "state").mount()
    with FaultFS(backing, tmp_path / "mnt", tmp_path / "state") as fs:
        (fs.mountpoint / "f").write_bytes(b"x")
        assert fs.is_mounted()
    assert not is_fuse_mounted(tmp_path / "mnt")
    assert (backing / "f").read_bytes() == b"x"


# --------------------------------------------------------------------------- pure helpers


def test_interval_set() -> None:
    s = IntervalSet()
    s.add(10, 20)
    s.add(20, 30)  # touching: merged
    s.add(40, 50)
    s.add(0, 5)
    assert list(s) == [(0, 5), (10, 30), (40, 50)]
    assert s.gaps(0, 60) == [(5, 10), (30, 40), (50, 60)]
    assert s.clipped(3, 45) == [(3, 5), (10, 30), (40, 45)]
    s.add(4, 41)
    assert list(s) == [(0, 50)]
    s.truncate(25)
    assert list(s) == [(0, 25)] and s.total() == 25
    s.add(100, 110)
    s.add(60, 70)
    s.add(65, 105)
    assert list(s) == [(0, 25), (60, 110)]
    s.truncate(60)
    assert list(s) == [(0, 25)]
    assert s.gaps(30, 40) == [(30, 40)] and s.gaps(5, 10) == []
