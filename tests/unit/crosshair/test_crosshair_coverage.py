"""Every module with PEP 316 contracts is checked by one of the CrossHair tests.

A contracted module nobody checks fails here, so new contracts cannot be forgotten;
a listed test file that does not exist fails too (crosshair_run.CHECKED_BY).
"""

from __future__ import annotations

from pathlib import Path

from tests.unit.crosshair.crosshair_run import CHECKED_BY, contracted_modules

HERE = Path(__file__).resolve().parent


def test_every_contracted_module_is_checked_somewhere() -> None:
    checked = {module for modules in CHECKED_BY.values() for module in modules}
    assert contracted_modules() <= checked, contracted_modules() - checked


def test_every_listed_test_file_exists_and_names_its_modules() -> None:
    for name, modules in CHECKED_BY.items():
        text = (HERE / name).read_text(encoding="utf-8")
        assert f'CHECKED_BY["{name}"]' in text or all(m in text for m in modules), name
