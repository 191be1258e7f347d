"""Differential test: generated request sequences to Apache Kafka 4.4 and to trio-broker.

Fixed seed (``derandomize``), bounded: ``SEQUENCES`` sequences of up to ``MAX_OPS`` ops
after a fixed prologue, one Kafka and one trio-broker for the module. Every difference
fails the test unless :data:`KNOWN_DIFFERENCES` lists it -- and each entry there is
explained in docs/compatibility.md, "Differences from Kafka found by the differential
harness". The long random run is ``bench/differential.py``.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

from hypothesis import HealthCheck, Phase, given, note, settings

from tests.differential.harness import (
    CLOSE,
    FORGET,
    NEXT_FETCH,
    OPEN,
    STALE_SESSION_EPOCH,
    UNKNOWN_SESSION,
    Broker,
    CreateTopic,
    DeleteTopic,
    Difference,
    Op,
    Produce,
    Session,
    SessionFetch,
)
from tests.differential.strategies import PROLOGUE, sequences

SEQUENCES = 20
MAX_OPS = 15


@dataclass(frozen=True)
class Known:
    """A difference kept on purpose; ``why`` names its entry in docs/compatibility.md."""

    why: str
    matches: Callable[[Difference], bool]
    #: False when the brokers' states stay equivalent, so the sequence can go on.
    diverges: bool = True


def _init_producer_bump(d: Difference) -> bool:
    # Kafka ignores the id and epoch of a non-transactional InitProducerId and hands out a
    # new id at epoch 0; trio-broker bumps the epoch of the same id (KIP-360).
    return (
        d.kind == "init-producer-id"
        and d.kafka[1] == d.trio[1] == 0
        and (d.kafka[3], d.kafka[5]) == (0, False)
        and d.trio[5] is True
    )


KNOWN_DIFFERENCES = [
    # Diverges: Kafka's new id has no sequence state on any partition (any first sequence
    # is accepted), trio-broker's bumped epoch must start at sequence 0.
    Known("InitProducerId with the current id and epoch (idempotent producer)",
          _init_producer_bump),
]  # fmt: skip


def known(difference: Difference) -> Known | None:
    for entry in KNOWN_DIFFERENCES:
        if entry.matches(difference):
            return entry
    return None


_session_numbers = itertools.count()


@settings(
    max_examples=SEQUENCES,
    derandomize=True,
    database=None,
    deadline=None,
    phases=[Phase.generate],  # no shrinking: each step is a round trip to two brokers
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(ops=sequences(MAX_OPS))
def test_same_answers_as_kafka(brokers: tuple[Broker, Broker], ops: list[Op]) -> None:
    kafka, trio = brokers
    session = Session(kafka, trio, prefix=f"diff{next(_session_numbers)}")
    for op in ops:
        note(repr(op))
        difference = session.run(op)
        if difference is None:
            continue
        if difference.near_a_timer:
            # Sent as the generation's sync timer ran out: which broker fired it first
            # is load, not semantics. The states may differ from here: the sequence ends.
            note(f"at a group timer's deadline, not compared: {difference}")
            break
        entry = known(difference)
        if entry is None:
            raise AssertionError(f"trio-broker answers unlike Kafka\n{difference}")
        if entry.diverges:
            break  # the brokers' states differ from here on: comparing more says nothing


def test_a_fetch_session_like_kafka(brokers: tuple[Broker, Broker]) -> None:
    """One fixed fetch-session sequence (the generated ones meet sessions only now and
    then): news-only answers, a stale epoch, an unknown id, forgetting, a topic deleted
    and created again under the session, a full fetch replacing the session, closing."""
    kafka, trio = brokers
    session = Session(kafka, trio, prefix="fetch-session")
    S = SessionFetch
    ops = [
        *PROLOGUE, S(NEXT_FETCH), S(OPEN), S(NEXT_FETCH), Produce("b", 1, 2, -1),
        S(NEXT_FETCH), S(STALE_SESSION_EPOCH), S(NEXT_FETCH), S(UNKNOWN_SESSION), S(FORGET),
        Produce("b", 1, 1, -1), Produce("a", 0, 1, -1), S(NEXT_FETCH), S(OPEN), S(NEXT_FETCH),
        DeleteTopic("a"), S(NEXT_FETCH), CreateTopic("a", 1), S(NEXT_FETCH), S(OPEN),
        S(NEXT_FETCH), S(CLOSE), S(NEXT_FETCH),
    ]  # fmt: skip
    for op in ops:
        difference = session.run(op)
        assert difference is None, f"trio-broker answers unlike Kafka\n{difference}"
