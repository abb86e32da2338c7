#!/usr/bin/env bash
# Sets up everything iolens and its tests need: a virtualenv with the package
# and its dev tools, and (as root on Debian) sysstat, whose iostat is the
# tests' oracle.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}

if ! command -v iostat >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing sysstat (iostat, the reference the tests compare against)"
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq sysstat >/dev/null
  else
    echo "setup: note: sysstat's iostat is missing; the tests that compare against it will skip" >&2
  fi
fi

if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
.venv/bin/python -m pip install -q -e '.[dev]'
echo "setup: ready (.venv)"
