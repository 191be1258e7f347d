#!/usr/bin/env bash
# Quick start, command 1: set everything up and start the broker with embedded
# defaults (127.0.0.1:9092, data under ./data). Extra flags go to `trio-broker serve`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/trio-broker serve "$@"
