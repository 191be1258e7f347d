"""Command line: mount (runs the daemon in the foreground), cut, status, unmount."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from ._common import (
    INFO_FILE,
    MODES,
    FaultFSError,
    find_state_dir,
    fusermount,
    is_fuse_mounted,
    lazy_unmount,
    request,
)
from .report import CutReport

DIR_SURVIVAL_HELP = (
    "chance (0..1) that a directory's un-synced entry changes survive a cut anyway, as a "
    "journaling filesystem may commit them on its own (default 0: always lost)"
)


def _mount(args: argparse.Namespace) -> int:
    from .daemon import main_mount  # imports the FUSE binding

    return main_mount(
        args.backing,
        args.mountpoint,
        args.state,
        mode=args.mode,
        seed=args.seed,
        dir_survival=args.dir_survival,
        allow_other=args.allow_other,
        watch_parent=args.watch_parent,
        cut_timeout=args.cut_timeout,
        debug=args.debug,
    )


def _cut(args: argparse.Namespace) -> int:
    state = find_state_dir(args.target)
    msg = {"cmd": "cut", "mode": args.mode, "seed": args.seed, "dir_survival": args.dir_survival}
    answer = request(state, msg, timeout=300)
    if not answer.get("ok"):
        print(f"power cut failed: {answer.get('error')}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(answer["report"], indent=2))
    else:
        print(CutReport.from_dict(answer["report"]).summary())
    return 0


def _status(args: argparse.Namespace) -> int:
    state = find_state_dir(args.target)
    print(json.dumps(request(state, {"cmd": "status"}, timeout=30), indent=2))
    return 0


def _unmount(args: argparse.Namespace) -> int:
    target = Path(args.target)
    try:
        state: Path | None = find_state_dir(target)
    except FaultFSError:
        state = None
    mountpoint = target
    if state is not None:
        info_path = state / INFO_FILE
        info = json.loads(info_path.read_text()) if info_path.is_file() else {}
        mountpoint = Path(info.get("mountpoint", target))
        with contextlib.suppress(OSError, FaultFSError, ValueError):
            request(state, {"cmd": "stop"}, timeout=10)
        pid = info.get("pid")
        deadline = time.monotonic() + 15
        while pid and time.monotonic() < deadline and info_path.exists():
            time.sleep(0.05)
        if pid and info_path.exists():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
    if is_fuse_mounted(mountpoint):
        lazy_unmount(mountpoint)
    tool = fusermount()
    if is_fuse_mounted(mountpoint) and tool is not None:
        subprocess.run([tool, "-u", "-z", str(mountpoint)], check=False)
    if is_fuse_mounted(mountpoint):
        print(f"{mountpoint} is still mounted", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.faultfs",
        description="A FUSE filesystem that loses, at a simulated power cut, what was not fsynced.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("mount", help="mount and serve in the foreground until unmounted")
    p.add_argument("backing", help="the directory whose content the mount shows")
    p.add_argument("mountpoint")
    p.add_argument("--state", required=True, help="bookkeeping directory (outside backing)")
    p.add_argument("--mode", choices=MODES, default="drop", help="what a cut does to unsynced data")
    p.add_argument("--seed", default="0", help="seed for tear and garble")
    p.add_argument("--dir-survival", type=float, default=0.0, help=DIR_SURVIVAL_HELP)
    p.add_argument("--allow-other", action="store_true", help="let other users use the mount")
    p.add_argument(
        "--cut-timeout",
        type=float,
        default=10.0,
        help="seconds a cut waits for a busy mount before aborting its FUSE connection",
    )
    p.add_argument("--watch-parent", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--debug", action="store_true", help="libfuse debug output")
    p.set_defaults(func=_mount)

    p = sub.add_parser("cut", help="simulate a power cut (kill the mount's users first)")
    p.add_argument("target", help="the mountpoint or the state directory")
    p.add_argument("--mode", choices=MODES, default=None, help="override the mount's mode")
    p.add_argument("--seed", default=None, help="override the seed for this cut")
    p.add_argument("--dir-survival", type=float, default=None, help=DIR_SURVIVAL_HELP)
    p.add_argument("--json", action="store_true", help="print the whole report as JSON")
    p.set_defaults(func=_cut)

    p = sub.add_parser("status", help="the daemon's state as JSON")
    p.add_argument("target", help="the mountpoint or the state directory")
    p.set_defaults(func=_status)

    p = sub.add_parser("unmount", help="unmount cleanly and stop the daemon")
    p.add_argument("target", help="the mountpoint or the state directory")
    p.set_defaults(func=_unmount)

    args = parser.parse_args(argv)
    try:
        code: int = args.func(args)
    except FaultFSError as e:
        print(f"faultfs: {e}", file=sys.stderr)
        return 1
    return code


if __name__ == "__main__":
    sys.exit(main())
