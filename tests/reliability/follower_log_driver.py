"""A follower's partition log under load, for test_follower_power_cut.py (run as a script).

    python -m tests.reliability.follower_log_driver DIR SEED

Opens (recovering) the log in DIR and loops until killed: replicated appends of
small batches (a new leader epoch now and then), a flush after some of them, and
every few appends a ``truncate_to`` somewhere in the last few batches. Each step is
announced on stdout before it starts and confirmed after it returns, one line at a
time, so that the test, reading the pipe after a kill -9, knows which promises
were made: ``append HEX``, ``flushed END``, ``truncating OFFSET``,
``truncated END``. Batches are built from the seed; nothing else decides.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

from trio_broker.protocol import batch_header
from trio_broker.protocol.records import build_batch
from trio_broker.storage.epoch_cache import set_batch_leader_epoch
from trio_broker.storage.log import LogConfig, PartitionLog

#: Small segments: truncations cross segment boundaries often.
CONFIG = LogConfig(segment_bytes=1500, index_interval_bytes=200, retention_ms=None)


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main(directory: Path, seed: int) -> None:
    rng = random.Random(seed)
    log = PartitionLog.open(directory, CONFIG)
    epoch = max(0, log.epoch_cache.latest_epoch)
    say(f"open {log.log_end_offset}")
    tag = 0
    while True:
        tag += 1
        if rng.random() < 0.05:
            epoch += 1
        records = rng.randint(1, 3)
        batch = build_batch(
            [(b"k", bytes([tag % 251]) * rng.randint(0, 90)) for _ in range(records)],
            base_timestamp=1_000 + tag,
        )
        batch_header.set_base_offset(batch, log.log_end_offset)
        set_batch_leader_epoch(batch, epoch)
        say(f"append {bytes(batch).hex()}")
        log.append_replicated(batch, now_ms=1_000 + tag)
        # A flush after one append in four: most kills find un-synced
        # batches for the power cut to drop, tear or garble.
        if rng.random() < 0.25:
            say(f"flushed {log.flush()}")
        if rng.random() < 0.15 and log.log_end_offset > log.log_start_offset:
            end = log.log_end_offset
            target = rng.randint(max(log.log_start_offset, end - 12), end)
            say(f"truncating {target}")
            say(f"truncated {log.truncate_to(target)}")


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]))
