"""Several log dirs (storage/log_dirs.py, services/topics.py): placement, duplicates,
and a partition move that a kill -9 at any step leaves as exactly one whole copy."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from trio_broker.config import ConfigError, ensure_cluster_id
from trio_broker.protocol.records import build_batch
from trio_broker.services.topics import TopicManager
from trio_broker.storage.log import LogConfig, PartitionLog
from trio_broker.storage.log_dirs import STEPS, DuplicateLogDirs, move_partition, recover_moves


def batch(tag: int) -> bytearray:
    return build_batch([(b"k", bytes([tag]) * 20)], base_timestamp=1_000)


def manager(dirs: list[Path]) -> TopicManager:
    return TopicManager(dirs[0], LogConfig(), lambda: 1_000, dirs[1:])


def where(tm: TopicManager, topic: str) -> list[Path | None]:
    return [tm.log_dir_of(log) for log in tm.topics[topic].logs]


def test_new_partitions_go_to_the_dir_with_the_fewest(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    tm = manager([a, b])
    tm.create("t", 3)  # a, b, a: each next one to the emptier dir, the first on a tie
    assert where(tm, "t") == [a, b, a]
    tm.create("u", 1)
    assert where(tm, "u") == [b]
    tm.add_partitions("u", 3)
    assert sorted(str(d) for d in where(tm, "u")[1:]) == [str(a), str(b)]
    tm.close()
    # Reopened, each partition is found where it is (not placed again).
    again = manager([a, b])
    assert where(again, "t") == [a, b, a]
    again.delete("t")
    assert not any((d / f"t-{p}").exists() for d in (a, b) for p in range(3))
    again.close()


def test_a_partition_in_two_dirs_is_refused_at_start(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    tm = manager([a, b])
    tm.create("t", 1)
    tm.close()
    (b / "t-0").mkdir(parents=True)
    with pytest.raises(DuplicateLogDirs, match="t-0"):
        manager([a, b])


def test_a_moved_partition_keeps_its_records_and_takes_appends(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    tm = manager([a, b])
    tm.create("t", 1)
    for i in range(5):
        tm.topics["t"].logs[0].append(batch(i), now_ms=1_000)
    moved = tm.move_partition("t", 0, b)
    assert tm.log_dir_of(moved) == b and not (a / "t-0").exists()
    assert moved.log_end_offset == 5
    moved.append(batch(9), now_ms=1_000)
    tm.close()
    again = manager([a, b])
    assert where(again, "t") == [b] and again.topics["t"].logs[0].log_end_offset == 6
    again.close()


def test_a_moved_partition_is_taken_again_on_its_new_log(tmp_path: Path) -> None:
    """The topic's Partition of a moved partition held the closed log: it goes with
    the move, and the replication takes one on the log in its new place at once (no
    lookup makes one)."""
    from trio_broker.services.local_replication import LocalReplication
    from trio_broker.services.producers import ProducerStateRegistry

    a, b = tmp_path / "a", tmp_path / "b"
    tm = manager([a, b])
    topic = tm.create("t", 1)
    producers = ProducerStateRegistry(None, lambda: 0)
    leaders = LocalReplication.over(tm, producers=producers)
    before = topic.leading(0)
    moved = tm.move_partition("t", 0, b)
    after = topic.leading(0)
    assert after is not before and after.log is moved and after.term.high_watermark == 0
    assert leaders.leader_term("t", 0) is after.term
    tm.close()


_MOVER = """
import os, signal, sys
from pathlib import Path
from trio_broker.storage.log_dirs import move_partition
def step(name):
    if name == sys.argv[3]:
        os.kill(os.getpid(), signal.SIGKILL)
move_partition(Path(sys.argv[1]), Path(sys.argv[2]), step=step)
"""


def snapshot(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


@pytest.mark.parametrize("killed_after", STEPS)
def test_a_move_killed_at_any_step_recovers_to_exactly_one_whole_copy(
    tmp_path: Path, killed_after: str
) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    b.mkdir()
    log = PartitionLog.open(a / "t-0", LogConfig())
    for i in range(20):
        log.append(batch(i), now_ms=1_000)
    log.close()
    before = snapshot(a / "t-0")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    child = subprocess.run(
        [sys.executable, "-c", _MOVER, str(a / "t-0"), str(b), killed_after],
        env=env, capture_output=True, timeout=120,
    )  # fmt: skip
    assert child.returncode == -9, child.stderr.decode()
    recover_moves([a, b])
    copies = [d / "t-0" for d in (a, b) if (d / "t-0").exists()]
    assert len(copies) == 1
    # Until the copy is complete the source stays; from then on the move finishes.
    assert copies[0].parent == (a if killed_after == "copied" else b)
    assert snapshot(copies[0]) == before
    assert sorted(os.listdir(a) + os.listdir(b)) == ["t-0"]  # no leftovers
    reopened = PartitionLog.open(copies[0], LogConfig())
    assert reopened.log_end_offset == 20
    reopened.close()


def test_moving_into_the_same_name_twice_is_not_possible(tmp_path: Path) -> None:
    """A move never overwrites: the destination may not hold the partition already."""
    a, b = tmp_path / "a", tmp_path / "b"
    (a / "t-0").mkdir(parents=True)
    (b / "t-0").mkdir(parents=True)
    with pytest.raises(OSError):
        move_partition(a / "t-0", b)


def test_each_dir_has_the_clusters_id_and_dirs_of_two_clusters_are_refused(
    tmp_path: Path,
) -> None:
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    cluster_id = ensure_cluster_id(a, None)
    assert ensure_cluster_id(a, None, (b,)) == cluster_id  # b gets a's id, as in Kafka
    assert f"cluster.id={cluster_id}" in (b / "meta.properties").read_text()
    ensure_cluster_id(c, None)  # another cluster's dir
    with pytest.raises(ConfigError, match="different clusters"):
        ensure_cluster_id(a, None, (b, c))
