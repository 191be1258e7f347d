"""Catalogue: topics persisted atomically across restarts."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import pytest

from trio_broker.protocol.records import build_batch
from trio_broker.storage.catalogue import CATALOGUE_FILE, Catalogue, validate_topic_name
from trio_broker.storage.errors import (
    InvalidPartitionsError,
    InvalidTopicError,
    TopicExistsError,
    UnknownTopicError,
)
from trio_broker.storage.log import LogConfig, PartitionLog


def test_topics_survive_a_restart(tmp_path: Path) -> None:
    cat = Catalogue(tmp_path / "data")
    a = cat.create_topic("orders", 3, {"retention.ms": "1000"})
    b = cat.create_topic("audit.log_v2", 1)
    assert isinstance(a.topic_id, uuid.UUID) and a.topic_id != b.topic_id
    reopened = Catalogue(tmp_path / "data")
    assert reopened.topics() == [b, a]  # sorted by name
    assert reopened.get("orders") == a
    assert reopened.by_id(a.topic_id) == a
    assert "orders" in reopened and len(reopened) == 2
    assert reopened.get("orders").configs == {"retention.ms": "1000"}  # type: ignore[union-attr]
    assert reopened.partition_dir("orders", 2) == tmp_path / "data" / "orders-2"


def test_given_topic_id_is_kept(tmp_path: Path) -> None:
    topic_id = uuid.uuid4()
    cat = Catalogue(tmp_path)
    assert cat.create_topic("t", 1, topic_id=topic_id).topic_id == topic_id
    assert Catalogue(tmp_path).get("t").topic_id == topic_id  # type: ignore[union-attr]


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "a b", "ü", "x" * 250, "../etc"])
def test_illegal_names_are_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(InvalidTopicError):
        validate_topic_name(name)
    with pytest.raises(InvalidTopicError):
        Catalogue(tmp_path).create_topic(name, 1)
    assert not (tmp_path / CATALOGUE_FILE).exists()


def test_errors(tmp_path: Path) -> None:
    cat = Catalogue(tmp_path)
    cat.create_topic("t", 2)
    with pytest.raises(TopicExistsError):
        cat.create_topic("t", 1)
    with pytest.raises(InvalidPartitionsError):
        cat.create_topic("u", 0)
    with pytest.raises(UnknownTopicError):
        cat.delete_topic("nope")
    with pytest.raises(InvalidPartitionsError):
        cat.add_partitions("t", 2)
    with pytest.raises(UnknownTopicError):
        cat.set_configs("nope", {})


def test_add_partitions_and_set_configs(tmp_path: Path) -> None:
    cat = Catalogue(tmp_path)
    info = cat.create_topic("t", 1, {"a": "1"})
    grown = cat.add_partitions("t", 4)
    assert grown.partitions == 4 and grown.topic_id == info.topic_id
    assert cat.set_configs("t", {"b": "2"}).configs == {"b": "2"}
    again = Catalogue(tmp_path).get("t")
    assert again is not None and again.partitions == 4 and again.configs == {"b": "2"}


def test_delete_removes_the_partition_directories(tmp_path: Path) -> None:
    cat = Catalogue(tmp_path)
    cat.create_topic("t", 2)
    for p in range(2):
        log = PartitionLog.open(cat.partition_dir("t", p), LogConfig())
        log.append(build_batch([(None, b"x")], base_timestamp=0), now_ms=0)
        log.close()
    cat.delete_topic("t")
    assert sorted(os.listdir(tmp_path)) == [CATALOGUE_FILE]
    assert Catalogue(tmp_path).topics() == []


def test_a_recreated_topic_does_not_inherit_stale_data(tmp_path: Path) -> None:
    cat = Catalogue(tmp_path)
    # as if a delete crashed after writing the catalogue, before removing data
    stale = PartitionLog.open(cat.partition_dir("t", 0), LogConfig())
    stale.append(build_batch([(None, b"old")], base_timestamp=0), now_ms=0)
    stale.close()
    cat.create_topic("t", 1)
    fresh = PartitionLog.open(cat.partition_dir("t", 0), LogConfig())
    assert fresh.log_end_offset == 0
    fresh.close()


def test_leftover_delete_directories_are_removed_at_start(tmp_path: Path) -> None:
    leftover = tmp_path / f"t-0.{uuid.uuid4().hex}-delete"
    leftover.mkdir()
    (leftover / "00000000000000000000.log").write_bytes(b"x")
    keep = tmp_path / "t-delete-0"  # a topic that happens to be named 't-delete'
    keep.mkdir()
    Catalogue(tmp_path)
    assert not leftover.exists() and keep.exists()


def test_the_file_is_replaced_atomically(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cat = Catalogue(tmp_path)
    cat.create_topic("a", 1)
    before = (tmp_path / CATALOGUE_FILE).read_bytes()

    def crash(*args: object) -> None:
        raise OSError("crash before the rename")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError):
        cat.create_topic("b", 1)
    monkeypatch.undo()
    assert (tmp_path / CATALOGUE_FILE).read_bytes() == before
    assert [t.name for t in Catalogue(tmp_path).topics()] == ["a"]
    assert [t.name for t in cat.topics()] == ["a"]  # memory matches disk after a failure
    assert json.loads(before)["version"] == 1
