"""Replay captured requests against any Kafka-compatible broker, recording the exchange.

``trio-broker replay CAPTURE_DIR --to HOST:PORT [--speed X] [--capture OUT_DIR]``

Every captured connection becomes one TCP connection to the target, which gets
that connection's requests in their captured order at their captured pace
(relative to the first request of the capture's run, divided by ``speed``;
``speed`` 0 sends as fast as the responses allow the client to read them).
Requests keep their correlation ids, so responses are paired exactly as in the
original. Causality is kept across connections: a request is sent only once
every response the capture shows arriving before it (on any connection of its
run) has arrived from the target too — a Produce never overtakes the Metadata
response that created its topic, however fast the replay runs. With ``--capture`` the driver records both directions itself, in the
capture Parquet schema (``replay-…`` files), so ``trio-broker verify`` can
check the replayed run against any broker, not only ours.

Not replayed: SASL frames (the capture keeps only their ids) and frames the
capture holds only in part (a prefix or compacted Produce batches: capture with
``serve --capture-records full``). Topic ids (Produce v13, Fetch v13+) differ
between clusters: they are mapped by name, from the capture's Metadata
responses to the target's (learnt from the replayed Metadata responses).
Producer ids and epochs are mapped the same way, from the capture's
InitProducerId responses to the target's: a replayed record batch carries the
id and epoch the target handed out for it (its CRC recomputed), so idempotent
traffic is appended, not taken for a duplicate of earlier traffic under the
same id. Group member ids and generations are mapped from the capture's
JoinGroup responses to the target's, and rewritten in the group requests that
carry them (JoinGroup, SyncGroup with its assignments, Heartbeat, OffsetCommit,
LeaveGroup), so a consumer group's traffic means the same on the target. Fetch
sessions are not rewritten (our broker does not keep them).
"""

from __future__ import annotations

import bisect
import logging
import struct
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

import attrs
import trio

from trio_broker.capture.schema import REDACTED_API_KEYS, REQUEST, RESPONSE, CaptureRow
from trio_broker.protocol.messages import decode_request, decode_response, encode_request
from trio_broker.protocol.records import split_batches

log = logging.getLogger("trio_broker.replay")

PRODUCE, FETCH, METADATA, INIT_PRODUCER_ID = 0, 1, 3, 22
JOIN_GROUP = 11
#: Requests that name a group member (and most a generation): OffsetCommit,
#: JoinGroup, Heartbeat, LeaveGroup, SyncGroup.
MEMBER_REQUESTS = frozenset({8, 11, 12, 13, 14})
#: How long to wait for the responses still due once every request was sent.
DRAIN_TIMEOUT_S = 30.0
#: How long a request waits for an earlier response that the target never sends.
CAUSALITY_TIMEOUT_S = 10.0
#: Recorded rows are written in files of this many rows.
FLUSH_ROWS = 5000
_SIZE = struct.Struct(">i")


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


@attrs.define
class Causality:
    """The captured order of a run's responses, and how far the replay has got in it.

    ``order`` maps (plan index, correlation id) to the response's place in its
    run; ``done`` counts the leading responses the replay has received (or gave
    up on). A request waits until ``done`` reaches its ``after_responses``.
    """

    order: dict[tuple[int, int], int] = attrs.Factory(dict)
    received: list[bool] = attrs.Factory(list)
    done: int = 0
    advanced: trio.Event = attrs.Factory(trio.Event)

    def arrived(self, place: int) -> None:
        self.received[place] = True
        start = self.done
        while self.done < len(self.received) and self.received[self.done]:
            self.done += 1
        if self.done != start:
            self.advanced.set()
            self.advanced = trio.Event()

    async def wait_for(self, count: int) -> bool:
        """Wait until ``count`` responses arrived; False if one of them never came."""
        count = min(count, len(self.received))
        complete = True
        while self.done < count:
            with trio.move_on_after(CAUSALITY_TIMEOUT_S) as waited:
                await self.advanced.wait()
            if waited.cancelled_caught:
                complete = False
                self.arrived(self.done)  # give up on the missing one and go on
        return complete


@attrs.define
class Summary:
    connections: int = 0
    sent: int = 0
    answered: int = 0
    unanswered: int = 0
    skipped: int = 0
    #: Of the skipped: frames the capture holds only in part (batch headers, a prefix).
    partial: int = 0
    failed_connections: int = 0
    #: Requests sent without an earlier response that the target never gave.
    causality_timeouts: int = 0
    seconds: float = 0.0

    def describe(self) -> str:
        return (
            f"replayed {self.sent} requests on {self.connections} connections in "
            f"{self.seconds:.1f} s: {self.answered} answered, {self.unanswered} unanswered, "
            f"{self.skipped} skipped (SASL or partial frames), "
            f"{self.failed_connections} connections failed"
            + (
                f", {self.causality_timeouts} sent before an earlier response that never came"
                if self.causality_timeouts
                else ""
            )
        )


def _expects_response(request: Request) -> bool:
    """Everything is answered except a Produce with acks=0."""
    if request.api_key != PRODUCE:
        return True
    body: Any = decode_request(request.frame)[1]
    return bool(body.acks != 0)


def load_plans(capture_dir: Path) -> tuple[list[Plan], dict[str, str], int, int]:
    """Per captured connection its requests in order; the capture's topic id -> name map;
    the number of requests skipped, and how many of those were held only in part."""
    import pyarrow.parquet as pq

    by_conn: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    answered_at: dict[tuple[str, int, int], int] = {}
    producers: dict[tuple[str, int, int], tuple[int, int]] = {}
    joins: dict[tuple[str, int, int], tuple[str, int]] = {}
    names: dict[str, str] = {}
    for path in sorted(Path(capture_dir).glob("*.parquet")):
        run = path.name.rsplit("-", 1)[0]
        for row in pq.read_table(path).to_pylist():
            if row["direction"] == REQUEST:
                by_conn[(run, row["connection_id"])].append(row)
                continue
            key = (run, row["connection_id"], row["correlation_id"])
            answered_at[key] = row["monotonic_ns"]
            if row["api_key"] == INIT_PRODUCER_ID:
                producer = _producer_handed_out(row["api_version"], row["frame"])
                if producer is not None:
                    producers[key] = producer
            if row["api_key"] == JOIN_GROUP:
                joined = _member_handed_out(row["api_version"], row["frame"])
                if joined is not None:
                    joins[key] = joined
            if row["api_key"] == METADATA and len(row["frame"]) == row["frame_length"]:
                for name, topic_id in _named_topic_ids(row["api_version"], row["frame"]).items():
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
            if answer is not None and _expects_response(request):
                plan.responses[request.correlation_id] = answer - starts[run]
            producer = producers.get((run, conn, request.correlation_id))
            if producer is not None:
                plan.producers[request.correlation_id] = producer
            joined = joins.get((run, conn, request.correlation_id))
            if joined is not None:
                plan.joins[request.correlation_id] = joined
        if plan.requests:
            plans.append(plan)
    return plans, names, skipped, partial


def _response_body(api_key: int, version: int, frame: bytes) -> Any:
    """A response frame's decoded body, or None if it does not decode."""
    try:
        return decode_response(api_key, version, frame)[1]
    except Exception:
        return None


def _named_topic_ids(version: int, frame: bytes) -> dict[str, uuid.UUID]:
    """Topic name -> topic id, from a Metadata response frame."""
    body = _response_body(METADATA, version, frame)
    if body is None:
        return {}
    return {
        topic.name: topic.topic_id
        for topic in body.topics
        if topic.name and topic.topic_id is not None and topic.topic_id.int
    }


def _producer_handed_out(version: int, frame: bytes) -> tuple[int, int] | None:
    """The (producer id, epoch) of a successful InitProducerId response frame."""
    body = _response_body(INIT_PRODUCER_ID, version, frame)
    if body is None or body.error_code != 0 or body.producer_id < 0:
        return None
    return int(body.producer_id), int(body.producer_epoch)


def _member_handed_out(version: int, frame: bytes) -> tuple[str, int] | None:
    """The (member id, generation) of a JoinGroup response frame: the generation is
    -1 when the join failed (such as MEMBER_ID_REQUIRED, which still names the id)."""
    body = _response_body(JOIN_GROUP, version, frame)
    if body is None or not body.member_id:
        return None
    return str(body.member_id), int(body.generation_id) if body.error_code == 0 else -1


def order_responses(plans: list[Plan]) -> dict[str, Causality]:
    """Per run, the captured order of its responses; sets each request's ``after_responses``."""
    by_run: dict[str, list[tuple[int, int, int]]] = defaultdict(list)
    for index, plan in enumerate(plans):
        for correlation_id, at_ns in plan.responses.items():
            by_run[plan.run].append((at_ns, index, correlation_id))
    runs: dict[str, Causality] = {}
    times: dict[str, list[int]] = {}
    for run, answers in by_run.items():
        answers.sort()
        runs[run] = Causality(
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


class Replayer:
    def __init__(
        self,
        plans: list[Plan],
        source_topic_names: dict[str, str],
        target: tuple[str, int],
        *,
        speed: float = 1.0,
        out_dir: Path | None = None,
    ) -> None:
        self.plans = plans
        self.source_names = source_topic_names
        self.target = target
        self.speed = speed
        #: The target's topic ids by name, from the Metadata responses it sends us.
        self.target_ids: dict[str, uuid.UUID] = {}
        #: Captured (producer id, epoch) -> the target's, from InitProducerId responses.
        #: Not per run: a producer keeps its id across broker restarts.
        self.producer_ids: dict[tuple[int, int], tuple[int, int]] = {}
        #: Captured member id -> the target's, and (group, captured generation) -> the
        #: target's, from JoinGroup responses.
        self.member_ids: dict[str, str] = {}
        self.generations: dict[tuple[str, int], int] = {}
        self.rows: list[CaptureRow] = []
        self.rotator: Any = None
        if out_dir is not None:
            from trio_broker.capture.writer import ParquetRotator

            self.rotator = ParquetRotator(out_dir, 0, name="replay")
        self.summary = Summary(connections=len(plans))
        self.causality = order_responses(plans)

    # ---------------------------------------------------------------- rewriting

    def _frame_for_target(self, request: Request) -> bytes:
        """The request as sent: topic ids, producer ids and epochs, member ids and
        generations mapped from the capture's cluster to the target's."""
        uses_ids = request.api_key in (PRODUCE, FETCH) and request.api_version >= 13
        map_ids = uses_ids and bool(self.target_ids)
        map_producers = request.api_key == PRODUCE and bool(self.producer_ids)
        map_members = request.api_key in MEMBER_REQUESTS and bool(self.member_ids)
        if not map_ids and not map_producers and not map_members:
            return request.frame
        body: Any
        header, body = decode_request(request.frame)
        if map_members:
            self._map_members(body)
        if map_ids:
            topics = body.topic_data if request.api_key == PRODUCE else body.topics
            extra = getattr(body, "forgotten_topics_data", None) or []
            for topic in [*topics, *extra]:
                name = self.source_names.get(str(topic.topic_id))
                if name is not None and name in self.target_ids:
                    topic.topic_id = self.target_ids[name]
        if map_producers:
            for topic in body.topic_data:
                for part in topic.partition_data:
                    if part.records is not None:
                        part.records = self._map_producers(part.records)
        return encode_request(
            header.api_key, header.api_version, header.correlation_id, header.client_id, body
        )[4:]

    def _map_producers(self, records: Any) -> bytes:
        """Records whose batches carry the target's producer id and epoch."""
        buffer = bytearray(records)
        batches, _tail = split_batches(buffer)
        for batch in batches:
            captured = (batch.producer_id, batch.producer_epoch)
            target = self.producer_ids.get(captured)
            if target is not None and target != captured:
                batch.set_producer(*target)
        return bytes(buffer)

    def _map_members(self, body: Any) -> None:
        """Member ids (the request's, a SyncGroup's assignments', a LeaveGroup's members')
        and the generation, the target's in place of the capture's."""
        for holder in [body, *(getattr(body, "assignments", None) or [])]:
            holder.member_id = self.member_ids.get(holder.member_id, holder.member_id)
        for member in getattr(body, "members", None) or []:  # LeaveGroup v3+
            member.member_id = self.member_ids.get(member.member_id, member.member_id)
        for field in ("generation_id", "generation_id_or_member_epoch"):
            generation = getattr(body, field, None)
            if generation is not None:
                target = self.generations.get((body.group_id, generation), generation)
                setattr(body, field, target)

    def _learn_member(self, captured: tuple[str, int], request: Request, frame: bytes) -> None:
        target = _member_handed_out(request.api_version, frame)
        if target is None:
            return
        self.member_ids[captured[0]] = target[0]
        if captured[1] >= 0 and target[1] >= 0:
            group = decode_request(request.frame)[1].group_id  # type: ignore[attr-defined]
            self.generations[(group, captured[1])] = target[1]

    def _learn_producer(self, captured: tuple[int, int], version: int, frame: bytes) -> None:
        target = _producer_handed_out(version, frame)
        if target is not None:
            self.producer_ids[captured] = target

    def _learn_topic_ids(self, version: int, frame: bytes) -> None:
        self.target_ids.update(_named_topic_ids(version, frame))

    # ---------------------------------------------------------------- recording

    def _record(
        self, conn: int, address: str, client_id: str | None, direction: str, request: Request,
        frame: bytes,
    ) -> None:  # fmt: skip
        if self.rotator is None:
            return
        self.rows.append(
            CaptureRow(
                0,
                conn,
                address,
                client_id,
                direction,
                time.monotonic_ns(),
                time.time_ns(),
                request.api_key,
                request.api_version,
                request.correlation_id,
                len(frame),
                frame,
            )
        )
        if len(self.rows) >= FLUSH_ROWS:
            self._flush()

    def _flush(self) -> None:
        if self.rotator is not None and self.rows:
            rows, self.rows = self.rows, []
            self.rotator.write(rows)

    # ---------------------------------------------------------------- connections

    async def run(self) -> Summary:
        started = time.monotonic()
        start_ns = time.monotonic_ns()
        async with trio.open_nursery() as nursery:
            for number, plan in enumerate(self.plans, 1):
                nursery.start_soon(self._connection, number, plan, start_ns)
        self._flush()
        if self.rotator is not None:
            self.rotator.write_stats(
                captured=self.rotator.rows_written,
                dropped=0,
                replayed_from_connections=len(self.plans),
            )
        self.summary.seconds = time.monotonic() - started
        return self.summary

    async def _connection(self, number: int, plan: Plan, start_ns: int) -> None:
        try:
            await self._replay_connection(number, plan, start_ns)
        finally:
            # Whatever this connection did not get can no longer hold the others up.
            causality = self.causality.get(plan.run)
            for correlation_id in plan.responses:
                place = causality.order[(number - 1, correlation_id)] if causality else -1
                if causality is not None and not causality.received[place]:
                    causality.arrived(place)

    async def _replay_connection(self, number: int, plan: Plan, start_ns: int) -> None:
        try:
            stream = await trio.open_tcp_stream(*self.target)
        except OSError as exc:
            log.warning("replay: connection %s/%d failed: %s", plan.run, plan.connection_id, exc)
            self.summary.failed_connections += 1
            return
        causality = self.causality.get(plan.run, Causality())
        host, port = stream.socket.getsockname()[:2]
        address = f"{host}:{port}"
        pending: dict[int, Request] = {}
        all_sent = trio.Event()
        drained = trio.Event()
        async with stream, trio.open_nursery() as nursery:
            nursery.start_soon(
                self._receive, stream, number, address, pending, all_sent, drained, causality
            )
            for request in plan.requests:
                if self.speed > 0:
                    due = start_ns + request.at_ns / self.speed
                    await trio.sleep(max(0.0, (due - time.monotonic_ns()) / 1e9))
                if not await causality.wait_for(request.after_responses):
                    self.summary.causality_timeouts += 1
                frame = self._frame_for_target(request)
                if _expects_response(request):
                    pending[request.correlation_id] = request
                self._record(number, address, request.client_id, REQUEST, request, frame)
                try:
                    await stream.send_all(_SIZE.pack(len(frame)) + frame)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    log.warning("replay: connection %d closed by the target", number)
                    break
                self.summary.sent += 1
            all_sent.set()
            with trio.move_on_after(DRAIN_TIMEOUT_S):
                if pending:
                    await drained.wait()
            self.summary.unanswered += len(pending)
            nursery.cancel_scope.cancel()

    async def _receive(
        self, stream: trio.SocketStream, number: int, address: str, pending: dict[int, Request],
        all_sent: trio.Event, drained: trio.Event, causality: Causality,
    ) -> None:  # fmt: skip
        buffer = bytearray()
        while True:
            try:
                data = await stream.receive_some(1 << 20)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                data = b""
            if not data:
                drained.set()  # the target closed the connection: nothing more will come
                return
            buffer += data
            while len(buffer) >= 4:
                (size,) = _SIZE.unpack_from(buffer, 0)
                if len(buffer) < 4 + size:
                    break
                frame = bytes(buffer[4 : 4 + size])
                del buffer[: 4 + size]
                (corr,) = _SIZE.unpack_from(frame, 0)
                request = pending.pop(corr, None)
                if request is None:
                    log.warning("replay: response to unknown correlation id %d", corr)
                    continue
                self.summary.answered += 1
                place = causality.order.get((number - 1, corr))
                if place is not None:
                    causality.arrived(place)
                if request.api_key == METADATA:
                    self._learn_topic_ids(request.api_version, frame)
                plan = self.plans[number - 1]
                if corr in plan.producers:
                    self._learn_producer(plan.producers[corr], request.api_version, frame)
                if corr in plan.joins:
                    self._learn_member(plan.joins[corr], request, frame)
                self._record(number, address, request.client_id, RESPONSE, request, frame)
                if all_sent.is_set() and not pending:
                    drained.set()


def replay(
    capture_dir: Path, target: tuple[str, int], *, speed: float = 1.0, out_dir: Path | None = None
) -> Summary:
    """Blocking entry point (``trio-broker replay``)."""
    if not Path(capture_dir).is_dir():
        raise FileNotFoundError(f"{capture_dir} is not a directory")
    if not any(Path(capture_dir).glob("*.parquet")):
        raise FileNotFoundError(f"no capture Parquet files in {capture_dir}")
    plans, names, skipped, partial = load_plans(capture_dir)
    replayer = Replayer(plans, names, target, speed=speed, out_dir=out_dir)
    summary = trio.run(replayer.run)
    summary.skipped, summary.partial = skipped, partial
    return summary
