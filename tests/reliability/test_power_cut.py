"""Power cuts in CI: the broker on a fault filesystem, kill -9 + power cut, everything checked.

The harness is ``bench/power_cut.py`` (run it directly for 200 cuts): a ``trio-broker
serve`` process with its data dir on a ``tests/faultfs`` mount, an idempotent acks=all
confluent-kafka producer and a thread changing metadata (topics, configs, committed
offsets, ACLs, SCRAM credentials); at random moments the broker is killed, the power cut
(only what was fsynced survives) and the broker restarted on the same data dir and port.
After every restart and at the end: every acknowledged record at its offset with its
bytes, no duplicates, no corrupt data served, one cluster id, every acknowledged metadata
change still there.

The second test is the planted bug: the same loop against a broker whose fsync and
fdatasync are no-ops (``tests/reliability/nofsync_broker.py``) must report loss, so that the
harness cannot pass by checking nothing.

Without FUSE both tests fail with one ``FUSE unavailable: ...`` line: they never skip.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.power_cut import NOFSYNC_LAUNCHER, PowerCutResult, run_power_cut
from tests.faultfs import fuse_available

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(300)]

#: One cut in two drops every un-synced byte; the others tear or garble it.
CI_MODES = ("drop", "tear", "drop", "garble")
#: 12 cuts: each mode at least 3 times (they go in turn), 10 cycles asserted below.
CI_CUTS = 12
METADATA_KINDS = ("topic", "config", "offset", "acl", "scram")


def _require_fuse() -> None:
    ok, why = fuse_available()
    if not ok:  # in the test, so that it counts as failed: never a skip
        pytest.fail(f"FUSE unavailable: {why}", pytrace=False)


def test_acknowledged_data_and_metadata_survive_power_cuts(tmp_path: Path) -> None:
    _require_fuse()
    result = run_power_cut(
        tmp_path, cuts=CI_CUTS, seed=20261125, modes=CI_MODES, uptime=(0.3, 1.5),
        time_budget=100.0,
    )  # fmt: skip
    print(result.summary())
    assert not result.problems(), result.summary()
    assert result.cycles >= 10, f"only {result.cycles} cuts in the time budget"
    assert result.modes.get("tear", 0) >= 2 and result.modes.get("garble", 0) >= 2
    assert sum(c.changed for c in result.cuts) >= 3, "the cuts threw nothing away"
    assert result.records_acked > 500, "too little load was acknowledged"
    assert result.records_acked == result.records_sent, result.summary()
    assert len(result.cluster_ids) == 1
    assert result.metadata_checks == result.cycles + 1
    for kind in METADATA_KINDS:
        assert result.metadata_acked.get(kind, 0) >= result.cycles, (kind, result.summary())


def _loss(result: PowerCutResult) -> bool:
    return result.lost > 0 or len(result.cluster_ids) > 1


def test_the_loop_catches_a_broker_that_never_fsyncs(tmp_path: Path) -> None:
    """The planted bug: fsync and fdatasync are no-ops in the broker process."""
    _require_fuse()
    result = run_power_cut(
        tmp_path, cuts=3, seed=7, modes=("drop",), uptime=(0.5, 1.0),
        launcher=NOFSYNC_LAUNCHER, stop_on_problem=True, time_budget=30.0,
    )  # fmt: skip
    print(result.summary())
    assert result.cycles >= 1 and result.records_acked > 0, result.summary()
    assert _loss(result), f"a broker without fsync lost nothing?\n{result.summary()}"
