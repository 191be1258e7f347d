"""A LazyFS-style power-loss fault filesystem for tests: an oracle independent of trio_broker.

A FUSE pass-through filesystem over a backing directory that tracks what a real disk would
keep across a power cut (file data up to the last fsync/fdatasync, directory entries once
their directory was fsynced) and, on ``FaultFS.power_cut()``, throws the rest away::

    from tests.faultfs import FaultFS, fuse_available

    with FaultFS(backing, mnt, state, mode="tear", seed=1) as fs:
        ...  # run the program under test on mnt, kill -9 it
        report = fs.power_cut()
        ...  # restart it on mnt and check what it recovers

The daemon runs as ``python -m tests.faultfs mount BACKING MOUNTPOINT --state DIR``;
``python -m tests.faultfs cut MOUNTPOINT_OR_STATE`` cuts the power from a shell.
"""

from ._common import MODES, FaultFSError
from .client import FaultFS, fuse_available
from .report import CutReport, FileCut

__all__ = ["MODES", "CutReport", "FaultFS", "FaultFSError", "FileCut", "fuse_available"]
