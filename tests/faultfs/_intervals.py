"""A set of half-open byte ranges [start, end), kept sorted, disjoint and merged.

The fault filesystem keeps one per file for the bytes written since the last fsync and one for
the bytes whose durable content it has saved aside. The common case (a log that is only ever
appended to) touches only the last range, which stays O(1).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterator


class IntervalSet:
    __slots__ = ("_ends", "_starts")

    def __init__(self) -> None:
        self._starts: list[int] = []
        self._ends: list[int] = []

    def __bool__(self) -> bool:
        return bool(self._starts)

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return iter(zip(self._starts, self._ends))

    def __repr__(self) -> str:
        return f"IntervalSet({list(self)})"

    def clear(self) -> None:
        self._starts.clear()
        self._ends.clear()

    def total(self) -> int:
        return sum(e - s for s, e in self)

    def add(self, start: int, end: int) -> None:
        if end <= start:
            return
        starts, ends = self._starts, self._ends
        if not starts or start > ends[-1]:
            starts.append(start)
            ends.append(end)
            return
        if start >= starts[-1]:  # touches or overlaps the last range: the append fast path
            if end > ends[-1]:
                ends[-1] = end
            return
        i = bisect_left(ends, start)  # first range that ends at or after start
        j = bisect_right(starts, end)  # ranges [i, j) touch [start, end)
        if i == j:
            starts.insert(i, start)
            ends.insert(i, end)
            return
        new_start = min(start, starts[i])
        new_end = max(end, ends[j - 1])
        starts[i:j] = [new_start]
        ends[i:j] = [new_end]

    def truncate(self, size: int) -> None:
        """Drop everything at or beyond ``size``."""
        starts, ends = self._starts, self._ends
        while starts and starts[-1] >= size:
            starts.pop()
            ends.pop()
        if ends and ends[-1] > size:
            ends[-1] = size

    def gaps(self, start: int, end: int) -> list[tuple[int, int]]:
        """The parts of [start, end) that are not in the set."""
        if end <= start:
            return []
        starts, ends = self._starts, self._ends
        if not starts or start >= ends[-1]:
            return [(start, end)]
        out: list[tuple[int, int]] = []
        pos = start
        i = bisect_right(ends, start)  # first range ending after start
        while pos < end and i < len(starts):
            s, e = starts[i], ends[i]
            if s >= end:
                break
            if s > pos:
                out.append((pos, s))
            pos = max(pos, e)
            i += 1
        if pos < end:
            out.append((pos, end))
        return out

    def clipped(self, start: int, end: int) -> list[tuple[int, int]]:
        """The parts of [start, end) that are in the set."""
        out: list[tuple[int, int]] = []
        for s, e in self:
            if e <= start:
                continue
            if s >= end:
                break
            out.append((max(s, start), min(e, end)))
        return out
