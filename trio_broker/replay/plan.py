"""What a replay sends, and when: per captured connection its requests, and the causality
order across connections.

Sans-I/O (no trio, no sockets, no files; an import-linter contract says so): the Trio
driver (:mod:`trio_broker.replay.driver`) reads the capture's rows from Parquet and
hands them to :func:`build_plans`, and keeps its own clock and sockets.

* A :class:`Plan` per captured connection: its requests in their captured order, each
  with its time from the start of the capture's run. Not replayed: SASL frames (the
  capture keeps only their ids) and frames the capture holds only in part (a prefix or
  compacted Produce batches).
* The causality order (:func:`order_responses`): per run, the captured order of its
  responses, and for each request how many of them the capture saw arrive before it
  was sent. A request is sent only once that many have arrived from the target too.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import attrs

from trio_broker.capture.schema import REDACTED_API_KEYS, REQUEST
from trio_broker.protocol.messages import decode_request
from trio_broker.replay.ids import (
    FETCH,
    INIT_PRODUCER_ID,
    JOIN_GROUP,
    METADATA,
    PRODUCE,
    fetch_session_handed_out,
    member_handed_out,
    named_topic_ids,
    producer_handed_out,
)

__all__ = [
    "Plan",
    "Request",
    "ResponseOrder",
    "build_plans",
    "expects_response",
    "order_responses",
]


@attrs.define
class Request:
    at_ns: int  # from the start of its run
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    frame: bytes
    #: How many of its run's responses (in captured order) arrived before it was sent.
    after_responses: int = 0


@attrs.define
class Plan:
    run: str
    connection_id: int
    client_address: str
    requests: list[Request]
    #: When the capture saw each replayed request's response (correlation id -> ns
    #: from the start of the run).
    responses: dict[int, int] = attrs.Factory(dict)
    #: The producer id and epoch each captured InitProducerId response handed out
    #: (correlation id -> (id, epoch)).
    producers: dict[int, tuple[int, int]] = attrs.Factory(dict)
    #: The member id and generation each captured JoinGroup response handed out
    #: (correlation id -> (member id, generation or -1 if the join failed)).
    joins: dict[int, tuple[str, int]] = attrs.Factory(dict)
    #: The session id each captured Fetch response handed out (correlation id -> id).
    fetch_sessions: dict[int, int] = attrs.Factory(dict)


def expects_response(request: Request) -> bool:
    """Everything is answered except a Produce with acks=0."""
    if request.api_key != PRODUCE:
        return True
    body: Any = decode_request(request.frame)[1]
    return bool(body.acks != 0)


def build_plans(
    files: Iterable[tuple[str, Iterable[dict[str, Any]]]],
) -> tuple[list[Plan], dict[str, str], int, int]:
    """Per captured connection its requests in order; the capture's topic id -> name map;
    the number of requests skipped, and how many of those were held only in part.

    ``files``: per capture file (in name order) its run and its rows, as dicts of the
    capture schema's columns.
    """
    by_conn: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    answered_at: dict[tuple[str, int, int], int] = {}
    producers: dict[tuple[str, int, int], tuple[int, int]] = {}
    joins: dict[tuple[str, int, int], tuple[str, int]] = {}
    fetch_sessions: dict[tuple[str, int, int], int] = {}
    names: dict[str, str] = {}
    for run, rows in files:
        for row in rows:
            if row["direction"] == REQUEST:
                by_conn[(run, row["connection_id"])].append(row)
                continue
            key = (run, row["connection_id"], row["correlation_id"])
            answered_at[key] = row["monotonic_ns"]
            if row["api_key"] == INIT_PRODUCER_ID:
                producer = producer_handed_out(row["api_version"], row["frame"])
                if producer is not None:
                    producers[key] = producer
            if row["api_key"] == JOIN_GROUP:
                joined = member_handed_out(row["api_version"], row["frame"])
                if joined is not None:
                    joins[key] = joined
            if row["api_key"] == FETCH:
                session_id = fetch_session_handed_out(row["api_version"], row["frame"])
                if session_id is not None:
                    fetch_sessions[key] = session_id
            if row["api_key"] == METADATA and len(row["frame"]) == row["frame_length"]:
                for name, topic_id in named_topic_ids(row["api_version"], row["frame"]).items():
                    names[str(topic_id)] = name
    starts: dict[str, int] = {}
    for (run, _), rows in by_conn.items():
        first = min(r["monotonic_ns"] for r in rows)
        starts[run] = min(starts.get(run, first), first)
    plans: list[Plan] = []
    skipped = partial = 0
    for (run, conn), rows in sorted(by_conn.items()):
        rows.sort(key=lambda r: r["monotonic_ns"])
        plan = Plan(run, conn, rows[0]["client_address"], [])
        for r in rows:
            if r["api_key"] in REDACTED_API_KEYS or len(r["frame"]) < r["frame_length"]:
                skipped += 1
                partial += r["api_key"] not in REDACTED_API_KEYS
                continue
            request = Request(
                r["monotonic_ns"] - starts[run],
                r["api_key"],
                r["api_version"],
                r["correlation_id"],
                r["client_id"],
                r["frame"],
            )
            plan.requests.append(request)
            answer = answered_at.get((run, conn, request.correlation_id))
            if answer is not None and expects_response(request):
                plan.responses[request.correlation_id] = answer - starts[run]
            producer = producers.get((run, conn, request.correlation_id))
            if producer is not None:
                plan.producers[request.correlation_id] = producer
            joined = joins.get((run, conn, request.correlation_id))
            if joined is not None:
                plan.joins[request.correlation_id] = joined
            session_id = fetch_sessions.get((run, conn, request.correlation_id))
            if session_id is not None:
                plan.fetch_sessions[request.correlation_id] = session_id
        if plan.requests:
            plans.append(plan)
    return plans, names, skipped, partial


@attrs.define
class ResponseOrder:
    """The captured order of a run's responses, and how far the replay has got in it.

    ``order`` maps (plan index, correlation id) to the response's place in its
    run; ``done`` counts the leading responses the replay has received (or gave
    up on). A request may be sent once ``done`` reaches its ``after_responses``.
    """

    order: dict[tuple[int, int], int] = attrs.Factory(dict)
    received: list[bool] = attrs.Factory(list)
    done: int = 0

    def arrived(self, place: int) -> bool:
        """Count the response at ``place`` in; True when ``done`` moved on."""
        self.received[place] = True
        start = self.done
        while self.done < len(self.received) and self.received[self.done]:
            self.done += 1
        return self.done != start


def order_responses(plans: list[Plan]) -> dict[str, ResponseOrder]:
    """Per run, the captured order of its responses; sets each request's ``after_responses``."""
    by_run: dict[str, list[tuple[int, int, int]]] = defaultdict(list)
    for index, plan in enumerate(plans):
        for correlation_id, at_ns in plan.responses.items():
            by_run[plan.run].append((at_ns, index, correlation_id))
    runs: dict[str, ResponseOrder] = {}
    times: dict[str, list[int]] = {}
    for run, answers in by_run.items():
        answers.sort()
        runs[run] = ResponseOrder(
            order={(index, corr): place for place, (_, index, corr) in enumerate(answers)},
            received=[False] * len(answers),
        )
        times[run] = [at_ns for at_ns, _, _ in answers]
    for plan in plans:
        for request in plan.requests:
            # Responses seen before this request was sent (strictly: one sent
            # in the same nanosecond was not caused by it).
            request.after_responses = bisect.bisect_left(times.get(plan.run, []), request.at_ns)
    return runs
