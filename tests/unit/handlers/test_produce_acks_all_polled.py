"""A cluster's acks=all produce answer is polled (handlers/produce.py ``_when_acked``):
no task of its own; the partition's notifications (``Appends.notify``: the high
watermark moved, the term ended) wake it, every time, until the write is committed;
a write the high watermark did not commit answers as ``wait_acked`` would."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from trio_broker.handlers.base import NOT_READY, Polled
from trio_broker.handlers.produce import answer_when_acked
from trio_broker.partition.append import Appended
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.replication.leader import AckState
from trio_broker.server.fetch_waits import FetchWaits

TOPIC = "t"


class Leaders:
    """The replica manager as the answer asks it: the write's commit state."""

    def __init__(self) -> None:
        self.state = AckState.WAITING
        self.asked = 0

    def commit_state(self, topic: str, partition: int, last_offset: int) -> AckState:
        self.asked += 1
        return self.state


def produce(leaders: Leaders, appends: FetchWaits) -> tuple[Polled, m.ProduceResponse]:
    services: Any = SimpleNamespace(
        config=SimpleNamespace(acks_all_fsync=False), leaders=leaders, appends=appends
    )
    Req, Resp = m.ProduceRequest, m.ProduceResponse
    part = Resp.TopicProduceResponse.PartitionProduceResponse(index=0, base_offset=7)
    response = Resp(responses=[Resp.TopicProduceResponse(name=TOPIC, partition_responses=[part])])
    request = Req(acks=-1, timeout_ms=30_000, topic_data=[])
    appended = Appended(None, TOPIC, 0, 7, 9, replicated=True)  # type: ignore[arg-type]
    answer = answer_when_acked(services, request, response, [(appended, part)])
    assert isinstance(answer, Polled)
    return answer, response


def test_every_notification_of_the_partition_wakes_it_until_committed() -> None:
    leaders, appends = Leaders(), FetchWaits()
    answer, response = produce(leaders, appends)
    wakes: list[None] = []
    unwatch = answer.watch(lambda: wakes.append(None))
    assert answer.poll() is NOT_READY
    # A follower's fetch that moved nothing committed, another partition's append:
    appends.notify(TOPIC, 0)
    appends.notify(TOPIC, 1)
    assert len(wakes) == 1
    assert answer.poll() is NOT_READY
    # The second follower's fetch moves the HW past the write: woken again (a watch
    # whose first change was never taken would not be).
    leaders.state = AckState.DONE
    appends.notify(TOPIC, 0)
    assert len(wakes) == 2
    assert answer.poll() is response
    assert response.responses[0].partition_responses[0].error_code == ErrorCode.NONE
    unwatch()
    assert appends.statistics().waiters == 0


@pytest.mark.parametrize(
    ("state", "error"),
    [
        (AckState.LEADERSHIP_LOST, ErrorCode.NOT_LEADER_OR_FOLLOWER),
        (AckState.NOT_ENOUGH_REPLICAS_AFTER_APPEND, ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND),
    ],
)
def test_a_write_not_committed_answers_its_error(state: AckState, error: ErrorCode) -> None:
    leaders, appends = Leaders(), FetchWaits()
    answer, response = produce(leaders, appends)
    answer.watch(lambda: None)
    assert answer.poll() is NOT_READY
    leaders.state = state
    appends.notify(TOPIC, 0)
    assert answer.poll() is response
    part = response.responses[0].partition_responses[0]
    assert (part.error_code, part.base_offset) == (error, -1)
