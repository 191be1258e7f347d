"""Record each test file's seconds from a JUnit report, for the xdist schedule.

tests/scheduling.py hands files to the workers longest first, by the seconds this
writes to tests/durations.json. Every scripts/test.sh run leaves its report in
``~/.cache/trio-broker/junit-last.xml`` (``$XDG_CACHE_HOME`` if set); after a full run::

    .venv/bin/python tools/test_durations.py ~/.cache/trio-broker/junit-last.xml

It also prints the ten longest files and the run's summed test seconds.
"""

from __future__ import annotations

import argparse
import json
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DURATIONS_FILE = ROOT / "tests" / "durations.json"


def file_of(classname: str) -> str:
    """The test file of a JUnit ``classname`` (``tests.unit.x.test_y`` or ``...test_y.TestZ``)."""
    parts = classname.split(".")
    for end in range(len(parts), 0, -1):
        candidate = "/".join(parts[:end]) + ".py"
        if (ROOT / candidate).is_file():
            return candidate
    return "/".join(parts) + ".py"


def seconds_per_file(report: Path) -> Counter[str]:
    per_file: Counter[str] = Counter()
    for case in ET.parse(report).getroot().iter("testcase"):
        per_file[file_of(case.get("classname", ""))] += float(case.get("time", 0) or 0)
    return per_file


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", type=Path, help="a JUnit XML report of a full run")
    args = parser.parse_args(argv)
    per_file = seconds_per_file(args.report)
    if not per_file:
        print(f"no test cases in {args.report}", file=sys.stderr)
        return 1
    files = {path: round(seconds, 1) for path, seconds in sorted(per_file.items())}
    DURATIONS_FILE.write_text(json.dumps({"files": files}, indent=1) + "\n")
    print(f"{len(files)} files, {sum(per_file.values()):.0f} test seconds -> {DURATIONS_FILE}")
    for path, seconds in per_file.most_common(10):
        print(f"{seconds:8.1f}  {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
