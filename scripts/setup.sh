#!/usr/bin/env bash
# Create .venv and install trio-broker into it (with the test and verify extras if asked).
# Usage: scripts/setup.sh [--test]
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
extra=""
if [ "${1:-}" = "--test" ]; then
  extra="[test,verify]"
fi
# Reinstall only when pyproject.toml changed since the last install.
stamp=".venv/.installed${extra}"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  .venv/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip >/dev/null 2>&1 || true
  .venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".${extra}"
  touch "$stamp"
fi
