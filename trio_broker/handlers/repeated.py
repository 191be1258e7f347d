"""Kafka's rule for a topic named twice in one admin request: one INVALID_REQUEST answer.

CreateTopics, CreatePartitions and DeleteTopics answer such a name once, with
INVALID_REQUEST, and act on none of its entries; every other entry is judged alone.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable, Iterator, Sequence
from typing import TypeVar

__all__ = ["REPEATED_MESSAGE", "each_once"]

T = TypeVar("T")

REPEATED_MESSAGE = "topic named more than once in the request"


def each_once(items: Sequence[T], key: Callable[[T], Hashable]) -> Iterator[tuple[T, bool]]:
    """``(item, False)`` for every item whose key is unique in ``items``, and one
    ``(item, True)`` for each key given more than once, in request order."""
    counts = Counter(key(item) for item in items)
    answered: set[Hashable] = set()
    for item in items:
        k = key(item)
        if counts[k] == 1:
            yield item, False
        elif k not in answered:
            answered.add(k)
            yield item, True
