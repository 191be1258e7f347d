#!/usr/bin/env bash
# Create .venv and install trio-broker into it (with the test and verify extras if asked).
# Usage: scripts/setup.sh [--test]
#
# A fresh clone's full install takes a minute even from pip's cache (pyspark alone is
# some 18,000 files), so a finished install is kept outside the repo, in
# ${TRIO_BROKER_VENV_CACHE:-~/.cache/trio-broker/venvs}/<key>, where the key hashes what
# decides the install: pyproject.toml's [build-system] and [project] tables, the extras
# and the Python. A clone without .venv copies it (hard links where the filesystem
# allows), points the scripts' #! lines at its own .venv and installs only trio-broker
# itself again (editable, no dependencies). Anything failing on that path falls back
# to the full install. Files under .venv may be hard links shared with the cache:
# replace them (pip does) rather than edit them in place.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
extra=""
if [ "${1:-}" = "--test" ]; then
  extra="[test,verify]"
fi
pip_quiet=(--quiet --disable-pip-version-check)
# Reinstall only when pyproject.toml changed since the last install.
stamp=".venv/.installed${extra}"
if [ -f "$stamp" ] && [ ! pyproject.toml -nt "$stamp" ]; then
  exit 0
fi

cache_root=${TRIO_BROKER_VENV_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/trio-broker/venvs}
key=$(EXTRA="$extra" "$PYTHON" - <<'EOF'
import hashlib, json, os, sys, tomllib
with open("pyproject.toml", "rb") as f:
    data = tomllib.load(f)
decides = [data.get("build-system"), data.get("project"), os.environ["EXTRA"], sys.version]
print(hashlib.sha256(json.dumps(decides, sort_keys=True).encode()).hexdigest()[:16])
EOF
)
cached="$cache_root/$key"
venv="$PWD/.venv"

# Every step is checked: `set -e` does not apply inside a function called by `if`.
from_cache() {
  cp -al "$cached" .venv 2>/dev/null || { rm -rf .venv && cp -a "$cached" .venv; } || return 1
  local origin
  origin=$(cat .venv/.origin) && [ -n "$origin" ] || return 1
  rm -f .venv/.origin .venv/.installed*
  # sed -i writes a new file, so the cache's copy keeps its own path.
  local script
  for script in $(grep -rlI -F "$origin" .venv/bin); do
    sed -i "s|$origin|$venv|g" "$script" || return 1
  done
  .venv/bin/python -m pip install "${pip_quiet[@]}" --no-deps -e ".${extra}"
}

if [ ! -e .venv ] && [ -f "$cached/.origin" ]; then
  if from_cache; then
    touch "$cached" "$stamp"
    exit 0
  fi
  echo "setup.sh: the cached install $cached did not work; installing in full" >&2
  rm -rf .venv
fi

fresh=""
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
  fresh=1
fi
.venv/bin/python -m pip install "${pip_quiet[@]}" --upgrade pip >/dev/null 2>&1 || true
.venv/bin/python -m pip install "${pip_quiet[@]}" -e ".${extra}"
touch "$stamp"

# Keep this install for the next clone: copied under a temporary name and renamed, so
# a reader sees a whole copy or none. Only a venv made here is kept (an older one may
# hold packages the project no longer asks for). Copies unused for two weeks are removed.
if [ -n "$fresh" ] && [ ! -e "$cached" ] && mkdir -p "$cache_root" 2>/dev/null; then
  partial="$cache_root/.partial.$$"
  if cp -al .venv "$partial" 2>/dev/null || { rm -rf "$partial"; cp -a .venv "$partial"; }; then
    rm -f "$partial"/.installed*
    echo "$venv" >"$partial/.origin"
    mv -T "$partial" "$cached" 2>/dev/null || rm -rf "$partial"
  else
    rm -rf "$partial"
  fi
  find "$cache_root" -mindepth 1 -maxdepth 1 -mtime +14 -exec rm -rf {} + 2>/dev/null || true
fi
