"""The Jepsen-style run for as long as you like: faults on a 3-broker cluster, checked.

Starts a private ZooKeeper (Debian's zookeeper package, as the cluster tests do), then
runs tests/cluster/jepsen.py's ``run``: three brokers (RF=3, min.insync.replicas=2,
each capturing its traffic), idempotent acks=all producers and a consumer group, and a
seeded schedule of kill -9, SIGSTOP/SIGCONT and proxy partitions; then the final read
and ``trio-broker verify`` over all three captures. Prints the figures (faults
injected, records acknowledged, lost, duplicates, verify verdict) and writes them as
JSON with ``--json``. Exit code 0 when nothing was lost or doubled and verify passed.

    .venv/bin/python bench/jepsen.py --minutes 30 --seed 1 --json jepsen.json
    .venv/bin/python bench/jepsen.py --minutes 2 --keep /tmp/jepsen   # keep logs, captures
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from kazoo.client import KazooClient  # noqa: E402

from tests.cluster.jepsen import run  # noqa: E402
from trio_broker.cluster.local_zookeeper import start_local_zookeeper  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30.0, help="time under faults")
    parser.add_argument("--seed", type=int, default=1, help="the fault schedule's seed")
    parser.add_argument("--producers", type=int, default=2)
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument("--keep", type=Path, help="work here and keep logs and captures")
    parser.add_argument("--no-verify", action="store_true", help="skip trio-broker verify")
    args = parser.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="jepsen-"))
    work.mkdir(parents=True, exist_ok=True)
    zookeeper = start_local_zookeeper(work / "zookeeper")
    try:
        client = KazooClient(hosts=zookeeper.hosts)
        client.start(timeout=30)
        client.ensure_path("/jepsen")
        client.stop()
        client.close()
        figures = run(work / "cluster", zookeeper.hosts + "/jepsen", duration_s=args.minutes * 60,
                      seed=args.seed, producers=args.producers,
                      verify=not args.no_verify)  # fmt: skip
    finally:
        zookeeper.stop()
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    shown = {k: v for k, v in figures.items() if k not in ("schedule", "applied", "verify_summary")}
    print(json.dumps(shown, indent=2))
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    ok = figures["lost"] == 0 and figures["duplicates"] == 0 and figures["moved"] == 0
    ok = ok and not figures["reordered_partitions"]
    ok = ok and (args.no_verify or figures.get("verify_exit_code") == 0)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
