"""Latency histograms: what the handler pool and the flusher observe and /metrics reports."""

from __future__ import annotations

import bisect

#: Upper bounds (seconds) of the request latency histogram buckets.
LATENCY_BOUNDS: tuple[float, ...] = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 5.0, 10.0,
)  # fmt: skip

#: Upper bounds (seconds) of the fsync latency histogram: 100 µs to 10 s.
FSYNC_BOUNDS: tuple[float, ...] = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 5.0, 10.0,
)  # fmt: skip


class LatencyHistogram:
    """Per key (API key; 0 when unlabelled): bucket counts (not cumulative; the last is
    +Inf), sum and count."""

    def __init__(self, bounds: tuple[float, ...] = LATENCY_BOUNDS) -> None:
        self.bounds = bounds
        #: api key -> [bucket counts..., +Inf count]
        self.buckets: dict[int, list[int]] = {}
        self.sums: dict[int, float] = {}

    def observe(self, api_key: int, seconds: float) -> None:
        counts = self.buckets.get(api_key)
        if counts is None:
            counts = self.buckets[api_key] = [0] * (len(self.bounds) + 1)
            self.sums[api_key] = 0.0
        counts[bisect.bisect_left(self.bounds, seconds)] += 1
        self.sums[api_key] += seconds

    def count(self, api_key: int) -> int:
        return sum(self.buckets.get(api_key, ()))
