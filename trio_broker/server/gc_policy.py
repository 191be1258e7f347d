"""The broker process's garbage-collector policy, set once by ``trio-broker serve``.

CPython frees most objects by reference counting; its cyclic collector only finds
reference cycles (Trio's cancelled tasks and their tracebacks make some). With Python's
own thresholds it runs a young collection every 700 net container allocations. A
broker answering thousands of small requests a second allocates that in a few
milliseconds, so every request still waiting for its group commit or its long poll
outlives two young collections and is promoted to the oldest generation; that fills
with such garbage, and a full collection, which walks every live object (every
connection's tasks, sockets and buffers, every module's functions), runs again and
again. W5 at full sizes (100 producers, 1000 idle connections; docs/performance.md,
"The garbage collector") made 21 full collections in 20 s, 120-140 ms each, with the
event loop held for all of them: 2 s of the broker's 17 s of CPU, and p99 339-365 ms.

So ``serve``, as the JVM's collector options do for Kafka (KAFKA_JVM_PERFORMANCE_OPTS),
sets the process's policy before it starts the broker:

- the young generation's threshold is raised (``DEFAULT_GEN0_THRESHOLD``): a request's
  objects die young, collections are rarer, and each stays short;
- what the imports and the configuration made is frozen (``gc.freeze``): it lives as
  long as the process, and no collection walks it again.

``TRIO_BROKER_GC_GEN0_THRESHOLD`` in the environment sets another threshold, or
``python`` leaves the collector as Python sets it (to compare). The collections'
pauses are timed for ``/metrics`` (``trio_broker_gc_pause_seconds``).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Mapping

from trio_broker.server.histogram import LATENCY_BOUNDS, LatencyHistogram

#: The environment variable that overrides the young generation's threshold.
GEN0_THRESHOLD_ENV = "TRIO_BROKER_GC_GEN0_THRESHOLD"
#: The value of it that leaves the collector as Python sets it.
PYTHON_DEFAULTS = "python"
#: Net container allocations between young collections (Python's own: 700). At 10,000,
#: W5's broker made 20 young and one middle collection in 20 s, none full, and kept its
#: loop lag p99 within 25 ms; at 50,000 a young collection took up to 32 ms by itself.
DEFAULT_GEN0_THRESHOLD = 10_000


class GcPolicyError(ValueError):
    """The environment names a threshold that is not one."""


def gen0_threshold(environ: Mapping[str, str]) -> int | None:
    """The young generation's threshold the environment asks for; None: Python's own."""
    text = environ.get(GEN0_THRESHOLD_ENV, "").strip()
    if not text:
        return DEFAULT_GEN0_THRESHOLD
    if text == PYTHON_DEFAULTS:
        return None
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise GcPolicyError(
            f"{GEN0_THRESHOLD_ENV}={text!r}: expected a whole number >= 1, "
            f"or {PYTHON_DEFAULTS!r} for Python's own collector settings"
        )
    return value


class GcPauses:
    """How long each collection held the process, per generation (label 0, 1, 2)."""

    def __init__(self) -> None:
        self.histogram = LatencyHistogram(LATENCY_BOUNDS)
        self._started = 0.0
        self.installed = False

    def install(self) -> None:
        if not self.installed:
            gc.callbacks.append(self._observe)
            self.installed = True

    def _observe(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.histogram.observe(info["generation"], time.perf_counter() - self._started)


#: The process's collections (one collector per process, so one recorder).
PAUSES = GcPauses()


def apply_gc_policy(threshold: int | None) -> None:
    """Time every collection and, unless ``threshold`` is None, raise the young
    generation's threshold to it and freeze every object that exists now."""
    PAUSES.install()
    if threshold is None:
        return
    _, middle, old = gc.get_threshold()
    gc.set_threshold(threshold, middle, old)
    gc.freeze()
