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
session ids (KIP-227) are mapped from the capture's Fetch responses that opened a
session to the target's answers to the same requests.

This module is the Trio shell: reading the capture files, the connections, the clock,
the waits and the recording. What it sends and when is decided without I/O in
:mod:`trio_broker.replay.plan` (the plans, the causality order) and
:mod:`trio_broker.replay.ids` (the id mapping).
"""

from __future__ import annotations

import logging
import struct
import time
from pathlib import Path
from typing import Any

import attrs
import trio

from trio_broker.capture.schema import REQUEST, RESPONSE, CaptureRow
from trio_broker.replay import plan as _plan
from trio_broker.replay.ids import IdMap
from trio_broker.replay.plan import Plan, Request, ResponseOrder, build_plans, expects_response

log = logging.getLogger("trio_broker.replay")

#: How long to wait for the responses still due once every request was sent.
DRAIN_TIMEOUT_S = 30.0
#: How long a request waits for an earlier response that the target never sends.
CAUSALITY_TIMEOUT_S = 10.0
#: Recorded rows are written in files of this many rows.
FLUSH_ROWS = 5000
_SIZE = struct.Struct(">i")


@attrs.define
class Causality(ResponseOrder):
    """A run's :class:`~trio_broker.replay.plan.ResponseOrder`, with a Trio wait on it."""

    advanced: trio.Event = attrs.Factory(trio.Event)

    def arrived(self, place: int) -> bool:
        moved = super().arrived(place)
        if moved:
            self.advanced.set()
            self.advanced = trio.Event()
        return moved

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


def load_plans(capture_dir: Path) -> tuple[list[Plan], dict[str, str], int, int]:
    """Per captured connection its requests in order; the capture's topic id -> name map;
    the number of requests skipped, and how many of those were held only in part
    (:func:`~trio_broker.replay.plan.build_plans` over the capture's Parquet files)."""
    import pyarrow.parquet as pq

    return build_plans(
        (path.name.rsplit("-", 1)[0], pq.read_table(path).to_pylist())
        for path in sorted(Path(capture_dir).glob("*.parquet"))
    )


def order_responses(plans: list[Plan]) -> dict[str, Causality]:
    """Per run, the captured order of its responses; sets each request's ``after_responses``
    (:func:`~trio_broker.replay.plan.order_responses`, each run's order made waitable)."""
    return {
        run: Causality(order.order, order.received, order.done)
        for run, order in _plan.order_responses(plans).items()
    }


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
        self.target = target
        self.speed = speed
        #: Topic ids, producer ids and epochs, member ids and generations: the capture's
        #: to the target's, learnt from the target's responses.
        self.ids = IdMap(source_topic_names)
        self.rows: list[CaptureRow] = []
        self.rotator: Any = None
        if out_dir is not None:
            from trio_broker.capture.writer import ParquetRotator

            self.rotator = ParquetRotator(out_dir, 0, name="replay")
        self.summary = Summary(connections=len(plans))
        self.causality = order_responses(plans)

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
                frame = self.ids.frame_for_target(request)
                if expects_response(request):
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
                plan = self.plans[number - 1]
                self.ids.learn(
                    request, frame, producer=plan.producers.get(corr), join=plan.joins.get(corr),
                    fetch_session=plan.fetch_sessions.get(corr),
                )  # fmt: skip
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
