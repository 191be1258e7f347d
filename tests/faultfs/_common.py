"""Helpers shared by the daemon and its clients: the control socket, mount table, unmounting.

Nothing here imports the FUSE binding, so a client can report that FUSE is missing.
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import json
import os
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Any

MODES = ("drop", "tear", "garble")
INFO_FILE = "daemon.json"
LOG_FILE = "daemon.log"
FSNAME_PREFIX = "faultfs:"
MNT_FORCE = 1
MNT_DETACH = 2


class FaultFSError(RuntimeError):
    """The fault filesystem could not do what was asked (mount, cut, unmount)."""


def socket_name(state_dir: str | os.PathLike[str]) -> str:
    """The control socket of the daemon that owns ``state_dir``: an abstract unix socket (no
    108-byte path limit, nothing to clean up), named after the state directory's real path."""
    digest = hashlib.sha256(os.path.realpath(state_dir).encode()).hexdigest()[:32]
    return f"\0tests.faultfs.{digest}"


def request(
    state_dir: str | os.PathLike[str], msg: dict[str, Any], timeout: float
) -> dict[str, Any]:
    """Send one JSON request to the daemon and return its JSON answer."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(socket_name(state_dir))
        sock.sendall(json.dumps(msg).encode() + b"\n")
        buf = bytearray()
        while not buf.endswith(b"\n"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            buf += chunk
    if not buf:
        raise FaultFSError(f"the faultfs daemon closed the control connection ({msg.get('cmd')})")
    answer: dict[str, Any] = json.loads(buf)
    return answer


def _unescape_mountinfo(field: str) -> str:
    out = []
    i = 0
    while i < len(field):
        if field[i] == "\\" and i + 3 < len(field) and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def resolve_mountpoint(mountpoint: str | os.PathLike[str]) -> str:
    """The absolute path of ``mountpoint`` with its parent resolved, without touching the
    mountpoint itself (a stat there waits for the FUSE daemon, which may be the caller)."""
    path = os.path.abspath(mountpoint)
    return os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))


def mount_entry(mountpoint: str | os.PathLike[str]) -> dict[str, str] | None:
    """The last /proc/self/mountinfo entry for ``mountpoint``: fstype, source, device (maj:min)."""
    target = resolve_mountpoint(mountpoint)
    found: dict[str, str] | None = None
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        left, _, right = line.partition(" - ")
        fields = left.split()
        tail = right.split()
        if len(fields) < 5 or len(tail) < 2:
            continue
        if _unescape_mountinfo(fields[4]) == target:
            found = {
                "device": fields[2],
                "fstype": tail[0],
                "source": _unescape_mountinfo(tail[1]),
            }
    return found


def is_fuse_mounted(mountpoint: str | os.PathLike[str]) -> bool:
    entry = mount_entry(mountpoint)
    return entry is not None and entry["fstype"].startswith("fuse")


def fusermount() -> str | None:
    return shutil.which("fusermount3") or shutil.which("fusermount")


def lazy_unmount(mountpoint: str | os.PathLike[str]) -> bool:
    """Detach the mount at ``mountpoint`` (MNT_DETACH): new lookups can no longer reach it, and
    the FUSE connection ends once nothing holds a file open on it. True if something was
    unmounted."""
    path = resolve_mountpoint(mountpoint)
    if not is_fuse_mounted(path):
        return False
    if os.geteuid() == 0:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.umount2(os.fsencode(path), MNT_DETACH) == 0:
            return True
    tool = fusermount()
    if tool is not None:
        subprocess.run([tool, "-u", "-z", path], capture_output=True, check=False, timeout=30)
    return not is_fuse_mounted(path)


def force_unmount(mountpoint: str | os.PathLike[str]) -> tuple[bool, bool]:
    """Pull the plug (root only): umount2(MNT_FORCE) aborts the FUSE connection at once (the
    daemon's session ends, whatever is still open on the mount gets ENOTCONN), then unmounts,
    lazily if something still holds the mount. Returns (done, the mount was busy)."""
    path = resolve_mountpoint(mountpoint)
    if os.geteuid() != 0 or not is_fuse_mounted(path):
        return False, False
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.umount2(os.fsencode(path), MNT_FORCE) == 0:
        return True, False
    busy = ctypes.get_errno() == errno.EBUSY
    return lazy_unmount(path), busy


def abort_connection(device: str) -> bool:
    """Abort the FUSE connection with device number ``device`` ("0:NN") through fusectl (for
    when MNT_FORCE is not allowed), so a daemon whose mount is still held open by some process
    stops serving it at once."""
    minor = device.split(":")[-1]
    conns = Path("/sys/fs/fuse/connections")
    mounted_here = False
    if not (conns / minor).exists() and os.geteuid() == 0:
        done = subprocess.run(
            ["mount", "-t", "fusectl", "fusectl", str(conns)],
            capture_output=True,
            check=False,
            timeout=30,
        )
        mounted_here = done.returncode == 0
    try:
        (conns / minor / "abort").write_text("1")
    except OSError:
        return False
    finally:
        if mounted_here:
            subprocess.run(["umount", str(conns)], capture_output=True, check=False, timeout=30)
    return True


def find_state_dir(target: str | os.PathLike[str]) -> Path:
    """A state directory given itself, or the mountpoint of a faultfs mount."""
    path = Path(target)
    if (path / INFO_FILE).is_file():
        return path
    entry = mount_entry(path)
    if entry is not None and entry["source"].startswith(FSNAME_PREFIX):
        return Path(entry["source"][len(FSNAME_PREFIX) :])
    raise FaultFSError(f"{target} is neither a faultfs state directory nor a faultfs mountpoint")
