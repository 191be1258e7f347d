"""The cleaner task (server/log_cleaner.py) over real log directories, in Trio."""

from __future__ import annotations

import os
import time
from pathlib import Path

import trio

from trio_broker.protocol.records import Record, build_batch, iter_batches
from trio_broker.server.log_cleaner import LogCleaner
from trio_broker.storage.cleaner import Throttler, clean_log
from trio_broker.storage.log import LogConfig, PartitionLog

CONFIG = LogConfig(
    segment_bytes=64 * 1024,
    retention_ms=None,
    compact=True,
    delete=False,
    min_cleanable_dirty_ratio=0.0,
    file_delete_delay_ms=0,
)


def wall_ms() -> int:
    return int(time.time() * 1000)


def fill(log: PartitionLog, batches: int, keys: int = 10) -> None:
    ts = wall_ms() - 60_000
    for i in range(batches):
        records = [Record(j, 0, b"k%d" % ((i * 7 + j) % keys), b"v" * 200) for j in range(10)]
        log.append(build_batch(records, base_timestamp=ts), now_ms=ts)
    log.flush()


def content(log: PartitionLog) -> list[tuple[int, bytes | None]]:
    rows = []
    for region in log.read(log.log_start_offset, 1 << 30, log.log_end_offset):
        for batch in iter_batches(region.read_bytes()):
            rows.extend((batch.offset_of(r), r.value) for r in batch.records())
    return rows


async def test_cleaner_task_cleans_the_dirtiest_log_and_leaves_the_rest(tmp_path: Path) -> None:
    dirty = PartitionLog.open(tmp_path / "dirty", CONFIG)
    plain = PartitionLog.open(tmp_path / "plain", LogConfig(segment_bytes=64 * 1024))
    fill(dirty, 300)
    fill(plain, 300)
    plain_before = content(plain)
    cleaner = LogCleaner(
        lambda: [dirty, plain], wall_ms, backoff_ms=10, io_max_bytes_per_second=float("inf")
    )
    result = await cleaner.clean_once()
    assert result is not None and result.records_dropped > 0
    assert cleaner.passes == 1
    assert content(plain) == plain_before  # delete-policy logs are never compacted
    keys_in_cleaned = [o for o, _ in content(dirty) if o < dirty.active_segment().base_offset]
    assert len(keys_in_cleaned) == 10
    assert await cleaner.clean_once() is None  # nothing dirty any more
    dirty.close()
    plain.close()


async def test_readers_of_replaced_segments_keep_reading(tmp_path: Path) -> None:
    log = PartitionLog.open(tmp_path / "log", CONFIG)
    fill(log, 300)
    regions = log.read(0, 1 << 30, log.log_end_offset)
    before = [region.read_bytes() for region in regions]
    assert clean_log(log, wall_ms()) is not None
    # The old descriptors still read the old bytes (sendfile of a fetch in flight) ...
    assert [region.read_bytes() for region in regions] == before
    # ... until file.delete.delay.ms is over (0 here) and retention closes them.
    log.apply_retention(wall_ms())
    log.close()


async def test_shutdown_stops_a_throttled_pass_without_leaving_files(tmp_path: Path) -> None:
    log = PartitionLog.open(tmp_path / "log", CONFIG)
    fill(log, 600)
    before = content(log)
    cleaner = LogCleaner(lambda: [log], wall_ms, backoff_ms=10, io_max_bytes_per_second=200_000)
    started = trio.current_time()
    with trio.move_on_after(0.5):
        await cleaner.run()
    # The pass (well over a second at this rate) stopped soon after the cancellation.
    assert trio.current_time() - started < 3
    assert cleaner.passes == 0
    assert not [n for n in os.listdir(tmp_path / "log") if n.endswith((".cleaned", ".swap"))]
    assert content(log) == before
    log.close()


def test_throttler_holds_the_rate() -> None:
    now = [0.0]
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    throttler = Throttler(1000.0, clock=lambda: now[0], sleep=sleep)
    for _ in range(10):
        throttler.maybe_throttle(500)
    assert abs(now[0] - 5.0) < 1e-9  # 5,000 bytes at 1,000 B/s
    unlimited = Throttler(float("inf"), clock=lambda: now[0], sleep=sleep)
    count = len(slept)
    unlimited.maybe_throttle(10**9)
    assert len(slept) == count
