#!/usr/bin/env bash
# The main job until the recorder lands: live extended device statistics of
# this machine, then the devices serving the current folder.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "== iolens iostat -y 1 3: three 1-second reports of every busy disk"
.venv/bin/iolens iostat -y 1 3
echo "== iolens iostat --path . -m: the disk that serves this folder, since boot"
.venv/bin/iolens iostat --path . -m
