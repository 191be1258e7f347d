"""kill -9 a real writer process, again and again; nothing it called durable may be lost.

The child opens (and so recovers) the log, runs the Flusher with 8 concurrent
acks=all writers, and after each ``wait_durable`` reports the batch's base
offset and CRC on a pipe. The parent SIGKILLs it at a random moment (some
during startup recovery), reopens the log, and checks that every reported
batch is there, byte-identical (same CRC) and that the whole log is contiguous
and CRC-valid. Then the next child continues the same log.

A process kill keeps the page cache, so this exercises torn appends, recovery
being killed half-way, and the Flusher's bookkeeping - not power loss (the
storage state machine simulates that).
"""

from __future__ import annotations

import os
import random
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from trio_broker.protocol import batch_header
from trio_broker.storage.log import LogConfig, PartitionLog

#: The kill moments come from a fresh seed each run (printed; ``CRASH_SEED`` replays
#: one): runs between them cover the moments, so one run needs no more than 25 kills
#: (a run of 25 checked 514 durable batches; the floor below is 100).
KILLS = int(os.environ.get("CRASH_KILLS", "25"))
CONFIG = LogConfig(segment_bytes=256 * 1024, index_interval_bytes=4096, retention_ms=None)

CHILD = r"""
import os, random, sys
import trio
from trio_broker.protocol import batch_header
from trio_broker.protocol.records import build_batch
from trio_broker.server.flusher import Flusher
from trio_broker.storage.log import LogConfig, PartitionLog

directory, seed = sys.argv[1], int(sys.argv[2])
config = LogConfig(segment_bytes=256 * 1024, index_interval_bytes=4096, retention_ms=None)
log = PartitionLog.open(directory, config)
os.write(1, b"ready %d\n" % log.log_end_offset)

async def writer(flusher, wid):
    rng = random.Random(seed * 100 + wid)
    seq = 0
    while True:
        size = rng.choice([100, 1000, 4000, 20000])
        values = [b"%d:%d:" % (wid, seq) + bytes([wid]) * size for _ in range(rng.randint(1, 3))]
        batch = build_batch([(None, v) for v in values], base_timestamp=seq)
        result = log.append(batch, now_ms=seq)
        flusher.mark_dirty(log)
        await flusher.wait_durable(log, result.last_offset)
        os.write(1, b"d %d %d %d\n" % (result.base_offset, result.last_offset, batch_header.stored_crc(batch)))
        seq += 1

async def main():
    flusher = Flusher()
    async with trio.open_nursery() as nursery:
        await nursery.start(flusher.run)
        for wid in range(8):
            nursery.start_soon(writer, flusher, wid)

trio.run(main)
"""


class _Reader(threading.Thread):
    """Drains the child's stdout so it never blocks on a full pipe."""

    def __init__(self, stream: int) -> None:
        super().__init__(daemon=True)
        self.stream = stream
        self.data = bytearray()
        self.ready = threading.Event()

    def run(self) -> None:
        while True:
            readable, _, _ = select.select([self.stream], [], [], 5)
            if not readable:
                continue
            chunk = os.read(self.stream, 65536)
            if not chunk:
                return
            self.data += chunk
            if b"ready" in self.data:
                self.ready.set()


def _verify(directory: Path, durable: dict[int, tuple[int, int]]) -> PartitionLog:
    log = PartitionLog.open(directory, CONFIG)
    data = b"".join(r.read_bytes() for r in log.read(0, 1 << 40, log.log_end_offset))
    pos, expected = 0, 0
    stored: dict[int, tuple[int, int]] = {}
    while pos < len(data):
        header = batch_header.unpack_header(data, pos)
        assert header.base_offset == expected, "offsets are not contiguous"
        assert batch_header.crc_matches(data[pos : pos + header.size]), (
            f"corrupt batch at {expected}"
        )
        stored[header.base_offset] = (header.last_offset, header.crc)
        expected = header.last_offset + 1
        pos += header.size
    assert expected == log.log_end_offset
    for base, (last, crc) in durable.items():
        assert stored.get(base) == (last, crc), f"durable batch {base} lost or changed"
    return log


@pytest.mark.slow
def test_kill_minus_nine_loses_nothing_durable(tmp_path: Path) -> None:
    directory = tmp_path / "crash-0"
    seed = int(os.environ.get("CRASH_SEED", "0")) or random.randrange(1, 1 << 32)
    print(f"CRASH_SEED={seed}")
    rng = random.Random(seed)
    durable: dict[int, tuple[int, int]] = {}
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    kills = early_kills = 0
    # One kill per round, each round bounded by its own waits (the child's readiness,
    # the reader's join): a slow machine makes the test slower, never red.
    while kills < KILLS:
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(directory), str(rng.randrange(1 << 30))],
            stdout=subprocess.PIPE,
            env=env,
        )
        assert child.stdout is not None
        reader = _Reader(child.stdout.fileno())
        reader.start()
        if rng.random() < 0.15:
            time.sleep(rng.uniform(0.0, 0.5))  # often still recovering or starting up
            early_kills += not reader.ready.is_set()
        else:
            assert reader.ready.wait(60), "child never became ready"
            time.sleep(rng.uniform(0.01, 0.25))
        child.send_signal(signal.SIGKILL)
        child.wait()
        reader.join(10)
        child.stdout.close()
        kills += 1
        # A line cut short by the kill was never fully reported: skip it.
        for line in reader.data.decode().split("\n")[:-1]:
            if line.startswith("d "):
                base, last, crc = map(int, line.split()[1:])
                durable[base] = (last, crc)
        assert child.returncode == -signal.SIGKILL, "the child died on its own"
        log = _verify(directory, durable)
        assert log.log_end_offset >= max((last + 1 for last, _ in durable.values()), default=0)
        # Leave it unclean half the time so the next child recovers too.
        if rng.random() < 0.5:
            log.close()
        else:
            log.abort()
    assert len(durable) > 100, "the children hardly wrote anything"
    print(f"{kills} kills ({early_kills} during startup), {len(durable)} durable batches checked")
