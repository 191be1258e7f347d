"""storage/log_dir_state.py: a disk error in one log takes its whole log dir offline
(Kafka's LogDirFailureChannel rule); new partitions go to online dirs only."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.protocol.records import build_batch
from trio_broker.storage.errors import StorageError
from trio_broker.storage.log import PartitionLog
from trio_broker.storage.log_dir_state import LogDirs, LogDirState, NoOnlineLogDir

A, B, C = Path("/disks/a"), Path("/disks/b"), Path("/disks/c")


def test_a_new_partition_goes_to_the_online_dir_with_the_fewest() -> None:
    dirs = LogDirs([A, B, C])
    assert dirs.choose({A: 2, B: 1, C: 1}) == B  # fewest, the first of a tie
    assert dirs.state(B).fail("EIO in b/t-0")
    assert dirs.choose({A: 2, B: 1, C: 1}) == C  # b is offline, whatever it holds
    assert dirs.online() == [A, C] and dirs.offline() == [B]
    assert not dirs.is_online(B) and dirs.is_online(A) and not dirs.is_online(Path("/x"))
    dirs.state(A).fail("EIO")
    dirs.state(C).fail("EIO")
    with pytest.raises(NoOnlineLogDir) as refused:
        dirs.choose({})
    assert refused.value.error_code == ErrorCode.KAFKA_STORAGE_ERROR
    dirs.state(B).restore()
    assert dirs.choose({A: 0, B: 9, C: 0}) == B


def test_the_first_failure_takes_the_dir_offline_and_is_the_reason() -> None:
    state = LogDirState(A)
    assert state.fail("first") and not state.fail("second")
    assert state.offline and state.reason == "first"
    state.restore()
    assert not state.offline and state.reason is None


def batch(value: bytes) -> bytearray:
    return build_batch([(b"k", value)])


def test_a_failed_fsync_in_one_log_takes_every_log_of_its_dir_offline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    dirs = LogDirs([a, b])
    failing, quiet = (
        PartitionLog.open(a / name, dir_state=dirs.state(a)) for name in ("t-0", "t-1")
    )
    elsewhere = PartitionLog.open(b / "t-2", dir_state=dirs.state(b))
    assert set(dirs.state(a).members.values()) == {failing, quiet}
    for log in (failing, quiet, elsewhere):
        log.append(batch(b"before"), now_ms=0)
        log.flush()
    failing.append(batch(b"doomed"), now_ms=0)

    def eio(fd: int) -> None:
        raise OSError(errno.EIO, "injected EIO")

    monkeypatch.setattr(os, "fdatasync", eio)
    monkeypatch.setattr(os, "fsync", eio)
    with pytest.raises(StorageError):
        failing.flush()
    monkeypatch.undo()
    # The log nobody touched is offline with it: its dir is.
    assert failing.offline and quiet.offline and not dirs.is_online(a)
    assert "injected EIO" in (dirs.state(a).reason or "")
    with pytest.raises(StorageError, match="offline"):
        quiet.append(batch(b"refused"), now_ms=0)
    # The other dir's log is untouched.
    assert not elsewhere.offline
    elsewhere.append(batch(b"fine"), now_ms=0)
    assert elsewhere.flush() == 2
    # A log opened into the offline dir is offline from the start; a closed one leaves it.
    late = PartitionLog.open(a / "t-3", dir_state=dirs.state(a))
    assert late.offline
    for log in (failing, quiet, elsewhere, late):
        log.close()
    assert dirs.state(a).members == {} and dirs.state(b).members == {}


def test_a_log_that_cannot_be_opened_fails_its_dir(tmp_path: Path) -> None:
    a = tmp_path / "a"
    a.mkdir()
    (a / "t-0").write_bytes(b"a file where the partition's directory goes")
    dirs = LogDirs([a])
    with pytest.raises(StorageError):
        PartitionLog.open(a / "t-0" / "inner", dir_state=dirs.state(a))
    assert not dirs.is_online(a)


def test_a_log_alone_has_a_state_of_its_own(tmp_path: Path) -> None:
    one, other = PartitionLog.open(tmp_path / "t-0"), PartitionLog.open(tmp_path / "t-1")
    one.take_offline("injected")
    assert one.offline and not other.offline
    one.close()
    other.close()
