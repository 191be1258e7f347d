#!/usr/bin/env bash
# System packages the tests use: kcat (librdkafka's CLI client).
set -euo pipefail
need=()
command -v kcat >/dev/null 2>&1 || need+=(kcat)
if [ ${#need[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq >/dev/null
  $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi
