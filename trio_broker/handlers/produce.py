"""Produce: validate each partition's batch, assign offsets, append; ack per acks.

acks=0 sends no response, acks=1 answers once the batch is in the log (page
cache), acks=-1 answers once the group commit covering the batch has fsynced it.
The append happens here, in the connection's handler task, in request order;
only the wait for the fsync is deferred, so a pipelined connection never
reorders or double-appends a producer's batches.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from trio_broker.handlers.authorization import Operation, ResourceType, authorized
from trio_broker.handlers.base import (
    NOT_READY,
    CloseConnection,
    DurableWait,
    FetchWait,
    LoopBudget,
    NotReady,
    Polled,
    RequestContext,
    Response,
    Services,
    handles,
)
from trio_broker.handlers.leadership import produce_leader_hints
from trio_broker.handlers.producer_state import prepare_producer_states
from trio_broker.handlers.topic_lookup import find_topic, leading_partition
from trio_broker.partition.append import (
    Appended,
    AppendRejected,
    Origin,
    Term,
    acked_at_once,
)
from trio_broker.partition.append import append as partition_append
from trio_broker.partition.partition import Partition
from trio_broker.protocol import messages as m
from trio_broker.protocol.batch_header import (
    ATTRIBUTES_AT,
    BATCH_LENGTH_AT,
    CODEC_MASK,
    HEADER_SIZE,
    LOG_OVERHEAD,
)
from trio_broker.protocol.codec import RecordBytes
from trio_broker.protocol.compression import Compression
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.protocol.errors import DecompressionLimitError, KafkaError, ProtocolError
from trio_broker.protocol.records import RecordBatchView, iter_batches
from trio_broker.replication.leader import AckState
from trio_broker.services.topics import RESERVED_TOPICS
from trio_broker.state.quota import PRODUCER_BYTE_RATE
from trio_broker.storage.errors import StorageError

if TYPE_CHECKING:
    from trio_broker.services.topics import Topic

Resp = m.ProduceResponse
TopicResp = Resp.TopicProduceResponse
PartResp = TopicResp.PartitionProduceResponse

_I32 = struct.Struct(">i")

#: Produce v7 is the first that may carry zstd (KIP-110).
FIRST_ZSTD_VERSION = 7


class BatchRejected(KafkaError):
    """A batch Kafka refuses: ``BatchRejected(error_code, message)``."""


class RecordsRejected(BatchRejected):
    """A batch refused for some of its records: ``record_errors`` lists them as
    (index in the batch, why), for Produce v8+'s per-record errors."""

    def __init__(self, error_code: ErrorCode, record_errors: list[tuple[int, str]]) -> None:
        # Kafka's summary text (its LogValidator): the count and the first three errors.
        shown = ", ".join(
            f"RecordError(batchIndex={index}, message='{why}')" for index, why in record_errors[:3]
        )
        super().__init__(
            error_code,
            f"One or more records have been rejected due to {len(record_errors)} record errors "
            f"in total, and only showing the first three errors at most: [{shown}]",
        )
        self.record_errors = record_errors


def keyless_records(batch: RecordBatchView) -> list[int]:
    """The indexes in ``batch`` of its records without a key (a null key; an empty one
    is a key)."""
    return [index for index, record in enumerate(batch.records()) if record.key is None]


#: A compressed batch is decompressed on the event loop up to this size. One that
#: inflates further (up to the 64 MiB bound of protocol/compression.py) is checked in a
#: worker thread: zstd and zlib decompression release the GIL, so a decompression bomb
#: (a few KiB that inflate to 60 MiB, ~0.2 s each) does not hold the loop (issue 28).
INLINE_UNCOMPRESSED = 1 << 20

#: ``validate_batch``'s ``checked`` when the records were not checked beforehand.
UNCHECKED: Any = object()


async def check_compressed_batches(
    services: Services, request: m.ProduceRequest, budget: LoopBudget
) -> dict[int, ProtocolError | None]:
    """Check the records of every compressed batch first, before anything else is looked
    at (nothing can change under the handler during the worker thread's wait).

    Returns the outcome per ``id(partition data)``: None when the records add up, the
    error when not. A batch left out (not one batch, uncompressed, malformed) is
    checked by :func:`validate_batch` as usual. ``budget``: the request's, which its
    appends then go on spending.
    """
    outcomes: dict[int, ProtocolError | None] = {}
    for topic_data in request.topic_data:
        for data in topic_data.partition_data:
            await budget.tick()
            if not data.records or _one_uncompressed_batch(data.records):
                continue
            try:
                batches = list(iter_batches(data.records))
            except ProtocolError:
                continue
            if len(batches) != 1 or batches[0].attributes & 0x07 == Compression.NONE:
                continue
            batch = batches[0]
            try:
                batch.check_records(INLINE_UNCOMPRESSED)
            except DecompressionLimitError:
                try:
                    await services.run_off_loop(batch.check_records)
                except ProtocolError as exc:
                    outcomes[id(data)] = exc
                else:
                    outcomes[id(data)] = None
            except ProtocolError:
                continue
            else:
                outcomes[id(data)] = None
    return outcomes


def _one_uncompressed_batch(records: RecordBytes) -> bool:
    """Records that are exactly one uncompressed batch: nothing to check ahead (read from
    the header's bytes, without building views; the common Produce)."""
    if len(records) < HEADER_SIZE:
        return False
    length = LOG_OVERHEAD + _I32.unpack_from(records, BATCH_LENGTH_AT)[0]
    return length == len(records) and records[ATTRIBUTES_AT + 1] & CODEC_MASK == Compression.NONE


def validate_batch(
    records: RecordBytes | None,
    api_version: int,
    max_message_bytes: int,
    compacted_partition: str | None = None,
    checked: ProtocolError | None = UNCHECKED,
) -> RecordBatchView:
    """Kafka's rules for the records of one partition in Produce v3+; returns the batch.

    ``compacted_partition``: the partition's name ("topic-N") when its cleanup.policy
    includes compact. The cleaner keeps the latest record of each key, so a record
    without a key could never be cleaned away: as Kafka, such a batch is refused whole
    (INVALID_RECORD, each keyless record named), nothing of it appended.

    ``checked``: the outcome of :func:`check_compressed_batches` for these records (None:
    they add up), or UNCHECKED.
    """
    if records is None or len(records) == 0:
        raise BatchRejected(ErrorCode.INVALID_RECORD, "no records")
    try:
        batches = list(iter_batches(records))
    except ProtocolError as exc:
        raise BatchRejected(ErrorCode.CORRUPT_MESSAGE, str(exc)) from None
    if len(batches) != 1:
        raise BatchRejected(ErrorCode.INVALID_RECORD, "Produce v3+ needs exactly one batch")
    batch = batches[0]
    if batch.size_in_bytes > max_message_bytes:
        raise BatchRejected(ErrorCode.MESSAGE_TOO_LARGE, f"batch of {batch.size_in_bytes} bytes")
    try:
        batch.validate()
    except ProtocolError as exc:
        raise BatchRejected(exc.error_code, str(exc)) from None
    try:
        codec = Compression(batch.attributes & 0x07)
    except ValueError:
        raise BatchRejected(ErrorCode.UNSUPPORTED_COMPRESSION_TYPE, "unknown codec") from None
    if codec == Compression.ZSTD and api_version < FIRST_ZSTD_VERSION:
        raise BatchRejected(ErrorCode.UNSUPPORTED_COMPRESSION_TYPE, "zstd needs Produce v7+")
    if batch.is_control:
        raise BatchRejected(ErrorCode.INVALID_RECORD, "clients may not write control batches")
    if batch.is_transactional and batch.producer_id < 0:
        raise BatchRejected(ErrorCode.INVALID_RECORD, "transactional batch without a producer id")
    if batch.producer_id >= 0 and batch.base_sequence < 0:
        raise BatchRejected(ErrorCode.INVALID_RECORD, "idempotent batch without a sequence")
    if checked is not UNCHECKED and checked is not None:
        raise BatchRejected(checked.error_code, str(checked))
    try:
        if checked is UNCHECKED:
            batch.check_records()  # the records themselves must add up, as Kafka checks
        keyless = keyless_records(batch) if compacted_partition is not None else []
    except ProtocolError as exc:
        raise BatchRejected(exc.error_code, str(exc)) from None
    if keyless:
        why = (
            "Compacted topic cannot accept message without key in topic partition "
            f"{compacted_partition}"
        )
        raise RecordsRejected(ErrorCode.INVALID_RECORD, [(index, why) for index in keyless])
    return batch


#: The client id Kafka lets write into internal topics (its AdminUtils.ADMIN_CLIENT_ID);
#: every other client's Produce to one is refused with INVALID_TOPIC_EXCEPTION.
INTERNAL_WRITER_CLIENT_ID = "__admin_client"

#: Validation errors Kafka answers with the log start offset (its RecordValidationException
#: path); a corrupt or too large batch gets -1 there, as here.
_ANSWERED_WITH_LOG_START = (ErrorCode.INVALID_RECORD, ErrorCode.INVALID_TIMESTAMP)


#: A topic the request and the client may write to (no allocation per topic).
_NOT_REFUSED: tuple[ErrorCode, str | None] = (ErrorCode.NONE, None)


@handles(m.ApiKey.PRODUCE, 3, advertised_min=0)
async def handle_produce(ctx: RequestContext, request: m.ProduceRequest) -> Response:
    """Kafka's handleProduceRequest: the request's checks, then each partition's guard
    (:func:`produce_target`) and append (:func:`append_batch`), then the answer acks
    asks for (:func:`answer_when_acked`)."""
    services = ctx.services
    # One budget for the whole request: its checks and its appends share one slice.
    budget = LoopBudget(services)
    # First, while nothing is looked up yet: it may wait for a worker thread.
    checked = await check_compressed_batches(services, request, budget)
    await prepare_producer_states(ctx, (
        (t.name, t.topic_id, [d.index for d in t.partition_data]) for t in request.topic_data
    ))  # fmt: skip
    acks = request.acks
    now = ctx.now_ms()  # before the coordinator's answer is awaited, as it always was
    # As Kafka: a transactional producer needs WRITE on its transactional id, or every
    # partition of the request is refused.
    txn_id = request.transactional_id if ctx.api_version >= 3 else None
    txn_id_denied = txn_id is not None and not authorized(
        ctx, Operation.WRITE, ResourceType.TRANSACTIONAL_ID, txn_id
    )
    # The first batch of a transaction in a partition is verified with the coordinator
    # first (KIP-890: this broker's table, or another broker's). Awaited here, in the handler task, so that this
    # connection's later batches still append after it, in order.
    verified = {} if txn_id is None or txn_id_denied else await verify_with_coordinator(
        ctx, request, txn_id
    )  # fmt: skip
    # The request's own refusal, answered for every partition: acks first.
    if acks not in (0, 1, -1):
        request_refusal = ErrorCode.INVALID_REQUIRED_ACKS
    elif txn_id_denied:
        request_refusal = ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    else:
        request_refusal = ErrorCode.NONE
    appends_to_ack: list[tuple[Appended, PartResp]] = []  # the writes acks=-1 waits for
    topic_responses: list[TopicResp] = []
    produced = 0  # request record bytes, for the producer byte-rate quota
    for topic_data in request.topic_data:
        topic, name, missing = find_topic(ctx, topic_data.name, topic_data.topic_id)
        refusal, refusal_message = topic_refusal(ctx, name, request_refusal)
        partition_responses: list[PartResp] = []
        for data in topic_data.partition_data:
            # Thousands of partitions, or batches that inflate to 64 MiB each, must not
            # hold the loop; after a pause the topic is looked up again (deleted, grown).
            if await budget.tick():
                topic, name, missing = find_topic(ctx, topic_data.name, topic_data.topic_id)
            part = PartResp(index=data.index, base_offset=-1, log_append_time_ms=-1)
            partition_responses.append(part)
            produced += len(data.records or b"")
            if refusal:
                part.error_code, part.error_message = refusal, refusal_message
                continue
            target = produce_target(ctx, topic, name, missing, data, acks, checked, part)
            if target is None:
                continue
            assert topic is not None  # produce_target found the partition
            led, batch = target
            appended = append_batch(ctx, topic, led, batch, verified, now, part)
            if appended is None:
                continue
            if acks == -1:  # a retry's original may still be waiting for its fsync
                appends_to_ack.append((appended, part))
            if not appended.duplicate:  # a retried batch: answered with its original offsets
                # /metrics: two dict increments per partition, no per-record work.
                bytes_in, messages_in = (
                    services.stats.topic_bytes_in,
                    services.stats.topic_messages_in,
                )
                bytes_in[name] = bytes_in.get(name, 0) + batch.size_in_bytes
                messages_in[name] = messages_in.get(name, 0) + batch.record_count
        topic_responses.append(
            TopicResp(
                name=name, topic_id=topic_data.topic_id, partition_responses=partition_responses
            )
        )
    # Quota (KIP-219): the request's record bytes count whatever the outcome
    # (summed in the loop above, so no second walk over the request).
    throttle_ms = ctx.services.quotas.throttle(ctx, PRODUCER_BYTE_RATE, produced)
    response = Resp(responses=topic_responses, throttle_time_ms=throttle_ms)
    produce_leader_hints(ctx, response)  # KIP-951
    if acks == 0:
        # No response to carry an error: like Kafka, close the connection so the
        # client notices and refreshes its metadata.
        failed = any(p.error_code for t in topic_responses for p in t.partition_responses)
        return CloseConnection("acks=0 produce failed") if failed else None
    return answer_when_acked(services, request, response, appends_to_ack)


def topic_refusal(
    ctx: RequestContext, name: str, request_refusal: ErrorCode
) -> tuple[ErrorCode, str | None]:
    """The refusal every partition of topic ``name`` gets, with its message: the
    request's, else the topic's (WRITE denied; an internal topic)."""
    # An unknown topic id has no name to authorize: it stays UNKNOWN_TOPIC_ID. The ACL
    # is asked even when the request is refused, as before (an authorizer may log it).
    allowed = not name or authorized(ctx, Operation.WRITE, ResourceType.TOPIC, name)
    if request_refusal:
        return request_refusal, None
    if not allowed:
        return ErrorCode.TOPIC_AUTHORIZATION_FAILED, None
    # Only the coordinators write internal topics (they append to the log directly).
    if name in RESERVED_TOPICS and ctx.header.client_id != INTERNAL_WRITER_CLIENT_ID:
        return ErrorCode.INVALID_TOPIC_EXCEPTION, f"Cannot append to internal topic {name}"
    return _NOT_REFUSED


def produce_target(
    ctx: RequestContext, topic: Topic | None, name: str, missing: ErrorCode,
    data: m.ProduceRequest.TopicProduceData.PartitionProduceData, acks: int,
    checked: dict[int, ProtocolError | None], part: PartResp,
) -> tuple[Partition, RecordBatchView] | None:  # fmt: skip
    """One partition's guard, in Kafka's order: the partition known here and led by
    this broker (:func:`leading_partition`), an ISR large enough for acks=all, then its
    batch valid (:func:`validate_batch`). Returns the partition (its log, term and
    producer state) and the batch to append, or None: the refusal is written into
    ``part`` (code, message, per-record errors, log start offset)."""
    led = leading_partition(ctx, topic, name, data.index, missing)
    if isinstance(led, ErrorCode):
        part.error_code = led
        return None
    assert topic is not None  # leading_partition found its log
    if acks == -1:
        term = led.term
        isr = acks_all_isr(ctx, topic.name, data.index, term)
        if len(isr) < term.effective_min_insync_replicas:
            part.error_code = ErrorCode.NOT_ENOUGH_REPLICAS
            part.error_message = (
                f"the ISR has {len(isr)} member(s), min.insync.replicas is "
                f"{term.effective_min_insync_replicas} (for {len(term.replicas)} replicas)"
            )
            return None
    log = led.log
    try:
        max_bytes = int(
            topic.info.configs.get("max.message.bytes", ctx.services.config.message_max_bytes)
        )
        compacted = f"{topic.name}-{data.index}" if log.config.compact else None
        batch = validate_batch(
            data.records, ctx.api_version, max_bytes, compacted, checked.get(id(data), UNCHECKED)
        )
    except BatchRejected as exc:
        part.error_code, part.error_message = exc.error_code, str(exc)
        if isinstance(exc, RecordsRejected):
            part.record_errors = [
                PartResp.BatchIndexAndErrorMessage(batch_index=index, batch_index_error_message=why)
                for index, why in exc.record_errors
            ]
        if exc.error_code in _ANSWERED_WITH_LOG_START:
            part.log_start_offset = log.log_start_offset
        return None
    return led, batch


def append_batch(
    ctx: RequestContext, topic: Topic, led: Partition, batch: RecordBatchView,
    verified: dict[tuple[str, int], ErrorCode], now_ms: int, part: PartResp,
) -> Appended | None:  # fmt: skip
    """Append a guarded batch to ``led`` through the one append path
    (partition/append.py) and fill ``part`` with its offsets; None when refused there (a
    transaction not verified, the producer's sequence or epoch, the disk), the refusal
    written into ``part``."""
    services = ctx.services
    log = led.log
    try:
        if batch.is_transactional:
            check_in_transaction(services, led.topic, led.index, batch, verified)
        timestamp_type = topic.info.configs.get(
            "message.timestamp.type", services.config.log_message_timestamp_type
        )
        log_append_time = timestamp_type == "LogAppendTime"
        appended = partition_append(
            led, batch.buf, origin=Origin.CLIENT, now_ms=now_ms,
            durability=services.durability, appends=services.appends,
            log_append_time=log_append_time,
        )  # fmt: skip
    except (BatchRejected, AppendRejected) as exc:
        # As Kafka: a batch refused by the producer state (sequence, epoch) is
        # answered with the partition's log start offset.
        part.error_code, part.error_message = exc.error_code, str(exc)
        part.log_start_offset = log.log_start_offset
        return None
    except StorageError as exc:
        part.error_code, part.error_message = exc.error_code, str(exc)
        part.log_start_offset = log.log_start_offset
        # The disk may have space again: probe it in the background (1 s back-off).
        services.durability.recover_soon(log)
        return None
    part.log_start_offset = log.log_start_offset
    part.base_offset = appended.base_offset
    if log_append_time and not appended.duplicate:  # a retry keeps its original's answer
        part.log_append_time_ms = appended.log_append_time
    return appended


def answer_when_acked(
    services: Services, request: m.ProduceRequest, response: m.ProduceResponse,
    appends_to_ack: list[tuple[Appended, PartResp]],
) -> Response:  # fmt: skip
    """``response`` now if every write is acknowledged already, else a Polled answer
    that answers once they are (or past the request's timeout_ms).

    The request's timeout_ms bounds the wait for the covering fsync; past it the
    partition answers REQUEST_TIMED_OUT and the data stays in the log (as Kafka).
    In a cluster the write then waits for the high watermark: every ISR member has it.
    acks.all.fsync=false (ours): no fsync first; a cluster's ISR holding the write
    (in page cache) is what counts, as in Kafka."""
    acks = request.acks
    sync_first = services.config.acks_all_fsync
    # Nothing to wait for (a node alone with acks.all.fsync=false, or synced already):
    # the same answer now, without a deferred task and its timeout's cancel scope.
    if all(acked_at_once(a, acks, fsync=sync_first) for a, _ in appends_to_ack):
        return response

    return _when_acked(services, request, response, appends_to_ack)


def _when_acked(
    services: Services, request: m.ProduceRequest, response: m.ProduceResponse,
    appends_to_ack: list[tuple[Appended, PartResp]],
) -> Polled:  # fmt: skip
    """acks=all: the answer once each write is acknowledged, polled by the shell without
    a task of its own (as ``wait_acked`` waits): first the group commit covering it
    (acks.all.fsync), whose release of the write (synced, or failed) wakes the answer;
    then, for a replicated write, the high watermark past it (``commit_state``), whose
    moves, like the end of the term, notify the partition (``Appends``) as they wake a
    long poll. A failed sync answers that partition with its error; a write the HW did
    not commit, NOT_ENOUGH_REPLICAS_AFTER_APPEND or NOT_LEADER_OR_FOLLOWER."""
    sync_first = services.config.acks_all_fsync
    #: Per write not acknowledged yet: its wait for the sync (None: synced or none asked).
    pending: list[tuple[Appended, DurableWait | None, PartResp]] = []
    durable_waits: list[DurableWait] = []
    #: The replicated writes' partitions, watched as a long poll watches its own.
    partitions: FetchWait | None = None

    def watch(wake: Callable[[], None]) -> Callable[[], None]:
        nonlocal partitions
        for appended, part in appends_to_ack:
            durable = None
            if sync_first:
                durable = services.durability.watch_durable(
                    appended.log, appended.last_offset, wake
                )
                durable_waits.append(durable)
            pending.append((appended, durable, part))
        replicated = {(a.topic, a.partition) for a, _ in appends_to_ack if a.replicated}
        leave = None
        if replicated:
            partitions = services.appends.watch(replicated)
            leave = partitions.subscribe(wake)

        def unwatch() -> None:
            for durable in durable_waits:
                durable.cancel()
            if leave is not None:
                leave()

        return unwatch

    def poll() -> m.ProduceResponse | NotReady:
        if partitions is not None:
            # What changed is read below; a change from now on wakes the answer again
            # (a waiter with changes not taken is not woken by more).
            partitions.take()
        still: list[tuple[Appended, DurableWait | None, PartResp]] = []
        for appended, durable, part in pending:
            if durable is not None:
                try:
                    if not durable.check():
                        still.append((appended, durable, part))
                        continue
                except (KafkaError, OSError) as error:
                    part.base_offset = -1
                    part.error_code = (
                        error.error_code
                        if isinstance(error, KafkaError)
                        else ErrorCode.KAFKA_STORAGE_ERROR
                    )
                    part.error_message = str(error)
                    continue
            if not appended.replicated:
                continue  # a node alone's term: committed once synced
            state = services.leaders.commit_state(
                appended.topic, appended.partition, appended.last_offset
            )
            if state is AckState.WAITING:
                still.append((appended, None, part))
            elif state is not AckState.DONE:
                part.base_offset = -1
                if state is AckState.NOT_ENOUGH_REPLICAS_AFTER_APPEND:
                    part.error_code = ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND
                    part.error_message = "the ISR shrank below min.insync.replicas"
                else:
                    part.error_code = ErrorCode.NOT_LEADER_OR_FOLLOWER
                    part.error_message = "leadership moved before the write was committed"
        pending[:] = still
        return NOT_READY if still else response

    return Polled(
        poll,
        watch,
        timeout_s=max(request.timeout_ms, 0) / 1000,
        on_timeout=_timed_out(services, request, response, appends_to_ack),
    )


def _timed_out(
    services: Services, request: m.ProduceRequest, response: m.ProduceResponse,
    appends_to_ack: list[tuple[Appended, PartResp]],
) -> Callable[[], m.ProduceResponse]:  # fmt: skip
    sync_first = services.config.acks_all_fsync

    def timed_out() -> m.ProduceResponse:
        for appended, part in appends_to_ack:
            if part.error_code != 0:
                continue
            last_offset = appended.last_offset
            if sync_first and appended.log.durable_end_offset <= last_offset:
                part.error_message = f"not durable within timeout_ms={request.timeout_ms}"
            elif appended.replicated and _not_committed(
                services, (appended.topic, appended.partition), last_offset
            ):
                part.error_message = f"not replicated within timeout_ms={request.timeout_ms}"
            else:
                continue
            part.error_code = ErrorCode.REQUEST_TIMED_OUT
            part.base_offset = -1
        return response

    return timed_out


def acks_all_isr(ctx: RequestContext, topic: str, partition: int, term: Term) -> frozenset[int]:
    """The ISR an acks=all write is checked against before its append: the term's, or
    the smaller one ZooKeeper holds for this broker's leadership (the cluster view, which
    Metadata answers from). The view runs ahead of the term from the watch delivering a
    change until the replica manager applies it (a new term after the controller shrank
    the ISR and bumped the epoch); the old term's larger ISR would take a write that then
    fails NOT_ENOUGH_REPLICAS_AFTER_APPEND, after Metadata already showed the small ISR."""
    info = ctx.services.leaders.partition(topic, partition)  # None alone: no other view
    if info is None or info.leader != term.broker_id or info.leader_epoch < term.leader_epoch:
        return term.isr
    stored = frozenset(info.isr)
    return stored if len(stored) < len(term.isr) else term.isr


def _not_committed(services: Services, replicated: tuple[str, int], last_offset: int) -> bool:
    term = services.leaders.leader_term(*replicated)
    # No term: leadership moved, the write never counts here.
    return (term.high_watermark if term else -1) <= last_offset


def check_in_transaction(
    services: Services, topic: str, partition: int, batch: RecordBatchView,
    verified: dict[tuple[str, int], ErrorCode] | None = None,
) -> None:  # fmt: skip
    """A transactional batch goes in only while the coordinator has the partition in the
    producer's ongoing transaction (KIP-890's verification); else its error code.
    ``verified``: the coordinator's answers already asked for."""
    answer = None if verified is None else verified.get((topic, partition))
    if answer is not None and answer != ErrorCode.NONE:
        raise BatchRejected(
            answer, f"{topic}-{partition}: not verified in the producer's transaction"
        )
    code = services.transactions.partition_in_transaction(
        batch.producer_id, batch.producer_epoch, topic, partition
    )
    if code != ErrorCode.NONE:
        raise BatchRejected(
            code, f"partition {topic}-{partition} is not in the producer's transaction"
        )


async def verify_with_coordinator(
    ctx: RequestContext, request: m.ProduceRequest, transactional_id: str
) -> dict[tuple[str, int], ErrorCode]:
    """The coordinator's answer for each partition whose transactional batch would
    begin the producer's transaction there (later batches of the transaction find it
    open in the partition's producer state and need no question)."""
    services = ctx.services
    asked: dict[tuple[int, int], list[tuple[str, int]]] = {}
    for topic_data in request.topic_data:
        topic, name, missing = find_topic(ctx, topic_data.name, topic_data.topic_id)
        if topic is None:
            continue
        for data in topic_data.partition_data:
            if not data.records:
                continue
            led = leading_partition(ctx, topic, name, data.index, missing)
            if isinstance(led, ErrorCode):
                continue  # the partition's guard answers it
            try:
                batch = next(iter_batches(data.records), None)
            except ProtocolError:
                continue  # the append path answers it
            if batch is None or not batch.is_transactional or batch.producer_id < 0:
                continue
            if services.producers.in_open_transaction(
                led.topic, led.index, led.log, batch.producer_id, batch.producer_epoch
            ):
                continue
            key = (batch.producer_id, batch.producer_epoch)
            asked.setdefault(key, []).append((led.topic, led.index))
    verified: dict[tuple[str, int], ErrorCode] = {}
    for (producer_id, producer_epoch), partitions in asked.items():
        answers = await services.transactions.verify_batches(
            transactional_id, producer_id, producer_epoch, partitions
        )
        verified.update(answers)
    return verified
