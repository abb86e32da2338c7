#!/usr/bin/env bash
# The pytest part of `make test`. The soak test (a long run at a fast interval,
# checking that neither the recorder nor the job grows in memory) mostly
# sleeps, so it runs beside the rest of the suite instead of after it.
# Extra arguments go to the main pytest run; SOAK=0 leaves the soak out.
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
soak_pid=""
log=""
if [ "${SOAK:-1}" != 0 ]; then
  log=$(mktemp -t iolens-soak.XXXXXX)
  "$BIN/pytest" -q -p no:cacheprovider -m soak >"$log" 2>&1 &
  soak_pid=$!
fi
# --durations: the slowest tests in every log, to keep the suite inside its half hour.
"$BIN/pytest" -q -m "not soak" --durations=15 "$@"
rc=$?
if [ -n "$soak_pid" ]; then
  echo "unit: waiting for the soak test (IOLENS_SOAK_SECONDS=${IOLENS_SOAK_SECONDS:-600})"
  wait "$soak_pid"
  soak_rc=$?
  cat "$log"
  rm -f "$log"
  # pytest exits 5 when no test was collected: no soak test is a failure too.
  [ "$soak_rc" = 0 ] || rc=1
fi
exit "$rc"
