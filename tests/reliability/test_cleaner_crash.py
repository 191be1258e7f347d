"""kill -9 a process in the middle of cleaning passes, again and again; then open the log.

The child opens (and so recovers) a compacted log, and loops: append batches of keyed
updates, flush, report each durable update on a pipe, run a cleaning pass (pausing a
little between the swap protocol's steps so kills land inside it). The parent SIGKILLs
it at a random moment, reopens the log and checks: for every key the latest reported
value is there at its offset (or a later update of the key is), no ``.cleaned`` or
``.swap`` file is left, every segment file reads back whole, and a read from each
surviving offset lands on the batch holding it. Then the next child goes on.
"""

from __future__ import annotations

import os
import random
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

from trio_broker.protocol.records import iter_batches
from trio_broker.storage.log import LogConfig, PartitionLog
from trio_broker.storage.recovery import scan_segment
from trio_broker.storage.swap import read_cleaner_checkpoint

#: The kill moments come from a fresh seed each run (printed; ``CLEANER_CRASH_SEED``
#: replays one): runs between them cover the moments. A run stops after ``MIN_KILLS``
#: once ``INTERRUPTED`` kills landed inside a pass (what the test is for), else goes on
#: to ``KILLS`` (a third to a half land there, depending on the machine's load).
KILLS = int(os.environ.get("CLEANER_CRASH_KILLS", "25"))
MIN_KILLS = min(12, KILLS)
INTERRUPTED = 3
TIME_BUDGET_S = 120.0
CONFIG = LogConfig(
    segment_bytes=4096,
    index_interval_bytes=256,
    retention_ms=None,
    compact=True,
    delete=False,
    min_cleanable_dirty_ratio=0.0,
)

CHILD = r"""
import os, random, sys, time
from trio_broker.protocol.records import build_batch
from trio_broker.storage.cleaner import clean_log
from trio_broker.storage.log import LogConfig, PartitionLog

directory, seed = sys.argv[1], int(sys.argv[2])
config = LogConfig(segment_bytes=4096, index_interval_bytes=256, retention_ms=None,
                   compact=True, delete=False, min_cleanable_dirty_ratio=0.0)
log = PartitionLog.open(directory, config)
os.write(1, b"ready %d\n" % log.log_end_offset)
rng = random.Random(seed)
seq = 0
while True:
    pending = []
    for _ in range(rng.randint(3, 15)):
        pairs = []
        for _ in range(rng.randint(1, 4)):
            key = rng.randrange(20)
            seq += 1
            pairs.append((b"k%d" % key, b"%d:%d:" % (key, seq) + b"x" * rng.randrange(200)))
        result = log.append(build_batch(pairs, base_timestamp=1000), now_ms=1000)
        pending.extend((result.base_offset + i, k, v) for i, (k, v) in enumerate(pairs))
    log.flush()
    os.write(1, b"".join(b"d %d %s %s\n" % (o, k, v) for o, k, v in pending))
    clean_log(log, int(time.time() * 1000), after_step=lambda _name: time.sleep(rng.random() * 0.03))
"""


def check_log(directory: Path, reported: dict[bytes, tuple[int, bytes]]) -> int:
    """Open (recover) the log and check it; returns its end offset."""
    log = PartitionLog.open(directory, CONFIG)
    try:
        leftovers = [n for n in os.listdir(directory) if n.endswith((".swap", ".cleaned"))]
        assert not leftovers, leftovers
        latest: dict[bytes, tuple[int, bytes | None]] = {}
        offsets: list[int] = []
        for region in log.read(log.log_start_offset, 1 << 30, log.log_end_offset):
            for batch in iter_batches(region.read_bytes()):
                assert batch.crc_is_valid()
                for record in batch.records():
                    offset = batch.offset_of(record)
                    offsets.append(offset)
                    assert record.key is not None
                    latest[record.key] = (offset, record.value)
        assert offsets == sorted(set(offsets))
        for key, (offset, value) in reported.items():
            assert key in latest, key
            found_offset, found_value = latest[key]
            assert found_offset >= offset, (key, offset, found_offset)
            if found_offset == offset:
                assert found_value == value
        gaps_below = read_cleaner_checkpoint(directory)
        for base in log.segment_base_offsets():
            fd = os.open(directory / f"{base:020d}.log", os.O_RDONLY)
            try:
                size = os.fstat(fd).st_size
                scanned = scan_segment(fd, size, base, gaps_below=gaps_below)
                assert scanned.valid_size == size, (base, scanned)
            finally:
                os.close(fd)
        for offset in offsets[:: max(1, len(offsets) // 50)]:
            region = log.read(offset, 1, log.log_end_offset)[0]
            first = next(iter_batches(region.read_bytes()))
            assert first.base_offset <= offset <= first.last_offset
        return log.log_end_offset
    finally:
        log.close()


def test_kill9_during_cleaning_loses_no_latest_value(tmp_path: Path) -> None:
    directory = tmp_path / "log"
    seed = int(os.environ.get("CLEANER_CRASH_SEED", "0")) or random.randrange(1, 1 << 32)
    print(f"CLEANER_CRASH_SEED={seed}")
    rng = random.Random(seed)
    reported: dict[bytes, tuple[int, bytes]] = {}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    started = time.monotonic()
    kills = 0
    interrupted = 0  # kills that left a pass's files behind
    while (
        kills < KILLS
        and time.monotonic() - started < TIME_BUDGET_S
        and not (kills >= MIN_KILLS and interrupted >= INTERRUPTED)
    ):
        proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(directory), str(rng.randrange(1 << 30))],
            stdout=subprocess.PIPE,
            env=env,
        )
        assert proc.stdout is not None
        buffer = b""
        # The kill is timed from the child's "ready" (its log open), not from its start: on a
        # busy machine the imports alone can outlast the whole window.
        uptime = rng.uniform(0.3, 1.5)
        kill_at = time.monotonic() + 60.0  # until "ready"
        try:
            while time.monotonic() < kill_at:
                ready, _, _ = select.select([proc.stdout], [], [], 0.05)
                if ready:
                    chunk = os.read(proc.stdout.fileno(), 1 << 16)
                    if not chunk:
                        break
                    buffer += chunk
                    *lines, buffer = buffer.split(b"\n")
                    for line in lines:
                        if line.startswith(b"ready "):
                            kill_at = time.monotonic() + uptime
                        elif line.startswith(b"d "):
                            _, offset, key, value = line.split(b" ", 3)
                            reported[key] = (int(offset), value)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        assert proc.returncode == -signal.SIGKILL, f"child died by itself: {proc.returncode}"
        kills += 1
        names = os.listdir(directory)
        interrupted += any(n.endswith((".swap", ".cleaned")) for n in names)
        check_log(directory, reported)
    assert kills >= min(KILLS, 5)
    assert len(reported) == 20
    print(f"{kills} kills, {interrupted} inside a cleaning pass's file work")
    # The point of the test: recovery of half-done passes ran (about 60% of kills land there).
    assert interrupted >= min(INTERRUPTED, kills // 5), (kills, interrupted)
