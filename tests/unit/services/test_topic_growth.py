"""TopicManager.add_partitions: the growth is all or nothing, in memory and on disk.

A failure while creating a new partition's log, or while writing the catalogue
that commits the growth, leaves the topic at its old count here and after a
restart, with no directory of the refused partitions left behind; the growth
can then be asked for again.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.protocol.records import build_batch
from trio_broker.services import topics as topics_module
from trio_broker.services.topics import TopicError, TopicManager
from trio_broker.storage import catalogue as catalogue_module
from trio_broker.storage.errors import StorageError
from trio_broker.storage.log import LogConfig, PartitionLog


def manager(data: Path) -> TopicManager:
    return TopicManager(data, LogConfig(), lambda: 1_000)


def partition_dirs(data: Path) -> list[str]:
    return sorted(n for n in os.listdir(data) if n.startswith("t-"))


@pytest.fixture
def grown_once(tmp_path: Path) -> TopicManager:
    topics = manager(tmp_path / "data")
    topics.create("t", 1)
    topics.log("t", 0).append(build_batch([(None, b"kept")]), now_ms=1_000)
    return topics


def test_growth_opens_new_empty_logs_and_keeps_the_old(grown_once: TopicManager) -> None:
    old_list = grown_once.get("t").logs  # type: ignore[union-attr]
    topic = grown_once.add_partitions("t", 3)
    assert len(topic.logs) == 3 and topic.info.partitions == 3
    assert old_list is not topic.logs and len(old_list) == 1  # replaced, not mutated
    assert [log.log_end_offset for log in topic.logs] == [1, 0, 0]
    assert partition_dirs(grown_once.data_dir) == ["t-0", "t-1", "t-2"]  # type: ignore[arg-type]


@pytest.mark.parametrize("failing", ["second new log", "catalogue write"])
def test_a_failed_growth_leaves_the_old_count_everywhere(
    grown_once: TopicManager, monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    data = grown_once.data_dir
    assert data is not None
    opened: list[Any] = []
    real_open = PartitionLog.open

    def open_log(directory: Path, *args: Any, **kwargs: Any) -> PartitionLog:
        if failing == "second new log" and Path(directory).name == "t-2":
            raise StorageError(f"cannot open log {directory}: disk on fire")
        log = real_open(directory, *args, **kwargs)
        opened.append(log)
        return log

    def refuse_write(*args: Any, **kwargs: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(topics_module.PartitionLog, "open", open_log)
    if failing == "catalogue write":
        monkeypatch.setattr(catalogue_module, "write_file_atomically", refuse_write)
    with pytest.raises((StorageError, OSError)):
        grown_once.add_partitions("t", 3)
    monkeypatch.undo()

    topic = grown_once.get("t")
    assert topic is not None and len(topic.logs) == 1 and topic.info.partitions == 1
    assert partition_dirs(data) == ["t-0"]  # nothing of the refused partitions is left
    assert all(log.closed for log in opened)  # the new logs' files were released
    assert not any(n.endswith("-delete") for n in os.listdir(data))
    grown_once.close()
    again = manager(data)
    assert len(again.get("t").logs) == 1  # type: ignore[union-attr]
    assert again.log("t", 0).log_end_offset == 1
    assert len(again.add_partitions("t", 3).logs) == 3  # and it can be asked for again
    again.close()


def test_refusals_name_the_kafka_error(grown_once: TopicManager) -> None:
    for name, count, code in [
        ("nope", 2, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
        ("t", 1, ErrorCode.INVALID_PARTITIONS),
        ("t", 0, ErrorCode.INVALID_PARTITIONS),
        ("t", topics_module.MAX_PARTITIONS + 1, ErrorCode.INVALID_PARTITIONS),
    ]:
        with pytest.raises(TopicError) as raised:
            grown_once.add_partitions(name, count)
        assert raised.value.error_code == code, (name, count)
    assert len(grown_once.get("t").logs) == 1  # type: ignore[union-attr]


def test_memory_mode_grows_in_memory() -> None:
    topics = TopicManager(None, LogConfig(), lambda: 1_000)
    topics.create("t", 2)
    topic = topics.add_partitions("t", 5)
    assert len(topic.logs) == 5 and topic.info.partitions == 5
    topic.logs[4].append(build_batch([(None, b"x")]), now_ms=1_000)
    assert topic.logs[4].log_end_offset == 1
