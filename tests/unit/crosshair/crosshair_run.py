"""What the CrossHair tests share: the command, and which test checks which module.

Each ``test_crosshair_*.py`` checks a few contracted modules through
``tools/crosshair_check.sh`` (the command a person runs by hand with larger budgets).
They are split by CPU so that the xdist schedule (tests/scheduling.py) can place them
like any other file: CrossHair is pure CPU, up to ``per_condition`` CPU seconds per
contracted function, and one 134-s file of them all ran on one worker alone.

CPU seconds at 2 s per condition (2026-11-30, one module per run): primitives 14.4,
index 10.5, segment 4.4, partition_txns 4.4, quota 2.4, group_commit 2.3, the storage
spec (spec/storage_model.py) 42.6.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "tools" / "crosshair_check.sh"

#: CPU seconds CrossHair may spend on each contracted function. The planted bugs found at
#: 2 s were found at 1 s too, and one (a fetch that overruns max_bytes by a byte, in the
#: storage spec's ``read``) was missed at 0.5 s: 2 s keeps a margin of two.
PER_CONDITION_S = 2

#: Test file -> the modules it checks.
CHECKED_BY = {
    "test_crosshair_protocol_state.py": [
        "trio_broker/protocol/primitives.py",
        "trio_broker/state/quota.py",
        "trio_broker/state/partition_txns.py",
    ],
    "test_crosshair_storage.py": [
        "trio_broker/storage/index.py",
        "trio_broker/storage/segment.py",
        "trio_broker/storage/group_commit.py",
    ],
    "test_crosshair_storage_spec.py": ["spec/storage_model.py"],
    # Their own tests, which call crosshair directly.
    "test_crosshair_mute.py": ["trio_broker/state/mute.py", "spec/mute_model.py"],
    "test_crosshair_producer.py": ["trio_broker/state/producer.py"],
}


def contracted_modules() -> set[str]:
    found = set()
    for top in ("trio_broker", "spec"):
        for path in (ROOT / top).rglob("*.py"):
            if "post:" in path.read_text(encoding="utf-8"):
                found.add(path.relative_to(ROOT).as_posix())
    return found


#: The budget only guards against a hang: the search is bounded per condition in CPU
#: seconds, and a loaded CI machine stretches the wall time (the ~45 s of the then
#: six implementation modules took 270 s at load ~18).
BUDGET_S = 600


def crosshair(modules: list[str]) -> None:
    if shutil.which("bash") is None:
        pytest.skip("needs bash")
    env = dict(os.environ, PYTHON=sys.executable, PER_CONDITION=str(PER_CONDITION_S))
    env["BUDGET"] = str(BUDGET_S)
    result = subprocess.run(
        ["bash", str(SCRIPT), *modules],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=BUDGET_S + 30,
    )
    assert result.returncode == 0, result.stdout + result.stderr
