#!/usr/bin/env bash
# The main job: a real PyTorch training (CPU) on a generated folder of small
# files, run under `iolens run`, ending with the recorder's summary and the
# run directory. Arguments go to the demo: `--slow-disk` (root) puts the
# dataset on a throttled loop device for the run (`make demo-slow`).
set -euo pipefail
cd "$(dirname "$0")/.."
# Drop the page cache first where we may, so the first epoch reads the disk.
if [ "$(id -u)" = 0 ] && [ -w /proc/sys/vm/drop_caches ]; then
  sync; echo 3 > /proc/sys/vm/drop_caches || true
fi
exec .venv/bin/iolens run --interval 0.25 --out "iolens-runs/demo-$(date +%Y%m%d-%H%M%S)" \
  --path "${TMPDIR:-/tmp}" -- \
  .venv/bin/python -m iolens.demo "$@"
