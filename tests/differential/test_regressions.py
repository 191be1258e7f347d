"""Regression tests for incompatibilities the differential harness found (trio-broker only).

Each test pins Kafka 4.4's answer, as measured by ``test_against_kafka.py``, so that it
runs without Java: one ``trio-broker serve`` subprocess for the module.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.differential.conftest import start_trio
from tests.differential.harness import (
    Broker,
    CreateTopic,
    Fetch,
    IdempotentProduce,
    InitProducer,
    Session,
)
from tests.e2e.conftest import BrokerProcess
from trio_broker.protocol.records import build_batch

OFFSET_OUT_OF_RANGE = 1
OUT_OF_ORDER_SEQUENCE_NUMBER = 45


@pytest.fixture(scope="module")
def trio_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    broker = start_trio(Path(tmp_path_factory.mktemp("regressions")))
    yield broker
    assert broker.stop() == 0, broker.log_tail()


def session_on(broker: BrokerProcess, prefix: str) -> tuple[Session, Broker]:
    """A harness session whose two sides are the same trio-broker (only its answers count)."""
    side = Broker("trio-broker", broker.port)
    return Session(side, side, prefix=prefix), side


def test_fetch_out_of_range_reports_no_offsets(trio_broker: BrokerProcess) -> None:
    """Kafka answers OFFSET_OUT_OF_RANGE with high watermark, LSO and log start all -1."""
    session, side = session_on(trio_broker, "oor")
    try:
        session.run(CreateTopic("t", 1))
        session.produce(side, "t", 0, -1, session.batch(2))
        in_range = Fetch("t", 0, "zero").run(session, side)
        assert in_range[:8] == ("error", 0, "hw", 2, "lso", 2, "log_start", 0)
        session._kafka_hw = 2
        for where in ("hw+1", "beyond", "negative"):
            answer = Fetch("t", 0, where).run(session, side)
            assert answer == ("error", OFFSET_OUT_OF_RANGE, "hw", -1, "lso", -1,
                              "log_start", -1, "batches", ()), where  # fmt: skip
    finally:
        side.close()


def test_out_of_order_sequence_carries_the_log_start_offset(trio_broker: BrokerProcess) -> None:
    """A batch refused by the producer state is answered with the log start offset (0)."""
    session, side = session_on(trio_broker, "seq")
    try:
        session.run(CreateTopic("t", 1))
        session.run(InitProducer(0, bump=False))
        session.run(IdempotentProduce(0, "t", records=2, acks=-1, mode="next"))
        pid, epoch = side.producer_ids[0]
        gap = build_batch([(b"k", b"v")], producer_id=pid, producer_epoch=epoch, base_sequence=7)
        part = session.produce(side, "t", 0, -1, bytes(gap))
        assert part.error_code == OUT_OF_ORDER_SEQUENCE_NUMBER
        assert (part.base_offset, part.log_start_offset) == (-1, 0)
    finally:
        side.close()


def test_fetch_by_topic_id_of_a_missing_partition(trio_broker: BrokerProcess) -> None:
    """Fetch v13 with a known topic id and a partition it lacks: UNKNOWN_TOPIC_OR_PARTITION
    (Kafka's answer), not UNKNOWN_TOPIC_ID; an unknown id stays UNKNOWN_TOPIC_ID."""
    session, side = session_on(trio_broker, "fid")
    try:
        session.run(CreateTopic("t", 1))
        assert Fetch("t", 0, "zero", by="id").run(session, side)[:2] == ("error", 0)
        assert Fetch("t", 7, "zero", by="id").run(session, side)[:2] == ("error", 3)
        assert Fetch("t", 0, "zero", by="unknown-id").run(session, side)[:2] == ("error", 100)
    finally:
        side.close()
