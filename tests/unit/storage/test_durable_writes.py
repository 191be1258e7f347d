"""Every file and directory the broker relies on after a restart survives a power cut.

The rule checked here is LazyFS's (and POSIX's, strictly read): after a power cut
a file holds only the data it had at its last ``fsync``/``fdatasync``, and a
directory lists only the entries it had at its own last ``fsync``. A created,
renamed or removed entry is therefore durable only once its parent directory was
fsynced afterwards.

:class:`~tests.powerloss.PowerCut` (shared with the storage state machine) is an
independent recorder: it wraps ``os.fsync`` and ``os.fdatasync`` and, at each
call, reads back from the real file system what that call made durable (the
file's bytes, or the directory's listing), and notices inode creation. It knows
nothing of the broker's helpers: what survives is computed from the calls alone.
A cut is simulated by building, in a fresh directory, the tree that would be
left; the code under test is then run again on that tree, as a restarted broker
would.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from tests.powerloss import PowerCut
from trio_broker.config import BrokerConfig, ensure_cluster_id
from trio_broker.groups.offsets_store import (
    OFFSETS_LOG_NAME,
    OffsetAndMetadata,
    OffsetKey,
    OffsetsStore,
)
from trio_broker.protocol.records import build_batch
from trio_broker.security.acl import AclBinding, Operation, PatternType, Permission, ResourceType
from trio_broker.security.acl_store import AclStore
from trio_broker.security.credentials import CREDENTIALS_FILE, CredentialStore
from trio_broker.server.broker import Broker
from trio_broker.services.producers import (
    PRODUCER_ID_FILE,
    ProducerIdAllocator,
    ProducerStateRegistry,
)
from trio_broker.services.quotas import QuotaService
from trio_broker.services.topics import TopicManager
from trio_broker.state.quota import parse_entity
from trio_broker.storage.catalogue import CATALOGUE_FILE, Catalogue
from trio_broker.storage.errors import OffsetOutOfRange
from trio_broker.storage.log import (
    CLEAN_SHUTDOWN_MARKER,
    LOG_START_CHECKPOINT,
    RECOVERY_POINT_CHECKPOINT,
    LogConfig,
    PartitionLog,
)
from trio_broker.storage.log_snapshots import snapshot_path


@pytest.fixture
def cut(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> PowerCut:
    return PowerCut(tmp_path / "disk", monkeypatch)


def batch(tag: int = 0, n: int = 2) -> bytearray:
    return build_batch([(b"k", bytes([tag]) * 30)] * n, base_timestamp=1_000)


def read_all(log: PartitionLog) -> bytes:
    regions = log.read(log.log_start_offset, 1 << 20, log.log_end_offset)
    return b"".join(r.read_bytes() for r in regions)


# ---------------------------------------------------------------- the recorder itself


def test_recorder_keeps_only_what_was_synced(cut: PowerCut) -> None:
    root = cut.root
    (root / "unsynced").write_bytes(b"lost")
    fd = os.open(root / "synced", os.O_WRONLY | os.O_CREAT, 0o644)
    os.write(fd, b"kept")
    os.fsync(fd)
    os.write(fd, b" and lost")
    os.close(fd)
    os.mkdir(root / "sub")
    (root / "sub" / "inner").write_bytes(b"x")
    dfd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    os.fsync(dfd)
    os.close(dfd)
    # The dir entries of the root are durable; "sub"'s own entry list and the
    # unsynced file's data are not.
    assert cut.survivors() == {"sub": None, "synced": b"kept", "unsynced": b""}
    os.unlink(root / "synced")
    assert cut.survivors()["synced"] == b"kept"  # the unlink is not durable yet
    assert [len(cut.survivors(i)) for i in range(len(cut.events) + 1)] == [0, 0, 3]


# ---------------------------------------------------------------- defect 1: the cluster id


def test_cluster_id_survives_a_power_cut_in_a_fresh_data_dir(cut: PowerCut) -> None:
    first = ensure_cluster_id(cut.root / "data", None)
    after = cut.power_cut()
    assert (after / "data" / "meta.properties").read_text().startswith(f"cluster.id={first}\n")
    assert ensure_cluster_id(after / "data", None) == first


def test_cluster_id_is_stable_across_many_cuts_and_never_half_written(cut: PowerCut) -> None:
    (cut.root / "data").mkdir()
    cut.settle()  # the data dir itself is durable: this checks the file alone
    first = ensure_cluster_id(cut.root / "data", None)
    for state in cut.every_cut():
        meta = state / "data" / "meta.properties"
        # Before the write is durable the file is absent, never there but empty.
        assert not meta.exists() or meta.read_text().startswith(f"cluster.id={first}\n")
    ids = set()
    for _ in range(5):  # restart after restart, each ended by a power cut
        ids.add(ensure_cluster_id(cut.root / "data", None))
        cut.power_cut()
    assert ids == {first}


# ---------------------------------------------------------------- defect 2: a fresh data dir


def test_fresh_broker_data_dir_and_acknowledged_records_survive_a_power_cut(
    cut: PowerCut,
) -> None:
    broker = Broker(BrokerConfig(port=0, data_dir=cut.root / "data"))
    broker.topics.create("t", 1)
    log = broker.topics.log("t", 0)
    log.append(batch(1), now_ms=1_000)
    log.flush()  # what acks=all waits for (the flusher's group commit)
    acknowledged = read_all(log)
    for each in broker.topics.all_logs():
        each.abort()  # the power went: nothing more reaches the disk

    after = cut.power_cut()
    assert sorted(os.listdir(after)) == ["data"]
    assert (after / "data" / "t-0").is_dir()
    again = Broker(BrokerConfig(port=0, data_dir=after / "data"))
    try:
        assert again.cluster_id == broker.cluster_id
        recovered = again.topics.log("t", 0)
        assert recovered is not None
        assert recovered.log_end_offset == 2
        assert read_all(recovered) == acknowledged
    finally:
        again.topics.close()


def test_broker_makes_an_existing_but_unsynced_data_dir_durable(cut: PowerCut) -> None:
    # An earlier run made the directory and died before syncing its parent.
    (cut.root / "data").mkdir()
    broker = Broker(BrokerConfig(port=0, data_dir=cut.root / "data"))
    broker.topics.close()
    after = cut.power_cut()
    assert (after / "data" / "meta.properties").exists()
    assert ensure_cluster_id(after / "data", None) == broker.cluster_id


def test_nested_missing_directories_are_each_made_durable(cut: PowerCut) -> None:
    log = PartitionLog.open(cut.root / "a" / "b" / "t-0")
    log.close()
    after = cut.power_cut()
    assert (after / "a" / "b" / "t-0").is_dir()


def test_make_dirs_durable_syncs_each_created_level(cut: PowerCut) -> None:
    from trio_broker.storage.durable import make_dirs_durable

    (cut.root / "x").mkdir()
    cut.settle()
    assert make_dirs_durable(cut.root / "x" / "y" / "z") is True
    assert make_dirs_durable(cut.root / "x" / "y" / "z") is False
    after = cut.power_cut()
    assert (after / "x" / "y" / "z").is_dir()


# ---------------------------------------------------------------- the topic catalogue


def test_catalogue_changes_survive_a_power_cut_whole_or_not_at_all(cut: PowerCut) -> None:
    catalogue = Catalogue(cut.root / "data")
    created = catalogue.create_topic("t", 2, {"retention.ms": "1000"})
    after = cut.power_cut()
    reloaded = Catalogue(after / "data")
    assert reloaded.get("t") == created

    reloaded.set_configs("t", {"retention.ms": "2000"})
    for state in cut.every_cut():
        info = Catalogue(state / "data").get("t")  # never a torn file
        assert info is not None and info.configs["retention.ms"] in ("1000", "2000")
    assert Catalogue(cut.power_cut() / "data").get("t").configs == {"retention.ms": "2000"}  # type: ignore[union-attr]


def test_topic_creation_and_deletion_survive_a_power_cut(cut: PowerCut) -> None:
    topics = TopicManager(cut.root / "data", LogConfig(), lambda: 1_000)
    topics.create("t", 2, {"retention.ms": "60000"})
    log = topics.log("t", 0)
    log.append(batch(1), now_ms=1_000)
    log.flush()
    for each in topics.all_logs():
        each.abort()

    after = cut.power_cut()
    assert {"t-0", "t-1", CATALOGUE_FILE} <= set(os.listdir(after / "data"))
    topics = TopicManager(after / "data", LogConfig(), lambda: 1_000)
    assert topics.get("t").info.configs == {"retention.ms": "60000"}  # type: ignore[union-attr]
    assert topics.log("t", 0).log_end_offset == 2
    topics.delete("t")
    # Wherever the cut falls, the restarted broker has the topic with its data or
    # none at all, and a new topic of the same name starts empty.
    for state in cut.every_cut():
        again = TopicManager(state / "data", LogConfig(), lambda: 1_000)
        existing = again.get("t")
        if existing is not None:
            assert again.log("t", 0).log_end_offset == 2
        else:
            assert again.create("t", 1).logs[0].log_end_offset == 0
        again.close()
    final = TopicManager(cut.power_cut() / "data", LogConfig(), lambda: 1_000)
    assert final.get("t") is None
    final.close()


def test_partition_growth_survives_a_power_cut_as_old_or_new_count(cut: PowerCut) -> None:
    topics = TopicManager(cut.root / "data", LogConfig(), lambda: 1_000)
    topics.create("t", 1)
    log = topics.log("t", 0)
    log.append(batch(1), now_ms=1_000)
    log.flush()
    start = len(cut.events)
    topics.add_partitions("t", 3)
    new_log = topics.log("t", 2)
    new_log.append(batch(2), now_ms=1_000)
    new_log.flush()  # acknowledged: on disk with its directory
    counts = set()
    # Wherever the cut falls during the growth, the restarted broker finds the old
    # count or the new one, every listed partition opens and takes appends, and
    # partition 0's acknowledged records are intact.
    for state in cut.every_cut(start):
        again = TopicManager(state / "data", LogConfig(), lambda: 1_000)
        topic = again.get("t")
        assert topic is not None
        counts.add(len(topic.logs))
        assert len(topic.logs) in (1, 3)
        assert read_all(again.log("t", 0)) == bytes(batch(1))
        for each in topic.logs:
            each.append(batch(9), now_ms=1_000)
        if len(topic.logs) == 1:  # the growth can be asked for again and succeeds
            again.add_partitions("t", 3)
            assert [each.log_end_offset for each in again.get("t").logs[1:]] == [0, 0]  # type: ignore[union-attr]
        again.close()
    assert counts == {1, 3}
    final = TopicManager(cut.power_cut() / "data", LogConfig(), lambda: 1_000)
    assert len(final.get("t").logs) == 3  # type: ignore[union-attr]
    assert final.log("t", 2).log_end_offset == 2
    final.close()


# ---------------------------------------------------------------- ACLs, credentials, quotas


def test_acl_store_survives_a_power_cut(cut: PowerCut) -> None:
    (cut.root / "data").mkdir()
    cut.settle()
    binding = AclBinding(
        ResourceType.TOPIC, "t", PatternType.LITERAL, "User:alice", "*",
        Operation.READ, Permission.ALLOW,
    )  # fmt: skip
    AclStore(cut.root / "data").add([binding])
    for state in cut.every_cut():
        assert AclStore(state / "data").bindings() in ([], [binding])
    assert AclStore(cut.power_cut() / "data").bindings() == [binding]


def test_credentials_survive_a_power_cut_with_their_mode(cut: PowerCut) -> None:
    store = CredentialStore.in_data_dir(cut.root / "data")  # the data dir does not exist yet
    store.add("alice", "SCRAM-SHA-256", "secret")
    assert stat.S_IMODE(os.stat(cut.root / "data" / CREDENTIALS_FILE).st_mode) == 0o600
    credential = store.lookup("alice", "SCRAM-SHA-256")
    after = cut.power_cut()
    assert CredentialStore.in_data_dir(after / "data").lookup("alice", "SCRAM-SHA-256") == (
        credential
    )
    store = CredentialStore.in_data_dir(after / "data")
    store.delete("alice")
    for state in cut.every_cut():
        found = CredentialStore.in_data_dir(state / "data").lookup("alice", "SCRAM-SHA-256")
        assert found in (None, credential)
    assert CredentialStore.in_data_dir(cut.power_cut() / "data").users() == {}


def test_client_quotas_survive_a_power_cut(cut: PowerCut) -> None:
    (cut.root / "data").mkdir()
    cut.settle()

    def service(data_dir: Path) -> QuotaService:
        return QuotaService(BrokerConfig(data_dir=data_dir))

    entity = parse_entity("client-id=bench")
    service(cut.root / "data").alter([(entity, "producer_byte_rate", 1024.0)])
    after = cut.power_cut()
    assert service(after / "data").table.dynamic == {entity: {"producer_byte_rate": 1024.0}}


# ---------------------------------------------------------------- producer state


def test_producer_id_blocks_are_never_reissued_after_a_power_cut(cut: PowerCut) -> None:
    (cut.root / "data").mkdir()
    cut.settle()
    issued = [ProducerIdAllocator(cut.root / "data" / PRODUCER_ID_FILE, 10).allocate()]
    for _ in range(3):
        after = cut.power_cut()
        issued.append(ProducerIdAllocator(after / "data" / PRODUCER_ID_FILE, 10).allocate())
    assert len(set(issued)) == len(issued), issued


def test_producer_state_snapshot_survives_a_power_cut(cut: PowerCut) -> None:
    data = cut.root / "data"
    log = PartitionLog.open(data / "t-0")
    log.append(batch(1), now_ms=1_000)
    log.flush()
    registry = ProducerStateRegistry(data, lambda: 1_000)
    registry.manager("t", 0, log).append(7, 0, 0, 1, 0, 1, 1_000)
    end = log.log_end_offset
    snapshot = registry._partitions["t", 0].manager.to_snapshot(next_offset=end)
    registry.close()
    log.abort()
    after = cut.power_cut()
    assert snapshot_path(after / "data" / "t-0", end).read_bytes() == snapshot
    recovered = PartitionLog.open(after / "data" / "t-0")
    try:
        manager = ProducerStateRegistry(after / "data", lambda: 1_000).manager("t", 0, recovered)
        assert 7 in manager.producers  # only the snapshot knew producer 7
    finally:
        recovered.close()


# ---------------------------------------------------------------- checkpoints and the log


SMALL = LogConfig(segment_bytes=400, index_interval_bytes=64, retention_ms=None)


def test_log_start_checkpoint_survives_and_retention_recovers_either_way(cut: PowerCut) -> None:
    log = PartitionLog.open(cut.root / "t-0", SMALL)
    for i in range(12):
        log.append(batch(i), now_ms=1_000 + i)
    log.flush()
    flushed = len(cut.events)
    assert len(log.segment_base_offsets()) > 3
    log.delete_records(10)
    assert log.apply_retention(2_000) > 0  # removes the segments below offset 10
    kept = read_all(log)
    # Retention does not sync the directory after its unlinks: whether a cut keeps
    # the files or not, the log restarts at the checkpointed start (or at 0, with
    # every segment, if the checkpoint did not make it either).
    for state in cut.every_cut(flushed):
        reopened = PartitionLog.open(state / "t-0", SMALL)
        try:
            assert reopened.log_start_offset in (0, 10)
            assert reopened.log_end_offset == 24
        finally:
            reopened.abort()
    after = cut.snapshot()
    assert (after / "t-0" / LOG_START_CHECKPOINT).read_bytes() == b"10\n"
    # Now the case where a later directory sync (any flush) made the unlinks durable.
    dfd = os.open(cut.root / "t-0", os.O_RDONLY | os.O_DIRECTORY)
    os.fsync(dfd)
    os.close(dfd)
    log.abort()
    for state in (after, cut.power_cut()):
        reopened = PartitionLog.open(state / "t-0", SMALL)
        try:
            assert reopened.log_start_offset == 10
            with pytest.raises(OffsetOutOfRange):
                reopened.read(9, 1 << 20, 24)
            assert read_all(reopened) == kept
        finally:
            reopened.close()


def test_recovery_point_checkpoint_survives_a_power_cut(cut: PowerCut) -> None:
    log = PartitionLog.open(cut.root / "t-0", SMALL)
    for i in range(12):
        log.append(batch(i), now_ms=1_000 + i)
    log.flush()
    point = (cut.root / "t-0" / RECOVERY_POINT_CHECKPOINT).read_bytes()
    assert int(point) > 0
    log.abort()
    after = cut.power_cut()
    assert (after / "t-0" / RECOVERY_POINT_CHECKPOINT).read_bytes() == point
    reopened = PartitionLog.open(after / "t-0", SMALL)
    try:
        assert reopened.log_end_offset == 24
        assert reopened.recovery.segments_scanned < len(reopened.segment_base_offsets())
    finally:
        reopened.close()


def test_clean_shutdown_marker_is_durable(cut: PowerCut) -> None:
    log = PartitionLog.open(cut.root / "t-0", SMALL)
    for i in range(12):
        log.append(batch(i), now_ms=1_000 + i)
    log.close()
    marker = (cut.root / "t-0" / CLEAN_SHUTDOWN_MARKER).read_bytes()
    after = cut.power_cut()
    assert (after / "t-0" / CLEAN_SHUTDOWN_MARKER).read_bytes() == marker
    reopened = PartitionLog.open(after / "t-0", SMALL)
    try:
        assert reopened.recovery.clean
        assert reopened.log_end_offset == 24
    finally:
        reopened.close()


# ---------------------------------------------------------------- committed offsets


def test_committed_offsets_log_survives_a_power_cut_in_a_fresh_data_dir(cut: PowerCut) -> None:
    store = OffsetsStore.open(cut.root / "data", LogConfig())
    key = OffsetKey("g", "t", 0)
    write = store.append([(key, OffsetAndMetadata(42, metadata="m"))], now_ms=1_000)
    store.log.flush()  # OffsetCommit answers only after this (wait_offsets_durable)
    store.apply(write)
    store.log.abort()
    after = cut.power_cut()
    assert (after / "data" / OFFSETS_LOG_NAME).is_dir()
    again = OffsetsStore.open(after / "data", LogConfig())
    try:
        assert again.get("g", "t", 0) == OffsetAndMetadata(42, metadata="m")
    finally:
        again.close()


# ---------------------------------------------------------------- capture files


def test_capture_files_are_published_durably(cut: PowerCut) -> None:
    pytest.importorskip("pyarrow")
    from trio_broker.capture.writer import ParquetRotator

    rotator = ParquetRotator(cut.root / "capture" / "nested", 0)
    rotator.write_stats(captured=1)
    after = cut.power_cut()
    (stats,) = list((after / "capture" / "nested").glob("*.stats.json"))
    assert json.loads(stats.read_text()) == {"rows_written": 0, "captured": 1}


# ---------------------------------------------------------------- one helper, used everywhere


def test_no_module_writes_broker_state_its_own_way() -> None:
    """Crash-safe writes go through trio_broker.storage.durable, nowhere else."""
    package = Path(__file__).resolve().parents[3] / "trio_broker"
    allowed = {
        "storage/durable.py",  # the helper
        # TLS material written to a private temp file for ssl to load, never re-read.
        "security/pem.py",
        # A private ZooKeeper's zoo.cfg and data dir, written afresh at every start.
        "cluster/local_zookeeper.py",
        # trio-broker cluster up: a local test cluster's config files, rewritten at start.
        "admin/cluster_up.py",
        # The pytest plugin: the scratch dir of the broker a test session starts.
        "testing/pytest_plugin.py",
    }
    offenders = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package).as_posix()
        if rel in allowed or rel.startswith("verify/"):
            continue
        text = path.read_text()
        for needle in ("os.replace(", "os.rename(", ".write_text(", ".write_bytes(", ".mkdir("):
            if needle in text:
                offenders.append(f"{rel}: {needle}")
    assert offenders == []
