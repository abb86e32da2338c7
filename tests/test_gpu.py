"""GPUs through NVML.

The fake-library tests run everywhere: they drive GpuReader's error paths
(no nvidia-ml-py, NVML failing to start, a GPU whose query fails, a driver
that lists no processes). The real-GPU tests need NVML and a CUDA build of
PyTorch; CI has no GPU, so they skip there, and IOLENS_REQUIRE_GPU=1 (set by
the GPU check script, scripts/gpu-check.sh) turns that skip into a failure.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
import types
from pathlib import Path
from typing import Any

import pytest

from iolens.sources.gpu import GpuReader

REQUIRE_GPU = os.environ.get("IOLENS_REQUIRE_GPU") == "1"


def need_gpu(reader: GpuReader) -> None:
    if reader.available and reader.names:
        return
    if REQUIRE_GPU:
        pytest.fail(f"IOLENS_REQUIRE_GPU=1 but {reader.reason or 'NVML found no GPU'}")
    pytest.skip(f"no NVIDIA GPU here ({reader.reason or 'NVML found no GPU'})")


class _NVMLError(Exception):
    pass


def _fake_nvml(*, init_error: str | None = None, count: int = 2,
               broken_index: int | None = None, procs: bool = True) -> types.ModuleType:
    mod = types.ModuleType("pynvml")

    def init() -> None:
        if init_error:
            raise _NVMLError(init_error)

    def handle(i: int) -> int:
        return i

    def util(h: int) -> Any:
        if h == broken_index:
            raise _NVMLError("GPU is lost")
        return types.SimpleNamespace(gpu=40 + h, memory=10)

    def meminfo(h: int) -> Any:
        return types.SimpleNamespace(used=1 << 30, total=80 << 30)

    def compute(h: int) -> list[Any]:
        if not procs:
            raise _NVMLError("Not Supported")
        return [types.SimpleNamespace(pid=300, usedGpuMemory=None),
                types.SimpleNamespace(pid=200, usedGpuMemory=512 << 20)]

    def graphics(h: int) -> list[Any]:
        if not procs:
            raise _NVMLError("Not Supported")
        return [types.SimpleNamespace(pid=300, usedGpuMemory=64 << 20)]

    mod.__dict__.update(
        nvmlInit=init, nvmlShutdown=lambda: None, nvmlDeviceGetCount=lambda: count,
        nvmlDeviceGetHandleByIndex=handle, nvmlDeviceGetName=lambda h: b"Fake GPU",
        nvmlDeviceGetUtilizationRates=util, nvmlDeviceGetMemoryInfo=meminfo,
        nvmlDeviceGetComputeRunningProcesses=compute,
        nvmlDeviceGetGraphicsRunningProcesses=graphics)
    return mod


def test_missing_library_is_a_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    reader = GpuReader()
    assert not reader.available
    assert "nvidia-ml-py is not installed" in reader.reason
    assert reader.sample() == []
    reader.close()


def test_nvml_that_fails_to_start_is_a_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml(init_error="Driver Not Loaded"))
    reader = GpuReader()
    assert not reader.available
    assert reader.reason == "NVML unavailable: Driver Not Loaded"


def test_samples_each_gpu_and_merges_process_lists(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml())
    reader = GpuReader()
    assert reader.available and reader.names == ["Fake GPU", "Fake GPU"]
    first, second = reader.sample()
    assert first == {"index": 0, "util_pct": 40.0, "mem_util_pct": 10.0,
                     "mem_used_bytes": 1 << 30, "mem_total_bytes": 80 << 30,
                     "pids": [200, 300], "proc_mem_bytes": [512 << 20, 64 << 20]}
    assert second["util_pct"] == 41.0
    reader.close()
    reader.close()
    assert reader.sample() == []


def test_one_broken_gpu_reports_its_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml(broken_index=1, procs=False))
    first, second = GpuReader().sample()
    assert "pids" not in first  # the driver answered no process query
    assert second == {"index": 1, "error": "GPU is lost"}


def test_no_gpu_at_all(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml(count=0))
    reader = GpuReader()
    assert reader.reason == "NVML found no GPU" and reader.sample() == []


def test_a_blocked_query_does_not_block_the_sampler(monkeypatch: pytest.MonkeyPatch) -> None:
    """A GPU query that blocks: samples return within the timeout, then recover."""
    release = threading.Event()
    fake = _fake_nvml(count=1)
    good = fake.nvmlDeviceGetUtilizationRates

    def stuck(h: int) -> Any:
        release.wait(30)  # a driver call that does not return until released
        return good(h)

    fake.__dict__["nvmlDeviceGetUtilizationRates"] = stuck
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    reader = GpuReader(timeout=0.2)
    t0 = time.monotonic()
    (first,) = reader.sample()
    (second,) = reader.sample()
    assert time.monotonic() - t0 < 1.0
    assert "NVML has not answered" in first["error"] and second["stale_s"] >= first["stale_s"]
    release.set()
    deadline = time.monotonic() + 5
    while "error" in (latest := reader.sample()[0]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert latest["util_pct"] == 40.0
    reader.close()


def test_a_slow_nvml_still_gives_figures(monkeypatch: pytest.MonkeyPatch) -> None:
    """NVML slower than the timeout but faster than the interval: figures one interval late."""
    fake = _fake_nvml(count=1)
    good = fake.nvmlDeviceGetUtilizationRates

    def slow(h: int) -> Any:
        time.sleep(0.3)  # slower than the 0.1 s timeout below, faster than the 0.5 s interval
        return good(h)

    fake.__dict__["nvmlDeviceGetUtilizationRates"] = slow
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    reader = GpuReader(timeout=0.1)
    try:
        samples = []
        for _ in range(5):
            samples.append(reader.sample()[0])
            time.sleep(0.5)
        assert "stale_s" in samples[0]  # the first query had nothing earlier to give
        assert all(s.get("util_pct") == 40.0 for s in samples[1:]), samples
    finally:
        reader.close()


# -- a real GPU -----------------------------------------------------------------------


def test_real_nvml_reads_each_gpu() -> None:
    reader = GpuReader()
    need_gpu(reader)
    try:
        gpus = reader.sample()
        assert len(gpus) == len(reader.names)
        for g in gpus:
            assert "error" not in g, g
            assert 0 <= g["util_pct"] <= 100
            assert 0 < g["mem_used_bytes"] <= g["mem_total_bytes"]
    finally:
        reader.close()


TRAIN_ON_GPU = textwrap.dedent("""
    import time, torch
    from torch.utils.data import DataLoader, TensorDataset
    data = TensorDataset(torch.randn(4096, 4096), torch.randint(0, 10, (4096,)))
    loader = DataLoader(data, batch_size=1024, shuffle=True, num_workers=2, pin_memory=True)
    model = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(8)],
                                torch.nn.Linear(4096, 10)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    end = time.monotonic() + {seconds}
    epochs = 0
    while time.monotonic() < end:
        for x, y in loader:
            x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
            for _ in range(20):  # enough work per batch to keep the GPU busy
                loss = torch.nn.functional.cross_entropy(model(x), y)
                opt.zero_grad(); loss.backward(); opt.step()
        epochs += 1
    torch.cuda.synchronize()
    print("epochs", epochs)
""")


def test_run_records_the_jobs_gpu(tmp_path: Path) -> None:
    reader = GpuReader()
    need_gpu(reader)
    reader.close()
    probe = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.is_available())"],
                           capture_output=True, text=True, check=False)
    if probe.stdout.strip() != "True":
        if REQUIRE_GPU:
            pytest.fail(f"IOLENS_REQUIRE_GPU=1 but torch has no CUDA: {probe.stderr[-300:]}")
        pytest.skip("this PyTorch has no CUDA")
    script = tmp_path / "train.py"
    script.write_text(TRAIN_ON_GPU.format(seconds=6))
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "iolens", "run", "--interval", "0.5",
                           "--out", str(out), "--no-live", "--", sys.executable, str(script)],
                          capture_output=True, text=True, check=False, timeout=300)
    assert proc.returncode == 0, proc.stderr
    meta = json.loads((out / "meta.json").read_text())
    assert meta["gpu"]["available"] is True and meta["gpu"]["names"]
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    gpu_recs = [g for r in records for g in r.get("gpu", [])]
    assert gpu_recs and all("error" not in g for g in gpu_recs)
    assert max(g["util_pct"] for g in gpu_recs) >= 50, [g["util_pct"] for g in gpu_recs]
    assert max(g["mem_used_bytes"] for g in gpu_recs) > 100 << 20
    # The job's batches were timed too.
    assert sum(r["train"].get("batches", 0) for r in records) > 0
    # NVML's process list names the job's main process, unless the container hides it.
    listed = {p for g in gpu_recs for p in g.get("pids", [])}
    if listed:
        assert any(g.get("job_pids") for g in gpu_recs), (listed, meta["root_pid"])
