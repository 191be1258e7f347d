#!/usr/bin/env bash
# Quick start, command 2: install everything the tests need (system packages
# such as kcat, the Python test extra with the real Kafka clients) and run the
# whole suite: lint, types, unit, stateful, fuzz and end-to-end tests.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-system-deps.sh
scripts/setup.sh --test
echo "== ruff"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
echo "== mypy"
.venv/bin/mypy
echo "== import contracts (docs/architecture.md)"
.venv/bin/lint-imports
echo "== Maven dependencies (resolved once, before the parallel workers share ~/.m2)"
for pom in tests/kafka_tools/pom.xml tests/streams/pom.xml tests/spark/pom.xml; do
  mvn -q -B -f "$pom" dependency:build-classpath -Dmdep.outputFile=/dev/null \
    </dev/null >/dev/null 2>&1 || echo "  (could not resolve $pom now; its tests will say why)"
done
echo "== pytest (${TEST_WORKERS:-2} workers)"
# Two workers on the two cores: most end-to-end tests wait on brokers, clients and
# timers, so their waits overlap. A module's tests stay on one worker (loadfile), so
# module-scoped fixtures (a broker, a Spark session) start once. TEST_WORKERS=0 runs
# everything in one process.
.venv/bin/python -m pytest -n "${TEST_WORKERS:-2}" --dist loadfile --durations=30 "$@"
