"""Run one model check and record which lines of trio_broker/ it executed.

tools/planted_bugs.py lists, for a planted slip, the models whose run executes the slip's
line (``--coverage``). It uses coverage.py's C tracer when coverage is importable (it is
not in the venv: put it on PYTHONPATH, e.g. ``pip install --target DIR coverage``; 2-3
times cheaper), else a small tracer of its own: ``sys.settrace`` (and ``threading.settrace``, for a broker served from a thread)
with a line tracer only in frames of code under ``<tree>/trio_broker/``; every other
frame runs untraced after its call event. A code object whose every line was seen is not
traced again (the hot paths cost a call event each after their first few runs).

    python tools/line_trace.py OUT.json TREE pytest ARGS...   # python -m pytest ARGS
    python tools/line_trace.py OUT.json TREE sim ARGS...      # python -m sim ARGS

run with TREE as the working directory and on sys.path, as the scoring tool runs a
check. OUT.json gets ``{"status": exit status, "seconds": CPU seconds, "lines":
{"trio_broker/x.py": [line, ...]}}``. A broker in a subprocess (the whole-broker
machine's crashing and power-cut variants) is not traced: those keep their hand listing.
"""

from __future__ import annotations

import json
import os
import resource
import runpy
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

Tracer = Callable[[FrameType, str, Any], Any]


class LineRecorder:
    """The lines executed in files under ``package`` (a directory, absolute)."""

    def __init__(self, package: Path) -> None:
        self.prefix = str(package) + os.sep
        self.seen: dict[CodeType, set[int]] = {}
        self.wanted: dict[CodeType, bool] = {}
        self.done: set[CodeType] = set()

    def _lines_of(self, code: CodeType) -> int:
        return len({line for _, _, line in code.co_lines() if line is not None})

    def on_call(self, frame: FrameType, event: str, arg: Any) -> Tracer | None:
        code = frame.f_code
        wanted = self.wanted.get(code)
        if wanted is None:
            wanted = self.wanted[code] = code.co_filename.startswith(self.prefix)
        if not wanted or code in self.done:
            return None
        seen = self.seen.setdefault(code, set())
        seen.add(frame.f_lineno)
        total = self._lines_of(code)

        def on_line(frame: FrameType, event: str, arg: Any) -> Tracer | None:
            if event == "line":
                seen.add(frame.f_lineno)
            elif event == "return" and len(seen) >= total:
                self.done.add(code)
            return on_line

        return on_line

    def lines(self, root: Path) -> dict[str, list[int]]:
        by_file: dict[str, set[int]] = {}
        for code, seen in self.seen.items():
            relative = Path(code.co_filename).relative_to(root).as_posix()
            by_file.setdefault(relative, set()).update(seen)
        return {name: sorted(lines) for name, lines in sorted(by_file.items())}


def main(argv: list[str]) -> int:
    out, tree, kind, *args = argv
    root = Path(tree).resolve()
    os.chdir(root)
    sys.path.insert(0, str(root))
    recorder = LineRecorder(root / "trio_broker")
    try:  # coverage.py's C tracer when importable (not a dependency): 2-3 times faster
        import coverage
    except ImportError:
        measure = None
        threading.settrace(recorder.on_call)
        sys.settrace(recorder.on_call)
    else:
        measure = coverage.Coverage(data_file=None, source=[str(root / "trio_broker")])
        measure.start()
    status: int | str | None = 0
    try:
        if kind == "pytest":
            import pytest

            status = int(pytest.main(args))
        else:
            sys.argv = [kind, *args]
            try:
                runpy.run_module(kind, run_name="__main__", alter_sys=True)
            except SystemExit as stop:
                status = stop.code
    finally:
        if measure is None:
            sys.settrace(None)
            threading.settrace(None)  # type: ignore[arg-type]
            lines = recorder.lines(root)
        else:
            measure.stop()
            data = measure.get_data()
            lines = {
                Path(name).relative_to(root).as_posix(): sorted(data.lines(name) or ())
                for name in sorted(data.measured_files())
            }
        usage = resource.getrusage(resource.RUSAGE_SELF)
        Path(out).write_text(
            json.dumps(
                {
                    "status": status if isinstance(status, int) else 1,
                    "seconds": round(usage.ru_utime + usage.ru_stime, 1),
                    "lines": lines,
                }
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
