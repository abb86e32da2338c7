#!/usr/bin/env bash
# The main job. With no arguments (`make demo`): the whole cycle of
# iolens.demo.cycle: a real PyTorch training (CPU) on small files on a slow disk
# (root, loop devices) under `iolens run`, the verdict with its prediction, the
# storage probe, the fix (`iolens pack`), the training again and `iolens compare`
# of the two; where the slow disk cannot be made, the plain demo under
# `iolens run`, saying what it skipped. With arguments (`make demo-slow`: --slow-disk)
# one training of iolens.demo under `iolens run`, with those arguments.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$#" = 0 ]; then
  exec .venv/bin/python -m iolens.demo.cycle
fi
# Drop the page cache first where we may, so the first epoch reads the disk.
if [ "$(id -u)" = 0 ] && [ -w /proc/sys/vm/drop_caches ]; then
  sync; echo 3 > /proc/sys/vm/drop_caches || true
fi
exec .venv/bin/iolens run --interval 0.25 --out "iolens-runs/demo-$(date +%Y%m%d-%H%M%S)" \
  -- .venv/bin/python -m iolens.demo "$@"
