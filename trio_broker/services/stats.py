"""The broker's counters: what /metrics reports (server/metrics.py) and handlers add to."""

from __future__ import annotations

import attrs


@attrs.define
class BrokerStats:
    connections_accepted: int = 0
    connections_rejected: int = 0
    responses_sent: int = 0
    bytes_out: int = 0
    #: Per topic: record-batch bytes appended by Produce / returned by Fetch, records in.
    topic_bytes_in: dict[str, int] = attrs.field(factory=dict)
    topic_messages_in: dict[str, int] = attrs.field(factory=dict)
    topic_bytes_out: dict[str, int] = attrs.field(factory=dict)
    #: Per quota key (producer_byte_rate, ...): throttled responses and their throttle ms.
    throttled_responses: dict[str, int] = attrs.field(factory=dict)
    throttle_ms: dict[str, int] = attrs.field(factory=dict)
    #: Per SASL mechanism: logins refused (the connection is closed after the answer).
    sasl_failures: dict[str, int] = attrs.field(factory=dict)
    #: Requests slower than request.log.slow.ms (each also logged).
    slow_requests: int = 0
