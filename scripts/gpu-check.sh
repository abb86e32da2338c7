#!/usr/bin/env bash
# The GPU check, for a machine with an NVIDIA GPU, NVML and a CUDA build of
# PyTorch (CI has none, so there these tests skip). It runs the GPU tests
# with IOLENS_REQUIRE_GPU=1, which turns their skip into a failure, then a
# short CUDA training under `iolens run` whose run directory and reports it
# keeps, and a snapshot of `iolens top`.
#   bash scripts/gpu-check.sh [OUTDIR]      (default: gpu-check/)
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
out=${1:-gpu-check}
mkdir -p "$out"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" IOLENS_REQUIRE_GPU=1 PYTHONUNBUFFERED=1
status=0
nvidia-smi -L || status=1
"$PY" -c 'import torch, pynvml; print("torch", torch.__version__, "cuda", torch.cuda.is_available())' \
  || status=1
"$PY" -m pytest -q -p no:cacheprovider tests/test_gpu.py 2>&1 | tee "$out/pytest-gpu.log" \
  || status=1
"$PY" -m pytest -q -p no:cacheprovider tests/test_procfs.py tests/test_training.py \
  tests/test_run.py 2>&1 | tee "$out/pytest-recorder.log" || status=1
# A CUDA training under iolens run; its records show the GPU beside the disks.
cat > "$out/train_gpu.py" <<'PYEOF'
import time, torch
from torch.utils.data import DataLoader, TensorDataset
data = TensorDataset(torch.randn(8192, 1024), torch.randint(0, 10, (8192,)))
loader = DataLoader(data, batch_size=256, shuffle=True, num_workers=2, pin_memory=True)
model = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(8)],
                            torch.nn.Linear(1024, 10)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
for epoch in range(3):
    for x, y in loader:
        x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(); loss.backward(); opt.step()
    torch.cuda.synchronize()
    print("epoch", epoch, flush=True)
PYEOF
"$PY" -m iolens run --interval 0.5 --no-live --out "$out/run" -- "$PY" "$out/train_gpu.py" \
  2>&1 | tee "$out/run.log" || status=1
"$PY" -m iolens report "$out/run" --format json -o "$out/report.json" || status=1
"$PY" -m iolens report "$out/run" > "$out/report.txt" || status=1
"$PY" -m iolens report "$out/run" --format html -o "$out/report.html" || status=1
"$PY" -m iolens top --once --interval 0.5 > "$out/top.txt" 2>&1 || status=1
grep -q "GPU" "$out/top.txt" || { echo "gpu-check: no GPU in iolens top"; status=1; }
"$PY" -m iolens iostat -x 1 2 > "$out/iostat.txt" 2>&1 || true
echo "gpu-check: exit $status"
exit "$status"
