"""The classpath of Apache Kafka 4.4.0's tools (and, through them, its server jars).

Resolved by Maven from ``pom.xml`` beside this file; the jars stay in ``~/.m2``.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

POM = Path(__file__).resolve().parent / "pom.xml"


def kafka_tools_classpath(work_dir: Path) -> str:
    out = work_dir / "kafka-tools-classpath.txt"
    subprocess.run(
        ["mvn", "-q", "-B", "-f", str(POM), "dependency:build-classpath",
         f"-Dmdep.outputFile={out}"],
        check=True, timeout=600, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    return out.read_text().strip()
