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
echo "== pytest"
.venv/bin/python -m pytest "$@"
