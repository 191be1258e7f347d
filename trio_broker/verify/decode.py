"""Frame decoding for the verification job: capture rows in, fact rows out.

Everything here runs on Spark executors inside ``mapInArrow`` (so it lives in
an importable module) and uses only our codec on the raw frame bytes — never
the broker's own bookkeeping. One capture row yields zero or more facts, all in
one wide schema (:data:`FACT_FIELDS`); ``kind`` says which columns are set:

``produce_batch``  a batch in a Produce request (topic/partition, crc, producer fields,
                   ``attributes``: transactional 0x10, control 0x20)
``produce_ack``    a partition in a Produce response (error, base offset)
``fetch_part``     a partition in a Fetch response (error, high watermark in ``offset``, last
                   stable offset in ``last_offset``)
``fetch_batch``    a batch in a Fetch response (``idx`` = its position in the partition,
                   ``leader_epoch`` = the partitionLeaderEpoch its leader stamped on it)
``topic_id``       a (name, topic id) pair from a Metadata response
``partition_leader`` a partition of a Metadata response that names a leader (``leader_id``)
                   and its ``leader_epoch`` (v7+; none is kept without both)
``sync_request``   a SyncGroup request (group, generation, member)
``sync_assign``    one (topic, partition) of a SyncGroup response's assignment
``commit_request`` a partition in an OffsetCommit request (group, generation, member, offset)
``commit_ack``     a partition in an OffsetCommit response (error)
``offset_fetch_request`` a group of an OffsetFetch request (``group_id``; v8+ asks for several)
``offset_fetch_answer`` a partition of an OffsetFetch response (committed offset, error;
                   ``group_id`` from v8 on, before that the request's)
``coordinator_request`` a FindCoordinator request for a group (v0-3: its ``group_id``)
``coordinator_named`` a FindCoordinator answer naming a group's coordinator (``leader_id``;
                   ``group_id`` from v4 on, before that the request's)
``fetch_isolation`` a Fetch request's ``isolation_level`` (0 read_uncommitted, 1 read_committed)
``fetch_aborted``  one aborted transaction of a Fetch response partition (producer id, first
                   offset in ``offset``)
``end_txn``        an EndTxn request (producer id/epoch, ``committed``, transactional id in ``note``)
``end_txn_ack``    an EndTxn response (error)
``list_offsets_request`` a partition of a ListOffsets request (the timestamp asked for in
                   ``offset``: -1 latest, -2 earliest; ``isolation_level``)
``list_offsets_answer`` a partition of a ListOffsets response (error, the offset answered)
``delete_topic``   a topic named (or, v6+, given by id) in a DeleteTopics request
``topic_unknown``  a topic a Metadata response answered UNKNOWN_TOPIC_OR_PARTITION or
                   UNKNOWN_TOPIC_ID for
``undecodable``    a frame our codec could not decode (``note`` says why)
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any

from trio_broker.protocol.messages import ApiKey, decode_request, decode_response
from trio_broker.protocol.records import split_batches

PRODUCE, FETCH, METADATA = ApiKey.PRODUCE, ApiKey.FETCH, ApiKey.METADATA
OFFSET_COMMIT, SYNC_GROUP = ApiKey.OFFSET_COMMIT, ApiKey.SYNC_GROUP
OFFSET_FETCH, FIND_COORDINATOR = ApiKey.OFFSET_FETCH, ApiKey.FIND_COORDINATOR
END_TXN = ApiKey.END_TXN
LIST_OFFSETS, DELETE_TOPICS = ApiKey.LIST_OFFSETS, ApiKey.DELETE_TOPICS
#: Metadata topic errors saying the broker does not know the topic.
UNKNOWN_TOPIC_ERRORS = (3, 100)  # UNKNOWN_TOPIC_OR_PARTITION, UNKNOWN_TOPIC_ID
#: Fetch requests carry ``isolation_level`` from v4 on; older ones read uncommitted.
FETCH_ISOLATION_VERSION = 4
#: Fetch v15+ dropped ``replica_id`` from the body (KIP-903 moved it to a tagged field).
FETCH_NO_REPLICA_ID_VERSION = 15
FETCH_FIRST_FLEXIBLE_REQUEST = 12

#: (name, arrow type name, Spark SQL type)
FACT_FIELDS: tuple[tuple[str, str, str], ...] = (
    ("run", "string", "string"),
    ("conn", "int64", "bigint"),
    ("corr", "int32", "int"),
    ("ts", "int64", "bigint"),
    ("kind", "string", "string"),
    ("topic", "string", "string"),
    ("partition", "int32", "int"),
    ("idx", "int32", "int"),
    ("error", "int32", "int"),
    ("offset", "int64", "bigint"),
    ("last_offset", "int64", "bigint"),
    ("crc", "int64", "bigint"),
    ("record_count", "int32", "int"),
    ("producer_id", "int64", "bigint"),
    ("producer_epoch", "int32", "int"),
    ("base_sequence", "int32", "int"),
    ("group_id", "string", "string"),
    ("generation", "int32", "int"),
    ("member_id", "string", "string"),
    ("note", "string", "string"),
    ("attributes", "int32", "int"),
    ("isolation_level", "int32", "int"),
    ("committed", "int32", "int"),
    ("leader_id", "int32", "int"),
    ("leader_epoch", "int32", "int"),
)
FACT_DDL = ", ".join(f"{name} {sql}" for name, _, sql in FACT_FIELDS)
_NAMES = tuple(name for name, _, _ in FACT_FIELDS)


def fact_schema() -> Any:
    import pyarrow as pa

    return pa.schema([(name, getattr(pa, typ)()) for name, typ, _ in FACT_FIELDS])


def topic_key(name: str | None, topic_id: Any) -> str:
    """A topic's name, or ``id:<uuid>`` when the frame names it by id (Produce v13, Fetch v13+)."""
    if name:
        return name
    return f"id:{topic_id}"


def decode_assignment(data: bytes | memoryview) -> list[tuple[str, int]]:
    """ConsumerProtocolAssignment (any version): [(topic, partition)]; user data ignored."""
    view = memoryview(data)
    pos = 2  # int16 version
    (topics,) = struct.unpack_from(">i", view, pos)
    pos += 4
    out: list[tuple[str, int]] = []
    for _ in range(max(topics, 0)):
        (length,) = struct.unpack_from(">h", view, pos)
        pos += 2
        topic = bytes(view[pos : pos + length]).decode()
        pos += length
        (count,) = struct.unpack_from(">i", view, pos)
        pos += 4
        for _ in range(max(count, 0)):
            out.append((topic, struct.unpack_from(">i", view, pos)[0]))
            pos += 4
    return out


def fetch_isolation(frame: bytes | memoryview) -> tuple[int, int]:
    """(correlation id, isolation level) of a Fetch request frame, read from its fixed
    prefix only: the request header, then replica id (before v15), max wait, min bytes,
    max bytes and the isolation level (v4+; 0 before). The rest (fetch positions) is
    not decoded: the checks need only this byte, and a consumer sends Fetch requests by
    the million. Raises ``struct.error``/``ValueError`` on a frame too short for it."""
    view = memoryview(frame)
    _, version, corr, client_id_size = struct.unpack_from(">hhih", view, 0)
    pos = 10 + max(client_id_size, 0)
    if version >= FETCH_FIRST_FLEXIBLE_REQUEST:
        if view[pos] != 0:  # tagged header fields: none are sent by clients we know
            raise ValueError("fetch request header with tagged fields")
        pos += 1
    if version < FETCH_ISOLATION_VERSION:
        struct.unpack_from(">iii", view, pos)
        return corr, 0
    pos += 12 if version >= FETCH_NO_REPLICA_ID_VERSION else 16
    (level,) = struct.unpack_from(">b", view, pos)
    return corr, level


def _facts_for_row(
    run: str, conn: int, ts: int, direction: str, api_key: int, version: int, frame: bytes
) -> Iterator[dict[str, Any]]:
    body: Any
    if direction == "request":
        if api_key == FETCH:
            corr, level = fetch_isolation(frame)
            yield {"run": run, "conn": conn, "corr": corr, "ts": ts,
                   "kind": "fetch_isolation", "isolation_level": level}  # fmt: skip
            return
        if api_key not in (PRODUCE, OFFSET_COMMIT, OFFSET_FETCH, FIND_COORDINATOR, SYNC_GROUP,
                           END_TXN, LIST_OFFSETS, DELETE_TOPICS):  # fmt: skip
            return
        header, body = decode_request(frame)
        corr = header.correlation_id
        base = {"run": run, "conn": conn, "corr": corr, "ts": ts}
        if api_key == PRODUCE:
            for topic in body.topic_data:
                key = topic_key(topic.name, topic.topic_id)
                for part in topic.partition_data:
                    if part.records is None:
                        continue
                    batches, _ = split_batches(part.records)
                    for idx, b in enumerate(batches):
                        yield {
                            **base, "kind": "produce_batch", "topic": key,
                            "partition": part.index, "idx": idx, "crc": b.crc,
                            "record_count": b.last_offset_delta + 1,
                            "producer_id": b.producer_id, "producer_epoch": b.producer_epoch,
                            "base_sequence": b.base_sequence, "attributes": b.attributes,
                        }  # fmt: skip
        elif api_key == LIST_OFFSETS:
            for topic in body.topics:
                for part in topic.partitions:
                    yield {
                        **base, "kind": "list_offsets_request", "topic": topic.name,
                        "partition": part.partition_index, "offset": part.timestamp,
                        "isolation_level": body.isolation_level,
                    }  # fmt: skip
        elif api_key == DELETE_TOPICS:
            deleted = [(t.name, t.topic_id) for t in body.topics or ()]
            deleted += [(name, None) for name in body.topic_names or ()]
            for name, topic_id in deleted:
                yield {**base, "kind": "delete_topic", "topic": topic_key(name, topic_id)}
        elif api_key == END_TXN:
            yield {
                **base, "kind": "end_txn", "producer_id": body.producer_id,
                "producer_epoch": body.producer_epoch, "committed": int(body.committed),
                "note": body.transactional_id,
            }  # fmt: skip
        elif api_key == OFFSET_COMMIT:
            for topic in body.topics:
                key = topic_key(topic.name, getattr(topic, "topic_id", None))
                for part in topic.partitions:
                    yield {
                        **base, "kind": "commit_request", "topic": key,
                        "partition": part.partition_index, "offset": part.committed_offset,
                        "group_id": body.group_id,
                        "generation": body.generation_id_or_member_epoch,
                        "member_id": body.member_id,
                    }  # fmt: skip
        elif api_key == FIND_COORDINATOR:
            if not body.coordinator_keys and getattr(body, "key_type", 0) == 0:  # v0-3, a group
                yield {**base, "kind": "coordinator_request", "group_id": body.key}
        elif api_key == OFFSET_FETCH:
            groups = [g.group_id for g in body.groups] if body.groups else [body.group_id]
            for group_id in groups:
                yield {**base, "kind": "offset_fetch_request", "group_id": group_id}
        else:
            yield {
                **base, "kind": "sync_request", "group_id": body.group_id,
                "generation": body.generation_id, "member_id": body.member_id,
            }  # fmt: skip
        return
    if api_key not in (
        PRODUCE, FETCH, METADATA, OFFSET_COMMIT, OFFSET_FETCH, FIND_COORDINATOR, SYNC_GROUP,
        END_TXN, LIST_OFFSETS,
    ):  # fmt: skip
        return
    corr, body = decode_response(api_key, version, frame)
    base = {"run": run, "conn": conn, "corr": corr, "ts": ts}
    if api_key == PRODUCE:
        for topic in body.responses:
            key = topic_key(topic.name, topic.topic_id)
            for part in topic.partition_responses:
                yield {
                    **base, "kind": "produce_ack", "topic": key, "partition": part.index,
                    "error": part.error_code, "offset": part.base_offset,
                }  # fmt: skip
    elif api_key == FETCH:
        for topic in body.responses:
            key = topic_key(topic.topic, topic.topic_id)
            for part in topic.partitions:
                p = part.partition_index
                yield {
                    **base, "kind": "fetch_part", "topic": key, "partition": p,
                    "error": part.error_code, "offset": part.high_watermark,
                    "last_offset": part.last_stable_offset,
                }  # fmt: skip
                for aborted in part.aborted_transactions or ():
                    yield {
                        **base, "kind": "fetch_aborted", "topic": key, "partition": p,
                        "producer_id": aborted.producer_id, "offset": aborted.first_offset,
                    }  # fmt: skip
                if part.error_code != 0 or part.records is None:
                    continue
                batches, _ = split_batches(part.records)
                for idx, b in enumerate(batches):
                    yield {
                        **base, "kind": "fetch_batch", "topic": key, "partition": p,
                        "idx": idx, "offset": b.base_offset, "last_offset": b.last_offset,
                        "crc": b.crc, "record_count": b.record_count,
                        "producer_id": b.producer_id, "producer_epoch": b.producer_epoch,
                        "base_sequence": b.base_sequence, "attributes": b.attributes,
                        "leader_epoch": b.partition_leader_epoch,
                    }  # fmt: skip
    elif api_key == END_TXN:
        yield {**base, "kind": "end_txn_ack", "error": body.error_code}
    elif api_key == LIST_OFFSETS:
        for topic in body.topics:
            for part in topic.partitions:
                # v0 answers a list of offsets, newest first.
                offset = part.old_style_offsets[0] if part.old_style_offsets else part.offset
                yield {
                    **base, "kind": "list_offsets_answer", "topic": topic.name,
                    "partition": part.partition_index, "error": part.error_code,
                    "offset": offset,
                }  # fmt: skip
    elif api_key == OFFSET_COMMIT:
        for topic in body.topics:
            key = topic_key(topic.name, getattr(topic, "topic_id", None))
            for part in topic.partitions:
                yield {
                    **base, "kind": "commit_ack", "topic": key,
                    "partition": part.partition_index, "error": part.error_code,
                }  # fmt: skip
    elif api_key == FIND_COORDINATOR:
        # v4+ answers per key (a transactional id's answer has no request fact to join,
        # and only groups' are looked up); before that one node for the request's key.
        named = (
            [(c.key, c.node_id, c.error_code) for c in body.coordinators]
            if body.coordinators
            else [(None, body.node_id, body.error_code)]
        )
        for group_id, node_id, error in named:
            if error == 0 and node_id >= 0:
                yield {**base, "kind": "coordinator_named", "group_id": group_id,
                       "leader_id": node_id}  # fmt: skip
    elif api_key == OFFSET_FETCH:
        # v8+ answers per group; older versions answer the request's one group.
        answered = (
            [(g.group_id, g.topics) for g in body.groups]
            if body.groups
            else [(None, body.topics or [])]
        )
        for group_id, topics in answered:
            for topic in topics:
                key = topic_key(topic.name, getattr(topic, "topic_id", None))
                for part in topic.partitions:
                    yield {
                        **base, "kind": "offset_fetch_answer", "topic": key,
                        "partition": part.partition_index, "offset": part.committed_offset,
                        "error": part.error_code, "group_id": group_id,
                    }  # fmt: skip
    elif api_key == METADATA:
        for topic in body.topics:
            if topic.error_code in UNKNOWN_TOPIC_ERRORS and (topic.name or topic.topic_id):
                key = topic_key(topic.name, topic.topic_id)
                yield {**base, "kind": "topic_unknown", "topic": key, "error": topic.error_code}
            if topic.name and topic.topic_id is not None and int(topic.topic_id.int) != 0:
                yield {
                    **base,
                    "kind": "topic_id",
                    "topic": topic.name,
                    "note": f"id:{topic.topic_id}",
                }
            if not topic.name:
                continue
            for part in topic.partitions:
                epoch = getattr(part, "leader_epoch", -1)
                if part.leader_id >= 0 and epoch >= 0:
                    yield {
                        **base, "kind": "partition_leader", "topic": topic.name,
                        "partition": part.partition_index, "leader_id": part.leader_id,
                        "leader_epoch": epoch,
                    }  # fmt: skip
    elif body.error_code == 0 and body.assignment:
        for topic_name, partition in decode_assignment(body.assignment):
            yield {**base, "kind": "sync_assign", "topic": topic_name, "partition": partition}


def decode_rows(columns: dict[str, list[Any]]) -> dict[str, list[Any]]:
    """Capture columns (plus ``run``) to fact columns."""
    out: dict[str, list[Any]] = {name: [] for name in _NAMES}
    n = len(columns["frame"])
    for i in range(n):
        run = columns["run"][i]
        conn = columns["connection_id"][i]
        ts = columns["monotonic_ns"][i]
        direction = columns["direction"][i]
        api_key = columns["api_key"][i]
        frame = columns["frame"][i]
        if frame is None:
            continue
        # Shorter than frame_length: a compacted Produce request (capture/compact.py)
        # decodes; a plain prefix does not, and has nothing to verify.
        truncated = len(frame) < columns["frame_length"][i]
        try:
            facts = list(
                _facts_for_row(run, conn, ts, direction, api_key, columns["api_version"][i], frame)
            )
        except Exception as exc:
            if truncated:
                continue
            facts = [
                {
                    "run": run, "conn": conn, "corr": columns["correlation_id"][i], "ts": ts,
                    "kind": "undecodable", "note": f"{direction} api {api_key}: {exc!r}"[:300],
                }
            ]  # fmt: skip
        for fact in facts:
            for name in _NAMES:
                out[name].append(fact.get(name))
    return out


NEEDED_COLUMNS = (
    "run", "connection_id", "monotonic_ns", "direction", "api_key", "api_version",
    "correlation_id", "frame_length", "frame",
)  # fmt: skip
