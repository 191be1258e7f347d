"""Sparse indexes, the pure lookup, and the spec's contracts under Hypothesis."""

from __future__ import annotations

import importlib.util
import inspect
import itertools
import os
import re
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trio_broker.storage.index import (
    OffsetIndex,
    SegmentIndexer,
    TimeIndex,
    floor_entry,
    offset_index_is_sane,
    quick_check,
)

_SPEC_PATH = Path(__file__).resolve().parents[3] / "spec" / "storage_model.py"


def _load_spec() -> Any:
    spec = importlib.util.spec_from_file_location("spec_storage_model", _SPEC_PATH)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


model = _load_spec()


def check_contracts(fn: Any, **kwargs: Any) -> Any:
    """Evaluate a PEP 316 docstring's pre/post lines for one call (what CrossHair checks).

    Returns the result, or None when a precondition rules the input out.
    """
    doc = inspect.getdoc(fn) or ""
    pres = re.findall(r"^pre: (.+)$", doc, re.M)
    posts = re.findall(r"^post: (.+)$", doc, re.M)
    # The defaults too: a post may name a parameter the call leaves at its default.
    bound = inspect.signature(fn).bind(**kwargs)
    bound.apply_defaults()
    env = {**vars(sys.modules[fn.__module__]), **bound.arguments}
    if not all(eval(p, env) for p in pres):
        return None
    result = fn(**kwargs)
    env["__return__"] = result
    for post in posts:
        assert eval(post, env), f"{fn.__name__}: post {post!r} failed for {kwargs} -> {result}"
    return result


# ------------------------------------------------------------------ floor_entry


@given(st.lists(st.integers(-50, 50)).map(sorted), st.integers(-60, 60))
def test_floor_entry_matches_a_linear_scan(keys: list[int], target: int) -> None:
    expected = max((i for i, k in enumerate(keys) if k <= target), default=-1)
    assert floor_entry(keys, target) == expected
    check_contracts(floor_entry, keys=keys, target=target)


@given(st.lists(st.integers(0, 10**6), unique=True).map(sorted), st.integers(-1, 10**6 + 1))
def test_spec_index_lookup(keys: list[int], target: int) -> None:
    check_contracts(model.index_lookup, keys=keys, target=target)


# ------------------------------------------------------------------ index objects


def test_offset_index_lookups() -> None:
    index = OffsetIndex()
    for rel, pos in [(3, 100), (9, 250), (20, 900)]:
        index.append(rel, pos)
    assert len(index) == 3
    assert index.lookup(0) == (0, 0)  # before the first entry: the segment start
    assert index.lookup(3) == (3, 100)
    assert index.lookup(8) == (3, 100)
    assert index.lookup(10**6) == (20, 900)
    assert index.lookup_position(99) == (0, 0)
    assert index.lookup_position(250) == (9, 250)
    assert index.lookup_position(899) == (9, 250)
    assert index.last_entry() == (20, 900)
    assert list(index.positions()) == [100, 250, 900]
    assert index.entries() == [(3, 100), (9, 250), (20, 900)]
    index.freeze()
    with pytest.raises(ValueError):
        index.append(30, 1000)


def test_time_index_lookup_before() -> None:
    index = TimeIndex()
    for ts, rel in [(100, 0), (200, 5), (300, 9)]:
        index.append(ts, rel)
    assert index.lookup_before(100) == 0  # nothing strictly below: scan from the start
    assert index.lookup_before(101) == 0
    assert index.lookup_before(201) == 5
    assert index.lookup_before(10**9) == 9
    assert index.last_entry() == (300, 9)


def test_indexes_round_trip_through_files(tmp_path: Path) -> None:
    index = OffsetIndex()
    for i in range(1, 100):
        index.append(i * 2, i * 70)
    path = tmp_path / "x.index"
    path.write_bytes(index.raw() + b"\x01\x02\x03")  # a torn trailing entry is ignored
    fd = os.open(path, os.O_RDONLY)
    try:
        sealed = OffsetIndex.load(fd, mutable=False)
        active = OffsetIndex.load(fd, mutable=True)
    finally:
        os.close(fd)
    assert sealed.entries() == active.entries() == index.entries()
    assert sealed.lookup(101) == index.lookup(101) == (100, 3500)
    active.append(500, 10**6)  # a loaded active index keeps growing
    with pytest.raises(ValueError):
        sealed.append(500, 10**6)
    sealed.close()


def test_attach_file_swaps_the_heap_copy_for_a_mapping(tmp_path: Path) -> None:
    index = TimeIndex()
    index.append(5, 1)
    index.append(9, 4)
    index.freeze()
    path = tmp_path / "x.timeindex"
    path.write_bytes(index.raw())
    fd = os.open(path, os.O_RDONLY)
    index.attach_file(fd)
    os.close(fd)
    assert index.lookup_before(9) == 1 and index.last_entry() == (9, 4)
    index.close()


# ------------------------------------------------------------------ indexer


@settings(max_examples=200)
@given(
    st.lists(
        st.tuples(st.integers(61, 500), st.integers(1, 5), st.integers(-1, 1000)), max_size=60
    ),
    st.sampled_from([0, 100, 700]),
)
def test_indexer_entries_are_sparse_sorted_and_correct(
    batches: list[tuple[int, int, int]], interval: int
) -> None:
    indexer = SegmentIndexer(interval)
    position = offset = 0
    starts: dict[int, int] = {}
    running_max: list[int] = []
    for size, count, ts in batches:
        starts[position] = offset
        indexer.on_batch(offset, position, size, ts)
        running_max.append(max([ts, *running_max[-1:]]))
        position += size
        offset += count
    indexer.seal()
    entries = indexer.offset_index.entries()
    assert offset_index_is_sane(entries, position, max(offset, 1))
    check_contracts(
        model.index_is_sane, entries=entries, segment_size=position, span=max(offset, 1)
    )
    for rel, pos in entries:
        assert starts[pos] == rel  # every entry points at a batch start
    positions = [0] + [p for _, p in entries]
    for a, b in itertools.pairwise(positions):
        assert b - a >= interval
    times = indexer.time_index.entries()
    assert all(a[0] < b[0] and a[1] <= b[1] for a, b in itertools.pairwise(times))
    if any(ts >= 0 for _, _, ts in batches):
        assert times[-1][0] == max(ts for _, _, ts in batches) == indexer.max_timestamp
    # the time index is a sound place to start a timestamp search
    offsets = sorted(starts.values())
    for target in range(-1, 1002, 37):
        start = indexer.time_index.lookup_before(target)
        first = next((o for o, m in zip(offsets, _batch_maxes(batches)) if m >= target), None)
        assert first is None or start <= first


def _batch_maxes(batches: list[tuple[int, int, int]]) -> list[int]:
    return [ts for _, _, ts in batches]


def test_offset_index_is_sane_rejects_bad_entries() -> None:
    assert offset_index_is_sane([], 0, 0)
    assert offset_index_is_sane([(1, 10), (5, 90)], 100, 6)
    assert not offset_index_is_sane([(1, 10), (5, 100)], 100, 6)  # past the end
    assert not offset_index_is_sane([(1, 10), (6, 90)], 100, 6)  # offset past the span
    assert not offset_index_is_sane([(5, 10), (1, 90)], 100, 6)  # not increasing
    assert not offset_index_is_sane([(0, 10)], 100, 6)  # relative 0 lives at position 0


def test_quick_check() -> None:
    index, times = OffsetIndex(), TimeIndex()
    index.append(4, 300)
    times.append(77, 4)
    assert quick_check(index, times, 400, 10)
    assert not quick_check(index, times, 300, 10)
    assert not quick_check(index, times, 400, 4)


# ------------------------------------------------------------------ spec contracts


log_strategy = st.lists(st.tuples(st.integers(1, 4), st.integers(1, 300)), max_size=25).map(
    lambda specs: _as_log(specs)
)


def _as_log(specs: list[tuple[int, int]]) -> list[tuple[int, int, int]]:
    out, offset = [], 0
    for count, size in specs:
        out.append((offset, offset + count - 1, size))
        offset += count
    return out


@given(log_strategy, st.integers(0, 120), st.integers(-5, 2000), st.integers(0, 120), st.booleans())
def test_spec_read(batches, start, max_bytes, max_offset, min_one) -> None:
    check_contracts(
        model.read,
        batches=batches,
        start=start,
        max_bytes=max_bytes,
        max_offset=max_offset,
        min_one=min_one,
    )


@given(log_strategy, st.data())
def test_spec_recover(batches, data) -> None:
    durable = data.draw(st.integers(0, len(batches)))
    valid = [True] * durable + data.draw(
        st.lists(st.booleans(), min_size=len(batches) - durable, max_size=len(batches) - durable)
    )
    check_contracts(model.recover, batches=batches, valid=valid, durable=durable)


@given(st.binary(max_size=200), st.data())
def test_spec_crash_image(written, data) -> None:
    synced = data.draw(st.integers(0, len(written)))
    cut = data.draw(st.integers(synced, len(written)))
    flips = data.draw(st.lists(st.integers(synced, max(synced, cut - 1)), max_size=5))
    flips = [f for f in flips if f < cut]
    check_contracts(model.crash_image, written=written, synced=synced, cut=cut, flips=flips)


@given(
    st.lists(
        st.tuples(st.integers(0, 500), st.integers(1, 10), st.integers(0, 100)),
        min_size=1,
        max_size=10,
    ),
    st.integers(0, 60),
    st.integers(0, 200),
    st.integers(-1, 100),
    st.integers(-1, 3000),
    st.none() | st.integers(0, 60),
)
def test_spec_retention(
    segments, log_start, now, retention_ms, retention_bytes, high_watermark
) -> None:
    sizes = [s for s, _, _ in segments]
    next_offsets, offset = [], 0
    for _, count, _ in segments:
        offset += count
        next_offsets.append(offset)
    timestamps = [t for _, _, t in segments]
    check_contracts(
        model.retention,
        sizes=sizes,
        next_offsets=next_offsets,
        timestamps=timestamps,
        log_start_offset=log_start,
        now_ms=now,
        retention_ms=retention_ms,
        retention_bytes=retention_bytes,
        high_watermark=high_watermark,
    )
