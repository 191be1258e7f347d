"""Classpaths resolved by Maven from dependency-only poms; the jars stay in ``~/.m2``.

Apache Kafka 4.4.0's tools (and, through them, its server jars) from ``pom.xml``
beside this file; Kafka Streams from ``tests/streams/pom.xml``.

Maven takes 5-15 s to start and answer even when every jar is in ``~/.m2``, and about
ten test modules ask: the answer is kept per pom content (and scope) in the user's
cache directory and used while every jar it names is still there.

``python -m tests.kafka_tools.classpath`` resolves every pom the tests use, once,
before scripts/test.sh starts its parallel workers (which then share ``~/.m2``); with
the answers cached and the jars in place it does not start Maven at all.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

POM = Path(__file__).resolve().parent / "pom.xml"
TESTS = POM.parent.parent
#: Every dependency-only pom a test resolves, with the scope it asks for.
POMS: tuple[tuple[Path, str | None], ...] = (
    (POM, None),
    (TESTS / "streams" / "pom.xml", None),
    (TESTS / "spark" / "pom.xml", "runtime"),
)


#: Maven's own JVM (not the JVMs Surefire forks for the tests) starts an invocation in about
#: a third of the time with the client compiler only: it runs for seconds, too short for
#: the optimizing compiler to pay (an empty ``mvn test`` of tests/jvm: 7.7 s -> 2.6 s).
MAVEN_JVM_OPTS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
#: The same for every short JVM the tests start, for the same reason: each runs for a
#: second or two (TopicCommand --describe against a local broker: 1.1 s -> 0.75 s of CPU;
#: a one-file Java source run on Kafka's jars, compiled at launch: 1.8 s -> 1.0 s).
FAST_START_JVM = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")
#: The Kafka command-line tools the tests run: ``java *TOOL_JVM -cp ... <tool class>``.
TOOL_JVM = ("-Xmx256m", *FAST_START_JVM)


def maven_env() -> dict[str, str]:
    """The environment to run ``mvn`` in: ``MAVEN_JVM_OPTS``, then any ``MAVEN_OPTS`` given."""
    env = dict(os.environ)
    env["MAVEN_OPTS"] = f"{MAVEN_JVM_OPTS} {env.get('MAVEN_OPTS', '')}".strip()
    return env


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "trio-broker-tests"


#: Class data sharing (AppCDS) for the tools' JVMs: a JVM maps the classes an earlier run
#: of the same classpath archived, instead of reading and verifying them from the jars
#: (TopicCommand --list against a local broker: 1.5 -> 0.75 CPU s). Its logging is off:
#: a tool's stdout is what the tests read, and a stale or unreadable archive is ignored.
CDS_QUIET = ("-Xlog:cds=off", "-Xlog:cds+dynamic=off")


def cds_archive(classpath: str) -> Path:
    """The archive for JVMs of ``classpath`` (and of this ``java``: one per installed JDK)."""
    java = shutil.which("java") or "java"
    try:
        real = Path(java).resolve()
        stamp = f"{real}:{real.stat().st_mtime_ns}"
    except OSError:
        stamp = java
    digest = hashlib.sha256(f"{stamp}\n{classpath}".encode()).hexdigest()[:16]
    return _cache_dir() / "cds" / f"{digest}.jsa"


def cds_options(classpath: str) -> tuple[tuple[str, ...], Path | None]:
    """The JVM options that use the classpath's archive, and, while there is none yet, the
    file this run writes one to at its exit (pass it to :func:`keep_cds_archive`)."""
    archive = cds_archive(classpath)
    if archive.is_file():
        return (*CDS_QUIET, f"-XX:SharedArchiveFile={archive}"), None
    try:
        archive.parent.mkdir(parents=True, exist_ok=True)
    except OSError:
        return (), None
    pending = archive.with_name(f"{archive.name}.{os.getpid()}-{time.monotonic_ns()}.tmp")
    return (*CDS_QUIET, f"-XX:ArchiveClassesAtExit={pending}"), pending


def keep_cds_archive(classpath: str, pending: Path | None) -> None:
    """Install the archive a run wrote (whole, by rename: parallel workers see one or none)."""
    if pending is None:
        return
    try:
        if pending.is_file():
            os.replace(pending, cds_archive(classpath))
    except OSError:
        pass
    pending.unlink(missing_ok=True)


def maven_classpath(pom: Path, work_dir: Path, scope: str | None = None) -> str:
    """The classpath of a dependency-only ``pom.xml``, resolved (and cached) by Maven.

    ``scope`` is Maven's ``includeScope`` (all scopes when None).
    """
    digest = hashlib.sha256(pom.read_bytes()).hexdigest()[:16]
    scoped = f"-{scope}" if scope else ""
    cached = _cache_dir() / f"{pom.parent.name}-{digest}{scoped}-classpath.txt"
    try:
        known = cached.read_text().strip()
    except OSError:
        known = ""
    if known and all(Path(jar).is_file() for jar in known.split(os.pathsep)):
        return known
    out = work_dir / f"{pom.parent.name}{scoped}-classpath.txt"
    scope_args = [f"-DincludeScope={scope}"] if scope else []
    subprocess.run(
        ["mvn", "-q", "-B", "-f", str(pom), "dependency:build-classpath",
         *scope_args, f"-Dmdep.outputFile={out}"],
        check=True, timeout=600, stdin=subprocess.DEVNULL, env=maven_env(),
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


def main() -> int:
    """Resolve every pom in ``POMS``; one that fails is reported, and its tests say why."""
    with tempfile.TemporaryDirectory() as work_dir:
        for pom, scope in POMS:
            try:
                maven_classpath(pom, Path(work_dir), scope)
            except (OSError, subprocess.SubprocessError):
                print(
                    f"  (could not resolve {pom.relative_to(TESTS.parent)} now; its tests will say why)"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
