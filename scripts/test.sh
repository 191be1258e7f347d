#!/usr/bin/env bash
# Quick start, command 2: install everything the tests need (system packages
# such as kcat, the Python test extra with the real Kafka clients) and run the
# whole suite: lint, types, unit, stateful, fuzz and end-to-end tests.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-system-deps.sh
scripts/setup.sh --test
# Bytecode is cached outside the repo and written even where the environment says
# PYTHONDONTWRITEBYTECODE: every broker, CLI call, cluster node and pytester run is a new
# Python process, and one that compiles its modules from source spends about 0.2 s more
# CPU starting (a broker: 0.55 s instead of 0.35 s).
export PYTHONPYCACHEPREFIX="${XDG_CACHE_HOME:-$HOME/.cache}/trio-broker/pycache"
unset PYTHONDONTWRITEBYTECODE
# Every pytest worker imports every test module, and pytest rewrites each one's asserts
# and caches the result by the module's path: in a fresh clone, each of the three workers
# would rewrite and compile them all itself at once (14 s of CPU each, 3.5 s from the
# cache). One collection in the background, beside the checks below (one core each),
# fills the cache first.
.venv/bin/python -m pytest --collect-only -q -p no:cacheprovider >/dev/null 2>&1 &
warm_caches=$!
trap 'kill "$warm_caches" 2>/dev/null || true' EXIT  # a check below failed: no orphan
echo "== ruff"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
echo "== mypy"
# The cache lives outside the repo, so a fresh clone checks only what changed since
# the last run anywhere on this machine (mypy validates every entry by its source).
MYPY_CACHE_DIR="${XDG_CACHE_HOME:-$HOME/.cache}/trio-broker/mypy" .venv/bin/mypy
echo "== import contracts (docs/architecture.md)"
.venv/bin/lint-imports
echo "== Maven dependencies (resolved once, before the parallel workers share ~/.m2)"
# Maven starts only for a pom whose classpath is not cached or names a missing jar.
.venv/bin/python -m tests.kafka_tools.classpath </dev/null
wait "$warm_caches" || true  # a module that fails to import fails below, with its error
echo "== pytest (${TEST_WORKERS:-4} workers)"
# Three workers on the two cores: most end-to-end tests wait on brokers, clients,
# JVMs and timers. A full run's processes, every one counted, used 1,041 CPU seconds:
# about half of what two cores give in the 18 minutes two workers took on a quiet
# machine, so a third worker's tests fill the others' waits. On a busy machine (load
# 8-10, the cores never idle; two runs one after the other) 3 workers took 1,172 s
# where 2 had taken 1,438 s, both green. Four since 2026-11-30: three left the cores a
# third idle on a quiet machine (1,019 CPU s in 738 s), and a fresh clone of the same
# head took 11 m 51 s with 4 (pytest 692 s) against 12 m 31 s with 3 (733 s), both
# green; docs/testing-time.md. A module's tests stay on one worker
# (loadfile), so module-scoped fixtures (a broker, a Spark session) start once.
# TEST_WORKERS=0 runs everything in one process.
# Every run leaves a JUnit report of its per-test seconds outside the repo, so the schedule's
# recorded seconds can be refreshed from any full run (tools/test_durations.py; a
# --junitxml of your own, given after, takes its place).
junit="${XDG_CACHE_HOME:-$HOME/.cache}/trio-broker/junit-last.xml"
mkdir -p "$(dirname "$junit")"
.venv/bin/python -m pytest -n "${TEST_WORKERS:-4}" --dist loadfile --durations=30 \
  --junitxml="$junit" "$@"
