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

from tests.differential.harness import Broker, Difference, Op, Session
from tests.differential.strategies import sequences

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
        entry = known(difference)
        if entry is None:
            raise AssertionError(f"trio-broker answers unlike Kafka\n{difference}")
        if entry.diverges:
            break  # the brokers' states differ from here on: comparing more says nothing
