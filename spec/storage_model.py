"""Executable specification of the partition log's rules, with checkable contracts.

Pure functions over plain data, written in CrossHair's PEP 316 docstring style
(``pre:`` / ``post:``), so they can be checked symbolically::

    .venv/bin/crosshair check --analysis_kind=PEP316 spec/storage_model.py

and are also exercised with Hypothesis by ``tests/unit/storage/test_index.py``.

A log here is a tuple of batches ``(base_offset, last_offset, size)``, oldest
first, with contiguous offsets. The implementation (PartitionLog, MemoryLog) is
held to these rules by the unit tests and the stateful machine.

The model decides on its own: it imports nothing from ``trio_broker``, and each
rule is written the obvious way (a linear scan where the product searches), so a
product bug cannot also be the model's expectation.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

Batch = tuple[int, int, int]  # base_offset, last_offset, size


def is_log(batches: Sequence[Batch]) -> bool:
    """Well-formed: each batch non-empty, positive size, offsets contiguous."""
    return all(b[0] <= b[1] and b[2] > 0 for b in batches) and all(
        a[1] + 1 == b[0] for a, b in itertools.pairwise(batches)
    )


# ------------------------------------------------------------------ index lookup


def index_lookup(keys: list[int], target: int) -> int:
    """The sparse-index lookup: greatest entry at or before ``target``.

    pre: all(keys[i] < keys[i + 1] for i in range(len(keys) - 1))
    post: -1 <= __return__ < len(keys)
    post: __return__ == -1 or keys[__return__] <= target
    post: all(k > target for k in keys[__return__ + 1 :])
    post: __return__ != -1 or all(k > target for k in keys)
    """
    found = -1
    for i, key in enumerate(keys):
        if key <= target:
            found = i
    return found


def index_is_sane(entries: list[tuple[int, int]], segment_size: int, span: int) -> bool:
    """An offset index accepted at open never points outside its segment.

    post: (not __return__) or all(0 < p < segment_size and 0 < o < span for o, p in entries)
    post: (not __return__) or all(a[0] < b[0] and a[1] < b[1] for a, b in zip(entries, entries[1:]))
    post: __return__ or not entries or any(not (0 < p < segment_size and 0 < o < span) for o, p in entries) or any(a[0] >= b[0] or a[1] >= b[1] for a, b in zip(entries, entries[1:]))
    """
    inside = all(0 < p < segment_size and 0 < o < span for o, p in entries)
    increasing = all(a[0] < b[0] and a[1] < b[1] for a, b in itertools.pairwise(entries))
    return inside and increasing


# ------------------------------------------------------------------ reads


def read(
    batches: list[Batch], start: int, max_bytes: int, max_offset: int, min_one: bool
) -> list[int]:
    """Indices of the batches a fetch returns (Kafka semantics, KIP-74).

    Whole batches with last offset >= ``start`` and base offset < ``max_offset``
    (the high watermark), none at all when ``start >= max_offset``; the total
    stays within ``max_bytes`` except for a first batch when ``min_one``.

    pre: is_log(batches)
    post: all(j == i + 1 for i, j in zip(__return__, __return__[1:]))
    post: all(batches[i][1] >= start and batches[i][0] < max_offset for i in __return__)
    post: len(__return__) <= 1 or sum(batches[i][2] for i in __return__) <= max_bytes
    post: (not __return__) or all(b[1] < start for b in batches[: __return__[0]])
    post: start < max_offset or not __return__
    post: (not min_one) or __return__ or start >= max_offset or all(b[1] < start or b[0] >= max_offset for b in batches)
    """
    chosen: list[int] = []
    if start >= max_offset:
        return chosen  # nothing at or after the start is below the bound
    budget = max_bytes
    for i, (base, last, size) in enumerate(batches):
        if last < start:
            continue
        if base >= max_offset:
            break
        if size > budget and not (min_one and not chosen):
            break
        chosen.append(i)
        budget -= size
    return chosen


# ------------------------------------------------------------------ recovery


def recover(batches: list[Batch], valid: list[bool], durable: int) -> int:
    """How many batches survive a crash: the longest prefix of sound ones.

    ``valid[i]`` says whether batch i reached the disk intact; the first
    ``durable`` batches were fsynced, so they are intact whatever happened.

    pre: is_log(batches) and len(valid) == len(batches) and 0 <= durable <= len(batches)
    pre: all(valid[:durable])
    post: durable <= __return__ <= len(batches)
    post: all(valid[:__return__])
    post: __return__ == len(batches) or not valid[__return__]
    """
    kept = 0
    while kept < len(batches) and valid[kept]:
        kept += 1
    return kept


def crash_image(written: bytes, synced: int, cut: int, flips: list[int]) -> bytes:
    """What a file may hold after a crash: the synced prefix, then any damage.

    pre: 0 <= synced <= cut <= len(written)
    pre: all(synced <= f < cut for f in flips)
    post: __return__[:synced] == written[:synced]
    post: len(__return__) == cut
    """
    image = bytearray(written[:cut])
    for f in flips:
        image[f] ^= 0xFF
    return bytes(image)


# ------------------------------------------------------------------ retention


def retention_allows(
    i: int,
    sizes: list[int],
    next_offsets: list[int],
    timestamps: list[int],
    log_start_offset: int,
    now_ms: int,
    retention_ms: int,
    retention_bytes: int,
) -> bool:
    """Whether a rule of docs/storage.md lets retention delete segment ``i`` once the
    segments before it are gone: it lies wholly below the log start offset (DeleteRecords),
    its largest timestamp is older than ``retention_ms``, or the log without it still holds
    at least ``retention_bytes``. ``retention_ms`` / ``retention_bytes`` < 0: no limit.
    """
    below_start = next_offsets[i] <= log_start_offset
    expired = retention_ms >= 0 and now_ms - timestamps[i] > retention_ms
    too_big = retention_bytes >= 0 and sum(sizes[i + 1 :]) >= retention_bytes
    return below_start or expired or too_big


def retention(
    sizes: list[int],
    next_offsets: list[int],
    timestamps: list[int],
    log_start_offset: int,
    now_ms: int,
    retention_ms: int,
    retention_bytes: int,
    high_watermark: int | None = None,
) -> int:
    """How many of the oldest segments a retention pass deletes (docs/storage.md).

    From the oldest, never the active (last) one, while any rule allows it
    (:func:`retention_allows`): so every segment before the first one no rule
    allows goes, and nothing from that one on. ``timestamps[i]`` is segment i's
    largest record timestamp; ``retention_ms`` / ``retention_bytes`` < 0 mean unlimited.
    With ``high_watermark`` (a leader's), a segment goes only once it lies wholly below
    it (its next offset at most the HW: Kafka's ``deletableSegments``), whatever the
    rules say: a segment whose last record sits at the HW holds a record not yet
    committed. None: the whole log is committed (a node alone).

    pre: len(sizes) == len(next_offsets) == len(timestamps) >= 1
    pre: all(s >= 0 for s in sizes)
    post: 0 <= __return__ < len(sizes)
    post: all(next_offsets[i] <= log_start_offset or (retention_ms >= 0 and now_ms - timestamps[i] > retention_ms) or (retention_bytes >= 0 and sum(sizes[i + 1 :]) >= retention_bytes) for i in range(__return__))
    post: high_watermark is None or __return__ == 0 or next_offsets[__return__ - 1] <= high_watermark
    post: __return__ == len(sizes) - 1 or (high_watermark is not None and next_offsets[__return__] > high_watermark) or not (next_offsets[__return__] <= log_start_offset or (retention_ms >= 0 and now_ms - timestamps[__return__] > retention_ms) or (retention_bytes >= 0 and sum(sizes[__return__ + 1 :]) >= retention_bytes))
    """
    count = 0
    while (
        count < len(sizes) - 1
        and (high_watermark is None or next_offsets[count] <= high_watermark)
        and retention_allows(
            count,
            sizes,
            next_offsets,
            timestamps,
            log_start_offset,
            now_ms,
            retention_ms,
            retention_bytes,
        )
    ):
        count += 1
    return count


# ------------------------------------------------------------------ follower truncation


def truncate(batches: list[Batch], target: int, log_start: int) -> int | None:
    """How many batches ``truncate_to(target)`` keeps (Kafka's rule), or None: refused.

    The batch holding ``target`` goes whole, so the log ends at that batch's base
    offset; at or past the log end nothing changes. Below the log start, or where the
    batch holding the log start would go, the truncation is refused.

    Its sentences are checked with Hypothesis (``tests/unit/storage/test_follower_storage.py``;
    CrossHair found no counterexample to a planted bug in them, so they are not
    written as contracts here): the kept batches all end before ``target``, the first
    batch dropped holds or follows it and starts at or after the log start, and a
    refusal means ``target`` is below the log start or inside the batch holding it.
    """
    if batches and target > batches[-1][1]:
        return len(batches)
    if target < log_start:
        return None
    for i, (base, last, _) in enumerate(batches):
        if last >= target:
            return None if base < log_start else i
    return len(batches)
