"""CrossHair finds no counterexample in the storage index, segment and group commit contracts."""

from __future__ import annotations

import pytest

from tests.unit.crosshair.crosshair_run import BUDGET_S, CHECKED_BY, crosshair

pytest.importorskip("crosshair")


@pytest.mark.timeout(BUDGET_S + 30)
def test_no_counterexample() -> None:
    crosshair(CHECKED_BY["test_crosshair_storage.py"])
