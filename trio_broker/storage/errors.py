"""The storage layer's exception family.

Each class names the Kafka error code a handler should answer with, so the
mapping from a storage failure to the wire lives in one place.
"""

from __future__ import annotations

from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.protocol.errors import KafkaError


class LogError(KafkaError):
    """Base class of every error the storage layer raises on purpose."""

    error_code: ErrorCode = ErrorCode.UNKNOWN_SERVER_ERROR


class StorageError(LogError):
    """The disk failed (ENOSPC, EIO, ...) or the partition is offline because it did.

    Once raised for a partition, that partition stays offline until it is reopened:
    after a failed write or fsync we can no longer tell what reached the disk.
    """

    error_code = ErrorCode.KAFKA_STORAGE_ERROR


class OffsetOutOfRange(LogError):
    """A fetch or DeleteRecords offset outside [log start offset, log end offset]."""

    error_code = ErrorCode.OFFSET_OUT_OF_RANGE

    def __init__(self, offset: int, log_start_offset: int, log_end_offset: int) -> None:
        super().__init__(f"offset {offset} is outside [{log_start_offset}, {log_end_offset}]")
        self.offset = offset
        self.log_start_offset = log_start_offset
        self.log_end_offset = log_end_offset


class InvalidConfigError(LogError):
    """A topic config Kafka would refuse: unknown key, malformed or out-of-range value."""

    error_code = ErrorCode.INVALID_CONFIG


class InvalidTopicError(LogError):
    """A topic name that Kafka would refuse (and that must not become a directory name)."""

    error_code = ErrorCode.INVALID_TOPIC_EXCEPTION


class TopicExistsError(LogError):
    """CreateTopics for a name the catalogue already holds."""

    error_code = ErrorCode.TOPIC_ALREADY_EXISTS


class UnknownTopicError(LogError):
    """A topic the catalogue does not hold."""

    error_code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


class InvalidPartitionsError(LogError):
    """A partition count below 1, or a CreatePartitions that would shrink a topic."""

    error_code = ErrorCode.INVALID_PARTITIONS


class InvalidReplicatedBatch(LogError):
    """A batch fetched from a leader that cannot be stored as it is: a bad header or
    CRC, or a leader epoch older than one the log already holds."""

    error_code = ErrorCode.CORRUPT_MESSAGE


class UnexpectedAppendOffset(InvalidReplicatedBatch):
    """A fetched batch does not start at this log's end offset: the follower and its
    leader disagree on where the log is (truncate first, or fetch from the log end)."""

    error_code = ErrorCode.UNKNOWN_SERVER_ERROR

    def __init__(self, base_offset: int, log_end_offset: int) -> None:
        super().__init__(
            f"fetched batch starts at offset {base_offset} but the log ends at {log_end_offset}"
        )
        self.base_offset = base_offset
        self.log_end_offset = log_end_offset
