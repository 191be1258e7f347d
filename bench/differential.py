"""Differential testing, the long run: random request sequences to Kafka 4.4 and trio-broker.

The ops, strategies and comparison are those of ``tests/differential`` (the short
fixed-seed run is part of the test suite); this runs them with fresh randomness for
``--minutes``, starting one Apache Kafka (``bench/kafka_peer.py``) and one
``trio-broker serve``, both from bench/server.properties (topic auto-creation off). Group
sequences here also pause for twice the rebalance timeout now and then (the group timers).
Every difference is counted by kind and by signature (op kind, Kafka's answer, trio-broker's answer); those the test's
allow-list knows (docs/compatibility.md) are counted apart. After an unknown difference
the sequence ends, since the two brokers' states may have diverged.

    PYTHONPATH=$PWD .venv/bin/python bench/differential.py --minutes 5 --json diff.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hypothesis import Phase, given, settings  # noqa: E402

from tests.differential.conftest import start_kafka, start_trio  # noqa: E402
from tests.differential.harness import Broker, Op, Session  # noqa: E402
from tests.differential.strategies import sequences  # noqa: E402
from tests.differential.test_against_kafka import known  # noqa: E402


class TimeUp(Exception):
    pass


def describe(op: Op) -> str:
    """The variant of an op that coverage counts apart: its mode, codec, acks, naming..."""
    parts = [str(getattr(op, "mode", "") or getattr(op, "what", "") or "")]
    if getattr(op, "codec", "none") != "none":
        parts.append(str(op.codec))  # type: ignore[attr-defined]
    if getattr(op, "acks", None) == 0:
        parts.append("acks=0")
    if getattr(op, "by", "name") != "name":
        parts.append(f"by {op.by}")  # type: ignore[attr-defined]
    return "/".join(p for p in parts if p)


def run(minutes: float, max_ops: int, kafka: Broker, trio: Broker) -> dict[str, Any]:
    deadline = time.monotonic() + minutes * 60
    counts: Counter[str] = Counter()
    by_kind: Counter[str] = Counter()
    known_by_kind: Counter[str] = Counter()
    samples: dict[str, dict[str, Any]] = {}
    #: What was exercised: op kind (and mode) -> Kafka's error code or outcome class.
    coverage: Counter[str] = Counter()

    @settings(max_examples=10**9, database=None, deadline=None, phases=[Phase.generate])
    @given(ops=sequences(max_ops, pauses=True))
    def one_sequence(ops: list[Op]) -> None:
        if time.monotonic() > deadline:
            raise TimeUp
        session = Session(kafka, trio, prefix=f"bench{counts['sequences']}")
        counts["sequences"] += 1
        for op in ops:
            counts["ops"] += 1
            difference = session.run(op)
            kafka_answer = session.last_answers[0]
            mode = describe(op)
            errors = kafka_answer[:1] in (("error",), ("errors",))
            outcome = kafka_answer[1] if errors else kafka_answer[0]
            coverage[f"{op.kind}{'/' + mode if mode else ''} -> {outcome}"] += 1
            if difference is None:
                continue
            if difference.near_a_timer:  # load decides which broker fired it first
                counts["near_a_timer"] += 1
                break
            entry = known(difference)
            if entry is not None:
                known_by_kind[entry.why] += 1
                if entry.diverges:
                    break
                continue
            by_kind[difference.kind] += 1
            signature = f"{difference.kind}: kafka {difference.kafka!r} / trio {difference.trio!r}"
            samples.setdefault(signature, {"count": 0, "op": difference.op, "ops": repr(ops)})
            samples[signature]["count"] += 1
            break

    started = time.monotonic()
    try:
        one_sequence()
    except TimeUp:
        pass
    return {
        "minutes": round((time.monotonic() - started) / 60, 2),
        "sequences": counts["sequences"],
        "ops": counts["ops"],
        "requests": {"kafka": kafka.requests, "trio-broker": trio.requests},
        "differences": sum(by_kind.values()),
        "differences_by_kind": dict(by_kind),
        "known_differences": dict(known_by_kind),
        # Group ops sent at a group timer's deadline: not compared (load decides).
        "sequences_ended_near_a_timer": counts["near_a_timer"],
        "signatures": samples,
        "coverage": dict(sorted(coverage.items())),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--max-ops", type=int, default=30, help="ops per sequence (bound)")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="differential-") as tmp:
        trio_process = start_trio(Path(tmp))
        kafka_process: Any = None
        try:
            kafka_process = start_kafka()
            kafka = Broker("kafka", kafka_process.port)
            trio = Broker("trio-broker", trio_process.port)
            result = run(args.minutes, args.max_ops, kafka, trio)
            kafka.close()
            trio.close()
            report(result, args.json)  # before the brokers stop: a failed stop keeps them
        finally:
            if kafka_process is not None:
                kafka_process.stop()
            # The broker must stop on SIGTERM like after any other run (exit code 0).
            started = time.monotonic()
            code = trio_process.stop()
            print(f"trio-broker stopped with exit code {code} in "
                  f"{time.monotonic() - started:.1f}s after SIGTERM")  # fmt: skip


def report(result: dict[str, Any], json_path: Path | None) -> None:
    print(f"{result['sequences']} sequences, {result['ops']} ops, requests "
          f"kafka {result['requests']['kafka']} / trio-broker {result['requests']['trio-broker']}, "
          f"{result['differences']} unknown differences {result['differences_by_kind']}, "
          f"known {result['known_differences']} in {result['minutes']} min")  # fmt: skip
    for signature, sample in result["signatures"].items():
        print(f"  {sample['count']}x {signature}")
    if json_path:
        json_path.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
