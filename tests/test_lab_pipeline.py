"""The lab, seen from inside the input pipeline: real trainings under `iolens run` with the
command alone (no --path, no --device, no hint), each with the verdict it must get.

- a dataset behind a FUSE mount of an object store (rclone over loopback WebDAV,
  requests limited): storage-bound, the mount named, no page-cache claim;
- a cached dataset on a loop device that another process keeps busy: the device is
  found from the files the workers open, and the noisy neighbour with it;
- light samples with idle workers: compute-bound (samples that burn CPU, samples that
  sleep and batches whose hand-over is the wait are in tests/test_lab_advice.py).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import need
from tests.fuselab import fuse_lab_skip_reason, slow_fuse
from tests.test_lab import noisy_reader
from tests.test_lab import run_case as lab_run

pytest.importorskip("torch")

COMMON = """
import os, sys, time, torch
from torch.utils.data import DataLoader, Dataset
torch.set_num_threads(1)
"""

FILES = COMMON + """
D = sys.argv[1]
NAMES = sorted(os.listdir(D))
class Files(Dataset):
    def __len__(self):
        return 100_000
    def __getitem__(self, i):
        with open(os.path.join(D, NAMES[i % len(NAMES)]), "rb") as fh:
            return torch.tensor(fh.read()[0], dtype=torch.float32)
end = time.monotonic() + float(sys.argv[2])
for x in DataLoader(Files(), batch_size=4, num_workers=int(sys.argv[3])):
    time.sleep(float(sys.argv[4]))  # the model step
    if time.monotonic() > end:
        break
print("done")
"""

LIGHT = COMMON + """
class Samples(Dataset):
    def __len__(self):
        return 100_000
    def __getitem__(self, i):
        return torch.zeros(16)

loader = DataLoader(Samples(), batch_size=4, num_workers=int(sys.argv[2]),
                    persistent_workers=True)
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    for x in loader:
        time.sleep(0.12)  # the model step: 40x a batch's hand-over on a loaded machine
        if time.monotonic() > end:
            break
print("done")
"""


def run_case(tmp_path: Path, code: str, *args: str) -> dict[str, Any]:
    """The lab's run (tests/test_lab.py), with the run's meta.json and records beside."""
    report, _ = lab_run(tmp_path, code, *args)
    run = tmp_path / "run"
    report["_meta"] = json.loads((run / "meta.json").read_text())
    report["_records"] = [json.loads(x) for x in (run / "records.jsonl").read_text().splitlines()]
    return report


def classes(report: dict[str, Any]) -> list[str]:
    return [f["class"] for f in report["findings"]]


def test_a_dataset_behind_a_slow_fuse_mount_is_storage_bound_and_named(tmp_path: Path) -> None:
    """rclone mount of a loopback WebDAV server, 20 requests/s: storage-bound, the mount
    and its type named, no device claimed, and no page-cache figure or finding."""
    reason = fuse_lab_skip_reason()
    need(reason is None, reason or "")
    src = tmp_path / "bucket"
    src.mkdir()
    for i in range(200):
        (src / f"{i:04d}.bin").write_bytes(os.urandom(32 << 10))
    with slow_fuse(str(src), 20, tmp=tmp_path) as lab:
        report = run_case(tmp_path, FILES, lab.mount_point, "8", "2", "0.005")
    v = report["verdict"]
    assert v["class"] == "storage-bound", v
    top = v["storage"][0]  # the dataset's: the most files opened there
    assert (top["mount"], top["fstype"], top["device"], top["kind"]) == (
        lab.mount_point, "fuse.rclone", None, "fuse"), v["storage"]
    assert v["devices"] == []  # no block device serves it
    assert any(lab.mount_point in e and "fuse.rclone" in e for e in v["evidence"]), v
    p = report["pipeline"]
    assert p["fetch_blocked_share"] > 0.7 and p["files_per_sample"] >= 0.9, p
    assert p["bytes_per_sample"] >= 16 << 10, p  # from rchar: FUSE reads never reach read_bytes
    assert "warm-cache" not in classes(report)
    worker = report["processes"]["worker"]
    assert worker["cache_hit"] is None and "fuse.rclone" in worker["cache_hit_note"]
    waiting = [r["storage"][lab.mount_point].get("waiting") for r in report["_records"]
               if lab.mount_point in (r.get("storage") or {})]
    assert waiting and max(w or 0 for w in waiting) >= 1, waiting
    served = report["_meta"]["storage"]
    assert [s["daemon_pid"] for s in served if s["mount"] == lab.mount_point] == [lab.mount_pid]
    assert any("cache" in r["action"] for r in v["recommendations"])


def test_a_cached_dataset_on_a_busy_device_finds_the_device_and_the_neighbour(
        tmp_path: Path) -> None:
    """The dataset sits in the page cache on a loop device that another process keeps busy
    with direct reads: the device is watched from the files the workers open (the job runs
    from elsewhere, with no --path), and the noisy-neighbor finding names it."""
    from iolens.demo.slowdisk import SlowDisk, missing_requirements

    missing = missing_requirements()
    need(not missing, "a loop device needs " + "; ".join(missing))
    with SlowDisk(192 << 20, read_bps=1 << 30) as disk:  # nobody joins its throttle
        data = Path(disk.mount_point) / "data"
        data.mkdir()
        for i in range(64):
            (data / f"{i:03d}.bin").write_bytes(os.urandom(16 << 10))
        for f in data.iterdir():  # in the page cache from here on
            f.read_bytes()
        with noisy_reader(Path(disk.mount_point) / "other.bin"):
            report = run_case(tmp_path, FILES, str(data), "8", "1", "0.02")
        loop = disk.loop_name
    why = report["_meta"]["devices"].get(loop)
    assert why is not None and "serves the dataset" in why, report["_meta"]["devices"]
    assert report["verdict"]["storage"][0]["device"] == loop, report["verdict"]["storage"]
    neighbors = [f for f in report["findings"] if f["class"] == "noisy-neighbor"]
    assert any(loop in f["evidence"][0] for f in neighbors), report["findings"]


def test_light_samples_with_idle_workers_are_compute_bound(tmp_path: Path) -> None:
    """Light samples with idle workers. CPU-heavy samples (fetch on CPU above 0.7), sleeping
    ones (blocked above 0.7) and batches whose hand-over is the wait are told apart in
    tests/test_lab_advice.py, which also follows their advice."""
    report = run_case(tmp_path, LIGHT, "6", "2")
    v, p = report["verdict"], report["pipeline"]
    assert v["class"] == "compute-bound", (v, p)
    assert p["worker_idle_share"] > 0.7, p
