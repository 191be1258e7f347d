"""When a fetch answers at once instead of waiting (handlers/fetch.py answers_at_once).

As Kafka: KafkaApis answers the errors found before a read (NOT_READ) itself, and
ReplicaManager.fetchMessages answers at once when a partition it read failed, or when
it has no partition left to read.
"""

from __future__ import annotations

from trio_broker.handlers.fetch import PartResp, Resp, TopicResp, answers_at_once
from trio_broker.protocol.error_codes import ErrorCode as E


def test_a_fetch_answers_at_once_on_a_failed_read_not_on_a_failure_before_it() -> None:
    def fetch_answer(*codes: int) -> Resp:
        parts = [PartResp(partition_index=i, error_code=c) for i, c in enumerate(codes)]
        return Resp(responses=[TopicResp(topic="t", partitions=parts)])

    for read_error in (E.NOT_LEADER_OR_FOLLOWER, E.LEADER_NOT_AVAILABLE, E.FENCED_LEADER_EPOCH,
                       E.UNKNOWN_LEADER_EPOCH, E.OFFSET_OUT_OF_RANGE, E.KAFKA_STORAGE_ERROR):  # fmt: skip
        assert answers_at_once(fetch_answer(E.NONE, read_error)), read_error
    for before_read in (E.TOPIC_AUTHORIZATION_FAILED, E.UNKNOWN_TOPIC_ID,
                        E.UNKNOWN_TOPIC_OR_PARTITION):  # fmt: skip
        assert not answers_at_once(fetch_answer(E.NONE, before_read)), before_read
        assert answers_at_once(fetch_answer(before_read))  # nothing left to wait on
    assert not answers_at_once(fetch_answer(E.NONE))
    assert answers_at_once(fetch_answer())  # no partition at all
