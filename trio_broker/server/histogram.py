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

#: Upper bounds (seconds) of the request stage histograms (RequestStages): finer than
#: LATENCY_BOUNDS between 10 ms and 500 ms, where a fan-in's p99 is read from them.
STAGE_BOUNDS: tuple[float, ...] = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.04,
    0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5, 5.0, 10.0,
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


class RequestStages:
    """Where a request's time goes, per API: Kafka's RequestQueueTimeMs, LocalTimeMs,
    RemoteTimeMs, ResponseQueueTimeMs + ResponseSendTimeMs (one stage here) and TotalTimeMs.

    Stamps are perf_counter seconds: ``received`` when the frame was read whole,
    ``started`` when a handler took it, ``handled`` when the handler returned,
    ``completed`` when its response was ready (after a deferred wait: the fsync, a long
    poll), ``sent`` when the response's bytes were written (after the responses before
    it on the connection).
    """

    __slots__ = ("local", "queue", "remote", "send", "total")

    def __init__(self) -> None:
        #: received -> started: waiting in the handler queue.
        self.queue = LatencyHistogram(STAGE_BOUNDS)
        #: started -> handled: the handler's own work.
        self.local = LatencyHistogram(STAGE_BOUNDS)
        #: handled -> completed: a deferred response's wait (group-commit fsync, long poll).
        self.remote = LatencyHistogram(STAGE_BOUNDS)
        #: completed -> sent: waiting for earlier responses and the writer, and the write.
        self.send = LatencyHistogram(STAGE_BOUNDS)
        #: received -> sent.
        self.total = LatencyHistogram(STAGE_BOUNDS)

    def observe(
        self,
        api_key: int,
        received: float,
        started: float,
        handled: float,
        completed: float,
        sent: float,
    ) -> None:
        self.queue.observe(api_key, started - received)
        self.local.observe(api_key, handled - started)
        self.remote.observe(api_key, completed - handled)
        self.send.observe(api_key, sent - completed)
        self.total.observe(api_key, sent - received)
