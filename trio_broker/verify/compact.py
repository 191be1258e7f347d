"""The Spark job's compact facts: the decoder's facts with numbers where it has strings.

The decoder (:mod:`trio_broker.verify.fastdecode`, checked fact for fact against the
reference :func:`~trio_broker.verify.decode.decode_rows`) names a fact's kind, run and
topic with strings. Spark joins, groups and caches millions of facts; on strings each
of those steps hashes and copies bytes per row, and measured at 2.4M frames, numeric
keys made the produce/ack join about 2.5x faster. So before the facts reach Spark:

* ``kind`` becomes its code in :data:`KINDS`;
* ``run`` (given to the decoder as the run's index in sorted run names, a string)
  becomes that int, so ``min(run)`` and ``<>`` mean what they meant on the names;
* ``topic`` becomes :func:`topic_hash` of the topic key (a name, or ``id:<uuid>``),
  and each distinct topic key of a batch is added once as a ``topic_name`` fact
  (``note`` holds the key), from which the job maps hashes back to names for reports.

Runs on the executors inside ``mapInArrow``, like the decoder.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Any

from trio_broker.verify.decode import FACT_FIELDS

#: Fact kinds in code order; ``topic_name`` and ``fetch_request`` are the job's own.
KINDS = (
    "produce_batch", "produce_ack", "fetch_part", "fetch_batch", "topic_id",
    "sync_request", "sync_assign", "commit_request", "commit_ack", "undecodable",
    "topic_name", "fetch_request", "fetch_isolation", "fetch_aborted", "end_txn",
    "end_txn_ack", "partition_leader", "offset_fetch_request", "offset_fetch_answer",
    "coordinator_request", "coordinator_named", "list_offsets_request", "list_offsets_answer",
    "delete_topic", "topic_unknown",
)  # fmt: skip
KIND_CODE = {name: code for code, name in enumerate(KINDS)}

_RETYPED = {"run": ("int32", "int"), "kind": ("int8", "tinyint"), "topic": ("int64", "bigint")}
#: (name, arrow type name, Spark SQL type) of the compact facts.
COMPACT_FIELDS = tuple(
    (name, *_RETYPED.get(name, (arrow, sql))) for name, arrow, sql in FACT_FIELDS
)
COMPACT_DDL = ", ".join(f"{name} {sql}" for name, _, sql in COMPACT_FIELDS)


def topic_hash(key: str) -> int:
    """A stable signed 64-bit key for a topic name or ``id:<uuid>`` (the same on every
    executor and in the driver; a collision among a capture's topics has odds ~n²/2⁶⁴)."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big", signed=True)


def compact_schema() -> Any:
    import pyarrow as pa

    return pa.schema([(name, getattr(pa, typ)()) for name, typ, _ in COMPACT_FIELDS])


def compact(facts: Any) -> list[Any]:
    """One fact batch (:func:`~trio_broker.verify.decode.fact_schema`) as compact
    batches: the facts, then one ``topic_name`` fact per distinct topic key."""
    import numpy as np
    import pyarrow as pa

    schema = compact_schema()
    if not facts.num_rows:
        return []
    kinds = facts.column("kind").dictionary_encode()
    topics = facts.column("topic").dictionary_encode()
    columns: dict[str, Any] = {"run": facts.column("run").cast(pa.int32())}
    codes = np.array([KIND_CODE[k] for k in kinds.dictionary.to_pylist()], np.int8)
    columns["kind"] = pa.array(codes[kinds.indices.to_numpy(zero_copy_only=False)])
    keys = topics.dictionary.to_pylist()
    hashes = pa.array([topic_hash(k) for k in keys], pa.int64())
    columns["topic"] = hashes.take(topics.indices)
    out = [_batch(schema, {f.name: facts.column(f.name) for f in schema} | columns)]
    if keys:
        kind = pa.array([KIND_CODE["topic_name"]] * len(keys), pa.int8())
        out.append(_batch(schema, {"kind": kind, "topic": hashes, "note": pa.array(keys)}))
    return out


def _batch(schema: Any, columns: dict[str, Any]) -> Any:
    """A record batch of ``schema`` from ``columns``, the missing ones all nulls."""
    import pyarrow as pa

    n = len(next(iter(columns.values())))
    return pa.RecordBatch.from_arrays(
        [columns.get(f.name, pa.nulls(n, f.type)) for f in schema], schema=schema
    )


def decode_compact(batches: Iterator[Any]) -> Iterator[Any]:
    """The job's ``mapInArrow`` function: capture rows to compact facts."""
    from trio_broker.verify.fastdecode import decode_batch

    for batch in batches:
        for facts in decode_batch(batch):
            yield from compact(facts)
