"""CrossHair finds no counterexample in the storage spec (spec/storage_model.py)."""

from __future__ import annotations

import pytest

from tests.unit.crosshair.crosshair_run import BUDGET_S, CHECKED_BY, crosshair

pytest.importorskip("crosshair")


@pytest.mark.slow
@pytest.mark.timeout(BUDGET_S + 30)
def test_no_counterexample() -> None:
    crosshair(CHECKED_BY["test_crosshair_storage_spec.py"])
