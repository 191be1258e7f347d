"""Classpaths resolved by Maven from dependency-only poms; the jars stay in ``~/.m2``.

Apache Kafka 4.4.0's tools (and, through them, its server jars) from ``pom.xml``
beside this file; Kafka Streams from ``tests/streams/pom.xml``.

Maven takes 5-15 s to start and answer even when every jar is in ``~/.m2``, and about
ten test modules ask: the answer is kept per pom content in the user's cache directory
and used while every jar it names is still there.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

POM = Path(__file__).resolve().parent / "pom.xml"


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "trio-broker-tests"


def maven_classpath(pom: Path, work_dir: Path) -> str:
    """The classpath of a dependency-only ``pom.xml``, resolved (and cached) by Maven."""
    digest = hashlib.sha256(pom.read_bytes()).hexdigest()[:16]
    cached = _cache_dir() / f"{pom.parent.name}-{digest}-classpath.txt"
    try:
        known = cached.read_text().strip()
    except OSError:
        known = ""
    if known and all(Path(jar).is_file() for jar in known.split(os.pathsep)):
        return known
    out = work_dir / f"{pom.parent.name}-classpath.txt"
    subprocess.run(
        ["mvn", "-q", "-B", "-f", str(pom), "dependency:build-classpath",
         f"-Dmdep.outputFile={out}"],
        check=True, timeout=600, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    classpath = out.read_text().strip()
    try:  # written whole, then renamed: parallel workers read one answer or none
        cached.parent.mkdir(parents=True, exist_ok=True)
        partial = cached.with_name(f"{cached.name}.{os.getpid()}")
        partial.write_text(classpath)
        os.replace(partial, cached)
    except OSError:
        pass  # no cache: the next module asks Maven again
    return classpath


def kafka_tools_classpath(work_dir: Path) -> str:
    return maven_classpath(POM, work_dir)
