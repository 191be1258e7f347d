"""The topic catalogue: which topics exist, their ids, partition counts and configs.

One JSON file, ``<data_dir>/catalogue.json``, replaced atomically (temp file,
fsync, rename, fsync of the directory: :mod:`trio_broker.storage.durable`) on
every change, so a crash leaves the old or the new catalogue, never a torn one.
Partition data lives beside it in ``<data_dir>/<topic>-<partition>/`` as in Kafka.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from trio_broker.storage.durable import make_dirs_durable, rename_durably, write_file_atomically
from trio_broker.storage.errors import (
    InvalidPartitionsError,
    InvalidTopicError,
    TopicExistsError,
    UnknownTopicError,
)

CATALOGUE_FILE = "catalogue.json"
_FORMAT_VERSION = 1
MAX_TOPIC_NAME_LENGTH = 249  # Kafka's limit, which keeps "<topic>-<partition>" a legal file name
_LEGAL_NAME = re.compile(r"[a-zA-Z0-9._-]+")
_DELETED_DIR = re.compile(r".+-\d+\.[0-9a-f]{32}-delete")


def validate_topic_name(name: str) -> None:
    """Kafka's rules for topic names; they also make the name safe as a directory."""
    if not name or name in (".", ".."):
        raise InvalidTopicError(f"illegal topic name {name!r}")
    if len(name) > MAX_TOPIC_NAME_LENGTH:
        raise InvalidTopicError(f"topic name longer than {MAX_TOPIC_NAME_LENGTH} characters")
    if not _LEGAL_NAME.fullmatch(name):
        raise InvalidTopicError(
            f"topic name {name!r} may only hold ASCII letters, digits, '.', '_', '-'"
        )


@attrs.frozen
class TopicInfo:
    name: str
    topic_id: uuid.UUID
    partitions: int
    configs: dict[str, str] = attrs.field(factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "topic_id": str(self.topic_id),
            "partitions": self.partitions,
            "configs": dict(self.configs),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TopicInfo:
        return cls(
            name=str(data["name"]),
            topic_id=uuid.UUID(data["topic_id"]),
            partitions=int(data["partitions"]),
            configs={str(k): str(v) for k, v in data.get("configs", {}).items()},
        )


class Catalogue:
    """Topics persisted in ``data_dir``. Blocking file I/O on every change (rare)."""

    def __init__(self, data_dir: Path, log_dirs: Sequence[Path] = ()) -> None:
        self.data_dir = Path(data_dir)
        #: Every log dir (log.dirs; the first is ``data_dir``): a partition may be in any.
        self.log_dirs = [self.data_dir, *(Path(d) for d in log_dirs if Path(d) != self.data_dir)]
        self.path = self.data_dir / CATALOGUE_FILE
        make_dirs_durable(self.data_dir)
        self._topics: dict[str, TopicInfo] = {}
        self._load()
        self._remove_deleted_dirs()

    def _load(self) -> None:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return
        data = json.loads(raw)
        if data.get("version") != _FORMAT_VERSION:
            raise ValueError(f"{self.path}: unknown catalogue version {data.get('version')!r}")
        for entry in data["topics"]:
            info = TopicInfo.from_json(entry)
            self._topics[info.name] = info

    def _save(self, topics: dict[str, TopicInfo]) -> None:
        body = {
            "version": _FORMAT_VERSION,
            "topics": [topics[name].to_json() for name in sorted(topics)],
        }
        write_file_atomically(self.path, json.dumps(body, indent=1, sort_keys=True).encode())
        self._topics = topics

    # -- queries
    def topics(self) -> list[TopicInfo]:
        return [self._topics[name] for name in sorted(self._topics)]

    def get(self, name: str) -> TopicInfo | None:
        return self._topics.get(name)

    def by_id(self, topic_id: uuid.UUID) -> TopicInfo | None:
        return next((t for t in self._topics.values() if t.topic_id == topic_id), None)

    def __contains__(self, name: object) -> bool:
        return name in self._topics

    def __len__(self) -> int:
        return len(self._topics)

    def partition_dir(self, name: str, partition: int) -> Path:
        return self.data_dir / f"{name}-{partition}"

    # -- changes
    def create_topic(
        self,
        name: str,
        partitions: int,
        configs: Mapping[str, str] | None = None,
        *,
        topic_id: uuid.UUID | None = None,
    ) -> TopicInfo:
        validate_topic_name(name)
        if name in self._topics:
            raise TopicExistsError(f"topic {name!r} already exists")
        if partitions < 1:
            raise InvalidPartitionsError(f"a topic needs at least one partition, got {partitions}")
        if topic_id is None:
            topic_id = uuid.uuid4()
        info = TopicInfo(
            name, topic_id, partitions, {str(k): str(v) for k, v in (configs or {}).items()}
        )
        # Directories by this name can only be leftovers of a delete that crashed
        # before removing them; a new topic must not inherit their data.
        self._discard_dirs(name, range(partitions), topic_id)
        self._save({**self._topics, name: info})
        return info

    def delete_topic(self, name: str) -> TopicInfo:
        """Forget the topic, then remove its partition directories.

        Close its PartitionLogs first. A crash after the catalogue write leaves
        directories that the next ``create_topic`` of the name discards.
        """
        info = self._topics.get(name)
        if info is None:
            raise UnknownTopicError(f"unknown topic {name!r}")
        self._save({k: v for k, v in self._topics.items() if k != name})
        self._discard_dirs(name, range(info.partitions), info.topic_id)
        return info

    def add_partitions(
        self, name: str, total: int, *, prepare: Callable[[range], None] | None = None
    ) -> TopicInfo:
        """CreatePartitions: grow a topic to ``total`` partitions (never shrink).

        The catalogue write is the commit point. Before it, directories that
        already carry the new partitions' names (left by an attempt that crashed
        before its write, or by an old topic of this name) are discarded, and
        then ``prepare(new_partitions)`` may create the new logs. A crash or an
        error before the write leaves the old count, with at most directories
        beyond it that nothing reads and the next attempt discards; after the
        write, the new count (a restart creates any directory still missing).
        """
        info = self._require(name)
        if total <= info.partitions:
            raise InvalidPartitionsError(
                f"topic {name!r} has {info.partitions} partitions; {total} would not grow it"
            )
        added = range(info.partitions, total)
        self._discard_dirs(name, added, info.topic_id)
        new = attrs.evolve(info, partitions=total)
        try:
            if prepare is not None:
                prepare(added)
            self._save({**self._topics, name: new})
        except BaseException:
            # Not committed: leave no directory of the refused growth behind.
            with contextlib.suppress(OSError):
                self._discard_dirs(name, added, info.topic_id)
            raise
        return new

    def set_configs(self, name: str, configs: Mapping[str, str]) -> TopicInfo:
        """Replace the topic's config overrides."""
        info = self._require(name)
        new = attrs.evolve(info, configs={str(k): str(v) for k, v in configs.items()})
        self._save({**self._topics, name: new})
        return new

    def _require(self, name: str) -> TopicInfo:
        info = self._topics.get(name)
        if info is None:
            raise UnknownTopicError(f"unknown topic {name!r}")
        return info

    # -- directories
    def _discard_dirs(self, name: str, partitions: range, topic_id: uuid.UUID) -> None:
        moves = []
        for partition in partitions:
            for log_dir in self.log_dirs:
                path = log_dir / f"{name}-{partition}"
                if not path.exists():
                    continue
                # Rename first (one durable step), remove at leisure: a crash
                # mid-removal leaves a '-delete' directory, never half a log.
                moves.append((path, path.with_name(f"{path.name}.{topic_id.hex}-delete")))
        # One directory fsync for all of them; the removals need none: a '-delete'
        # directory that comes back after a crash is removed at the next start.
        rename_durably(moves)
        for _, target in moves:
            shutil.rmtree(target, ignore_errors=True)

    def _remove_deleted_dirs(self) -> None:
        for log_dir in self.log_dirs:
            if not log_dir.is_dir():
                continue
            for path in log_dir.iterdir():
                if path.is_dir() and _DELETED_DIR.fullmatch(path.name):
                    shutil.rmtree(path, ignore_errors=True)
