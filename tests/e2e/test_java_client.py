"""The Java client (org.apache.kafka:kafka-clients 4.x) against a real trio-broker serve.

The JUnit tests live in the Maven module ``tests/jvm`` (producer with the Java
defaults: acks=all and idempotence, headers and timestamps; a consumer group;
every compression codec; Admin describeCluster, listTopics, listOffsets,
describeTopics). This test starts a broker process, runs ``mvn test`` against it
with ``-Dbootstrap=HOST:PORT`` and reads the Surefire report. Maven and Java come
from scripts/install-system-deps.sh; artifacts are cached in ~/.m2 (outside the repo).
"""

from __future__ import annotations

import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.e2e.conftest import BrokerProcess

JVM_MODULE = Path(__file__).resolve().parents[1] / "jvm"
#: The first run downloads kafka-clients, JUnit and the plugins from Maven Central.
MAVEN_TIMEOUT_S = 600
#: The JUnit tests the module holds (a report with fewer means tests were lost).
EXPECTED_TESTS = 7


@pytest.mark.timeout(MAVEN_TIMEOUT_S + 60)
def test_the_java_client_produces_consumes_and_administers(broker_process: BrokerProcess) -> None:
    mvn = shutil.which("mvn")
    assert mvn is not None, "Maven is missing: scripts/install-system-deps.sh installs it"
    reports = JVM_MODULE / "target" / "surefire-reports"
    shutil.rmtree(reports, ignore_errors=True)
    run = subprocess.run(
        [mvn, "-B", "-q", "-f", str(JVM_MODULE / "pom.xml"), "test",
         f"-Dbootstrap={broker_process.bootstrap}"],
        capture_output=True, text=True, timeout=MAVEN_TIMEOUT_S, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert run.returncode == 0, (run.stdout[-6000:], run.stderr[-3000:])
    suites = [ET.parse(p).getroot() for p in reports.glob("TEST-*.xml")]
    totals = {
        key: sum(int(s.get(key, 0)) for s in suites)
        for key in ("tests", "failures", "errors", "skipped")
    }
    assert totals == {"tests": EXPECTED_TESTS, "failures": 0, "errors": 0, "skipped": 0}, totals
