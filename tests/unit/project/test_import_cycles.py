"""No import cycle in trio_broker, counting every import (tools/import_cycles.py).

The import-linter layers contract cannot see a cycle between two modules of one
package, and it let two through (replica_manager <-> replica_fetcher through an
import inside ``run``; coordinator <-> partitioned through TYPE_CHECKING and a
function-level import). The check reads the source, so an import inside a function
or under ``if TYPE_CHECKING:`` counts like any other; the tests on generated package
trees below pin that down.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from types import ModuleType

from tests.load_tool import load_tool

ROOT = Path(__file__).resolve().parents[3]


def _load_tool() -> ModuleType:
    return load_tool("import_cycles.py")


import_cycles = _load_tool()


def test_trio_broker_has_no_import_cycle() -> None:
    found = import_cycles.cycles(ROOT / "trio_broker")
    assert not found, "import cycles in trio_broker:\n\n" + import_cycles.report(found)


def test_the_check_sees_trio_broker_imports_of_every_kind() -> None:
    """Guards against a check that passes by seeing nothing: the package's own
    function-level and TYPE_CHECKING imports are in the graph."""
    edges = {(edge.importer, edge.imported) for edge in import_cycles.imports(ROOT / "trio_broker")}
    assert len(edges) > 500
    # Only inside a function (the config reads a JAAS file's login lazily).
    assert ("trio_broker.config", "trio_broker.security.zookeeper_login") in edges
    # Only under TYPE_CHECKING.
    assert ("trio_broker.server.loop_watchdog", "trio_broker.server.handler_pool") in edges


def tree(root: Path, files: dict[str, str]) -> Path:
    """Write a package tree under ``root``; returns the package directory."""
    for relative, source in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source))
    return root / next(iter(files)).split("/")[0]


def cycle_lines(package: Path) -> list[list[tuple[str, int, str]]]:
    return [
        [(str(edge.path), edge.line, edge.text) for edge in cycle]
        for cycle in import_cycles.cycles(package)
    ]


def test_a_cycle_through_a_function_level_import(tmp_path: Path) -> None:
    package = tree(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/manager.py": """\
                class Manager:
                    async def run(self):
                        from pkg.fetcher import run_fetchers
                        await run_fetchers(self)
            """,
            "pkg/fetcher.py": """\
                from pkg.manager import Manager

                async def run_fetchers(manager: Manager): ...
            """,
        },
    )
    assert cycle_lines(package) == [
        [
            ("pkg/fetcher.py", 1, "from pkg.manager import Manager"),
            ("pkg/manager.py", 3, "from pkg.fetcher import run_fetchers"),
        ]
    ]
    report = import_cycles.report(import_cycles.cycles(package))
    assert "cycle 1: pkg.fetcher <-> pkg.manager" in report
    assert "pkg/manager.py:3: from pkg.fetcher import run_fetchers" in report


def test_a_cycle_through_type_checking_and_relative_imports(tmp_path: Path) -> None:
    package = tree(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/txn/__init__.py": "",
            "pkg/txn/coordinator.py": """\
                from typing import TYPE_CHECKING

                if TYPE_CHECKING:
                    from .partitioned import Partitioned

                class Coordinator: ...
            """,
            "pkg/txn/partitioned.py": """\
                from . import coordinator

                class Partitioned(coordinator.Coordinator): ...
            """,
        },
    )
    assert cycle_lines(package) == [
        [
            ("pkg/txn/coordinator.py", 4, "from .partitioned import Partitioned"),
            ("pkg/txn/partitioned.py", 1, "from . import coordinator"),
        ]
    ]


def test_a_longer_cycle_is_one_component_with_every_import_in_it(tmp_path: Path) -> None:
    package = tree(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "import pkg.b as b\n",
            "pkg/b.py": "def f():\n    from .sub.c import x\n",
            "pkg/sub/__init__.py": "",
            "pkg/sub/c.py": "from ..a import y\nx = 1\n",
            "pkg/d.py": "import pkg.a\n",  # imports into the cycle, not part of it
        },
    )
    assert cycle_lines(package) == [
        [
            ("pkg/a.py", 1, "import pkg.b as b"),
            ("pkg/b.py", 2, "from .sub.c import x"),
            ("pkg/sub/c.py", 1, "from ..a import y"),
        ]
    ]


def test_a_module_importing_itself_is_a_cycle(tmp_path: Path) -> None:
    package = tree(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/solo.py": "def again():\n    from pkg import solo\n",
        },
    )
    assert cycle_lines(package) == [[("pkg/solo.py", 2, "from pkg import solo")]]


def test_no_cycle(tmp_path: Path) -> None:
    """Imports of every form, all pointing one way: no cycle, and each edge resolved
    to the module it names (a name from a package's __init__ is an edge to it)."""
    package = tree(
        tmp_path,
        {
            "pkg/__init__.py": "from pkg.low import base\n",
            "pkg/low/__init__.py": "base = 0\n",
            "pkg/low/rules.py": "import os\nfrom pkg.low import base\n",
            "pkg/mid.py": """\
                from typing import TYPE_CHECKING

                import pkg.low.rules as rules
                from .low import rules as again, base

                if TYPE_CHECKING:
                    from pkg.low.rules import Rule

                def lazy():
                    from . import low
            """,
            "pkg/top.py": "from pkg import mid\nfrom . import *\n",
        },
    )
    assert import_cycles.cycles(package) == []
    assert {(e.importer, e.imported) for e in import_cycles.imports(package)} == {
        ("pkg", "pkg.low"),
        ("pkg.low.rules", "pkg.low"),
        ("pkg.mid", "pkg.low.rules"),
        ("pkg.mid", "pkg.low"),
        ("pkg.top", "pkg.mid"),
        ("pkg.top", "pkg"),
    }
    assert import_cycles.main(["import_cycles", str(package)]) == 0
