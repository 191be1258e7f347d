"""Classpaths resolved by Maven from dependency-only poms; the jars stay in ``~/.m2``.

Apache Kafka 4.4.0's tools (and, through them, its server jars) from ``pom.xml``
beside this file; Kafka Streams from ``tests/streams/pom.xml``.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

POM = Path(__file__).resolve().parent / "pom.xml"


def maven_classpath(pom: Path, work_dir: Path) -> str:
    """The classpath of a dependency-only ``pom.xml``, resolved (and cached) by Maven."""
    out = work_dir / f"{pom.parent.name}-classpath.txt"
    subprocess.run(
        ["mvn", "-q", "-B", "-f", str(pom), "dependency:build-classpath",
         f"-Dmdep.outputFile={out}"],
        check=True, timeout=600, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    return out.read_text().strip()


def kafka_tools_classpath(work_dir: Path) -> str:
    return maven_classpath(POM, work_dir)
