#!/usr/bin/env bash
# The main job until the recorder lands: extended statistics of the disk that
# serves this folder while a direct-I/O writer and reader load it, then the
# same disk's averages since boot.
set -euo pipefail
cd "$(dirname "$0")/.."
scratch=$(mktemp -d ./.iolens-demo.XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$scratch"' EXIT

echo "== loading the disk under $(pwd): 1 MiB direct writes, then direct reads"
timeout 4 sh -c 'while :; do
    dd if=/dev/zero of="$1/blob" bs=1M count=64 oflag=direct status=none
    dd if="$1/blob" of=/dev/null bs=1M iflag=direct status=none
  done' sh "$scratch" &

echo "== iolens iostat --path . -m -y 1 3: three 1-second reports of that disk"
.venv/bin/iolens iostat --path . -m -y 1 3
wait || true
echo "== iolens iostat --path .: the same disk since boot"
.venv/bin/iolens iostat --path .
