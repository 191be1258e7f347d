"""The test harness's handle on one fault filesystem mount (the daemon runs as a subprocess)."""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from ._common import (
    LOG_FILE,
    MODES,
    FaultFSError,
    fusermount,
    is_fuse_mounted,
    lazy_unmount,
    request,
)
from .report import CutReport

# The repository root: ``python -m tests.faultfs`` must import this package from there.
_ROOT = Path(__file__).resolve().parents[2]


@functools.cache
def fuse_available() -> tuple[bool, str]:
    """Whether FUSE mounts can work here: (True, "") or (False, why not)."""
    if not os.path.exists("/dev/fuse"):
        return False, "/dev/fuse does not exist (load the fuse module or pass the device in)"
    if not os.access("/dev/fuse", os.R_OK | os.W_OK):
        return False, "/dev/fuse is not readable and writable by this user"
    if fusermount() is None:
        return False, "fusermount3 is not installed (apt-get install fuse3)"
    if importlib.util.find_spec("mfusepy") is None:
        return False, "the mfusepy package is not installed (pip install -e '.[test]')"
    try:
        probe = subprocess.run(
            [sys.executable, "-c", "import tests.faultfs.daemon"],
            cwd=_ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, f"cannot start the faultfs daemon's interpreter: {e}"
    if probe.returncode != 0:
        lines = probe.stderr.strip().splitlines() or ["(no output)"]
        return False, f"the FUSE binding does not load: {lines[-1]}"
    return True, ""


class FaultFS:
    """A LazyFS-style fault filesystem over ``backing_dir``, mounted at ``mountpoint``.

    Everything written through the mount lands in ``backing_dir`` at once, but a power cut
    (``power_cut``) keeps only what was made durable: file data up to each file's last
    fsync/fdatasync, directory entries (create, rename, unlink, mkdir, rmdir) once their
    directory was fsynced. ``state_dir`` (outside ``backing_dir``; best on the same
    filesystem) holds the daemon's bookkeeping and its log, ``daemon.log``.

    ``mode`` says what happens to un-synced file data at a cut: "drop" (back to the durable
    content), "tear" (a random prefix of it, in file order, is kept, cut at a random byte or
    512-byte boundary), "garble" (its ranges keep their length but hold random bytes).
    ``seed`` makes tear and garble repeatable. ``dir_survival`` (0 by default) is the chance
    that a directory's un-synced entry changes (creates, renames, unlinks) survive a cut
    anyway, as a journaling filesystem may commit them on its own: above 0 the cuts also
    explore states such as "the rename survived, the un-synced data did not". ``timeout`` bounds the wait for the mount;
    ``cut_timeout`` is how long a cut waits for a mount that something still holds open
    before it aborts the FUSE connection.
    """

    def __init__(
        self,
        backing_dir: str | os.PathLike[str],
        mountpoint: str | os.PathLike[str],
        state_dir: str | os.PathLike[str],
        mode: str = "drop",
        seed: int | str = 0,
        *,
        dir_survival: float = 0.0,
        allow_other: bool = False,
        timeout: float = 30.0,
        cut_timeout: float = 30.0,
        debug: bool = False,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
        self.backing_dir = Path(backing_dir)
        self.mountpoint = Path(mountpoint)
        self.state_dir = Path(state_dir)
        self.mode = mode
        if not 0.0 <= dir_survival <= 1.0:
            raise ValueError(f"dir_survival must be between 0 and 1, not {dir_survival}")
        self.seed = seed
        self.dir_survival = dir_survival
        self.allow_other = allow_other
        self.timeout = timeout
        self.cut_timeout = cut_timeout
        self.debug = debug
        self.process: subprocess.Popen[bytes] | None = None
        self.cuts: list[CutReport] = []

    # ------------------------------------------------------------------ lifecycle

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    @property
    def log_path(self) -> Path:
        return self.state_dir / LOG_FILE

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def is_mounted(self) -> bool:
        return is_fuse_mounted(self.mountpoint)

    def mount(self) -> None:
        """Start the daemon and return once the mount answers."""
        if self.process is not None and self.process.poll() is None:
            raise FaultFSError("already mounted")
        ok, why = fuse_available()
        if not ok:
            raise FaultFSError(f"FUSE unavailable: {why}")
        if not self.backing_dir.is_dir():
            raise FaultFSError(f"backing directory {self.backing_dir} does not exist")
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        if self.is_mounted():
            raise FaultFSError(f"{self.mountpoint} is already a FUSE mount")
        cmd = [
            sys.executable,
            "-m",
            "tests.faultfs",
            "mount",
            str(self.backing_dir),
            str(self.mountpoint),
            "--state",
            str(self.state_dir),
            "--mode",
            self.mode,
            "--seed",
            str(self.seed),
            "--dir-survival",
            repr(self.dir_survival),
            "--cut-timeout",
            str(self.cut_timeout),
            "--watch-parent",
            str(os.getpid()),
        ]
        if self.allow_other:
            cmd.append("--allow-other")
        if self.debug:
            cmd.append("--debug")
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_ROOT), env.get("PYTHONPATH", "")) if p)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                cmd,
                cwd=_ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        deadline = time.monotonic() + self.timeout
        while True:
            if self.process.poll() is not None:
                code = self.process.returncode
                self.process = None
                raise FaultFSError(
                    f"the faultfs daemon exited ({code}) before mounting:\n{self.log_tail()}"
                )
            with contextlib.suppress(OSError, FaultFSError, ValueError):
                if self.status(timeout=2.0).get("mounted"):
                    return
            if time.monotonic() > deadline:
                self._kill()
                self.process = None
                lazy_unmount(self.mountpoint)
                raise FaultFSError(f"the faultfs mount did not come up:\n{self.log_tail()}")
            time.sleep(0.02)

    def status(self, timeout: float = 10.0) -> dict[str, Any]:
        """The daemon's view: mounted, cuts so far, open handles, un-synced bytes and entries."""
        return request(self.state_dir, {"cmd": "status"}, timeout)

    def power_cut(
        self,
        mode: str | None = None,
        seed: int | str | None = None,
        dir_survival: float | None = None,
    ) -> CutReport:
        """Lose everything that is not durable, then mount again.

        The caller must first kill -9 every process that uses the mount (and reap it). The
        filesystem freezes (every operation fails with EIO), unmounts, rebuilds the backing
        directory to its durable state and mounts again, so no page cache survives. ``mode``,
        ``seed`` and ``dir_survival`` override the mount's for this cut."""
        if mode is not None and mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
        if self.process is None or self.process.poll() is not None:
            raise FaultFSError(f"the faultfs daemon is not running:\n{self.log_tail()}")
        msg: dict[str, Any] = {
            "cmd": "cut",
            "mode": mode,
            "seed": seed,
            "dir_survival": dir_survival,
        }
        try:
            answer = request(self.state_dir, msg, timeout=120.0 + self.cut_timeout * 8)
        except OSError as e:
            raise FaultFSError(f"power cut failed: {e}\n{self.log_tail()}") from e
        if not answer.get("ok"):
            raise FaultFSError(f"power cut failed: {answer.get('error')}\n{self.log_tail(80)}")
        report = CutReport.from_dict(answer["report"])
        if not self.is_mounted():
            raise FaultFSError(f"not mounted again after the power cut:\n{self.log_tail()}")
        self.cuts.append(report)
        return report

    def unmount(self) -> None:
        """Unmount cleanly (everything written stays in the backing directory) and stop the
        daemon; also cleans up after a daemon that died."""
        proc = self.process
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(OSError, FaultFSError, ValueError):
                request(self.state_dir, {"cmd": "stop"}, timeout=10.0)
            try:
                proc.wait(timeout=15.0)
            except subprocess.TimeoutExpired:
                self._kill()
        if self.is_mounted():
            lazy_unmount(self.mountpoint)
        if self.is_mounted():
            tool = fusermount()
            if tool is not None:
                subprocess.run([tool, "-u", "-z", str(self.mountpoint)], check=False)
        self.process = None
        if self.is_mounted():
            raise FaultFSError(f"{self.mountpoint} is still mounted")

    def _kill(self) -> None:
        proc = self.process
        if proc is None or proc.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 10.0)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, sig)
            try:
                proc.wait(timeout=wait)
                return
            except subprocess.TimeoutExpired:
                continue

    def __enter__(self) -> FaultFS:
        self.mount()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.unmount()
