#!/usr/bin/env bash
# CrossHair over every module with contracts (PEP 316 "post:" docstrings).
#
#   tools/crosshair_check.sh                      # every contracted module
#   tools/crosshair_check.sh spec/storage_model.py  # just these
#   PER_CONDITION=10 BUDGET=900 tools/crosshair_check.sh
#
# PER_CONDITION: seconds CrossHair may spend on each pre/post condition (default 5).
# BUDGET: seconds for the whole run (default 600); exceeding it is a failure (exit 124),
# not a pass. Exit status 0 means CrossHair found no counterexample within its budgets;
# it is a bounded search, not a proof.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
cd "$ROOT"

if [[ $# -gt 0 ]]; then
  modules=("$@")
else
  mapfile -t modules < <(grep -rl --include='*.py' 'post:' trio_broker spec | sort)
fi
echo "crosshair: ${#modules[@]} module(s), ${PER_CONDITION:-5} s per condition, budget ${BUDGET:-600} s" >&2
printf '  %s\n' "${modules[@]}" >&2
exec timeout "${BUDGET:-600}" "$PY" -m crosshair check \
  --analysis_kind=PEP316 --per_condition_timeout="${PER_CONDITION:-5}" "${modules[@]}"
