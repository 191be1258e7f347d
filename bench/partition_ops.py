"""One partition's lookup then append, and lookup then read, in process: thread CPU per
operation, or (under callgrind) instructions. The same calls in every tree since issue
29's Partition (``Topic.leading``, ``append``, ``read``), so two trees compare by
running it under each PYTHONPATH in turn, interleaved.

``append``: the guard's lookup (``Topic.leading``) then an idempotent producer's
one-record batch appended to a memory log (its sequence checked and recorded).
``read``: the lookup then a read_committed ``read`` of a one-batch log. ``both``: each.
The batches are built before the timed loops (and count under callgrind: take the
difference of two sizes, and of ``both`` against the two, to leave the building out).

    PYTHONPATH=/tmp/tree .venv/bin/python bench/partition_ops.py 20000 both
    PYTHONHASHSEED=0 valgrind --tool=callgrind --callgrind-out-file=/dev/null \\
        .venv/bin/python bench/partition_ops.py 2500 append
"""

from __future__ import annotations

import sys
import time

from trio_broker.partition.append import Origin, append
from trio_broker.partition.read import Isolation, read
from trio_broker.protocol.records import build_batch
from trio_broker.services.local_replication import LocalReplication
from trio_broker.services.producers import ProducerStateRegistry
from trio_broker.services.topics import TopicManager
from trio_broker.storage.log import LogConfig


class Answer:
    error_code = 0
    high_watermark = last_stable_offset = log_start_offset = -1


def main() -> None:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 20_000
    mode = sys.argv[2] if len(sys.argv) > 2 else "both"
    topics = TopicManager(None, LogConfig(), lambda: 0)
    written, small = topics.create("t", 1), topics.create("r", 1)
    producers = ProducerStateRegistry(None, lambda: 0)
    leaders = LocalReplication.over(topics, producers=producers)
    batches = [
        build_batch([(b"k", b"v" * 90)], producer_id=5, producer_epoch=0, base_sequence=i,
                    base_timestamp=0)
        for i in range(count)
    ]  # fmt: skip

    began = time.thread_time()
    for batch in batches if mode != "read" else ():
        leaders.leader_term("t", 0)  # as the guard: the term, then its Partition
        led = written.leading(0)
        append(led, batch, origin=Origin.CLIENT, now_ms=0, durability=None)
    appended = time.thread_time()
    one = small.leading(0)
    append(one, batches[0], origin=Origin.CLIENT, now_ms=0, durability=None)
    one.log.flush()  # the group commit's sync: a node alone's high watermark is the durable end
    answer = Answer()
    began_reads = time.thread_time()
    for _ in range(count if mode != "append" else 0):
        leaders.leader_term("r", 0)
        led = small.leading(0)
        read(answer, led, 0, 1 << 16, Isolation.TXN_COMMITTED, min_one=True)
    done = time.thread_time()
    print(
        f"append_ns={(appended - began) / count * 1e9:.0f} "
        f"read_ns={(done - began_reads) / count * 1e9:.0f}"
    )


if __name__ == "__main__":
    main()
