"""Import a script of tools/ (not a package) as a module, once per test process."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

TOOLS = Path(__file__).resolve().parent.parent / "tools"


def load_tool(file_name: str) -> ModuleType:
    """``tools/<file_name>`` as a module (kept in sys.modules under a private name)."""
    name = "_trio_broker_" + file_name.removesuffix(".py")
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, TOOLS / file_name)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]
