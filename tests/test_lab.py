"""The lab: real training runs on this machine, each with the verdict it must get.

Each case runs a small real PyTorch training end to end under `iolens run`,
then `iolens report --format json`, and checks the class (and the findings
that go with it). The storage-bound case, on a throttled loop device, is in
tests/test_slowdisk.py; the CPU-bound input case, with its advice followed, in
tests/test_lab_advice.py. Scripts keep torch on one thread so that the two
cores of this machine leave room for the recorder and the workers.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import need

pytest.importorskip("torch")

COMMON = """
import os, sys, time, torch
from torch.utils.data import DataLoader, Dataset
torch.set_num_threads(1)
torch.manual_seed(0)
"""

COMPUTE_BOUND = COMMON + """
class Cached(Dataset):
    def __init__(self):
        self.x = torch.randn(4096, 256)
    def __len__(self):
        return 4096
    def __getitem__(self, i):
        return self.x[i], i % 4

w = torch.randn(256, 256, requires_grad=True)
loader = DataLoader(Cached(), batch_size=32, num_workers=1, persistent_workers=True)
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    for x, y in loader:
        h = x
        for _ in range(700):  # the model step dominates, by 20x a hand-over under load
            h = torch.tanh(h @ w)
        h.sum().backward()
        if time.monotonic() > end:
            break
"""

WRITE_STALL = COMMON + """
class Cached(Dataset):
    def __len__(self):
        return 100_000
    def __getitem__(self, i):
        return torch.zeros(64), 0

with open(os.path.join(sys.argv[4], "cgroup.procs"), "w") as fh:  # the slow disk's writers
    fh.write(str(os.getpid()))
model = torch.nn.Linear(64, 4)
blob = os.urandom(1 << 20)
ckpt = sys.argv[2]
end = time.monotonic() + float(sys.argv[1])
last = time.monotonic()
for x, y in DataLoader(Cached(), batch_size=64, num_workers=1):
    time.sleep(0.02)  # the model step
    if time.monotonic() - last > 1.5:  # a large checkpoint, synced to disk, in the loop
        with open(ckpt, "wb") as fh:
            for _ in range(int(sys.argv[3])):
                fh.write(blob)
            fh.flush()
            os.fsync(fh.fileno())
        last = time.monotonic()
    if time.monotonic() > end:
        break
"""


def run_case(tmp_path: Path, code: str, *args: str, sets: Sequence[str] = (),
             autotune: bool = False) -> tuple[dict[str, Any], str]:
    """``code`` run as ``tmp_path/train.py`` with ``args`` under `iolens run` (with a
    ``--set`` for each of ``sets``, as a verdict's "with no code change" line gives them,
    and ``--autotune``): its report and iolens' stderr."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(code))
    run = tmp_path / "run"
    extra = [x for s in sets for x in ("--set", s)] + (["--autotune"] if autotune else [])
    out = subprocess.run([sys.executable, "-m", "iolens", "run", "--interval", "0.5", "--out",
                          str(run), "--no-live", *extra, "--", sys.executable, str(script),
                          *args],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr
    rep = subprocess.run([sys.executable, "-m", "iolens", "report", str(run), "--format", "json"],
                         capture_output=True, text=True, timeout=120, check=True)
    return json.loads(rep.stdout), out.stderr


def disturbed(report: dict[str, Any]) -> float:
    """How much of the machine's CPU time (%) a run lost to others: stolen by the host, or
    used by processes not of the job (the recorder among them, 1-2%)."""
    cpu = report["cpu"]
    run = report["run"]
    secs = float(run.get("duration_s") or 0) * int(run.get("cpus") or 1)
    job = sum(float(p.get("cpu_pct") or 0) * float(p.get("seconds") or 0)
              for p in report["processes"].values())
    busy = float(cpu.get("user") or 0) + float(cpu.get("system") or 0)
    return float(cpu.get("steal") or 0) + max(0.0, busy - job / secs if secs else 0.0)


QUIET_MAX = 10.0
"""The share of the CPU (%) taken from a run by others under which it stands for this
machine (see `quiet_case`)."""


def quiet_case(tmp_path: Path, code: str, *args: str, sets: Sequence[str] = (),
               tries: int = 3) -> tuple[dict[str, Any], Path]:
    """`run_case` for a job whose speed is its CPU: run in ``tmp_path/try<i>`` until a run
    has lost under QUIET_MAX of the machine to others (`disturbed`), at most ``tries``
    times; the least disturbed run's report and run directory.

    A run on this machine shares its two cores with whatever else runs and with the host,
    which in the clean-clone CI stole up to a third of them for minutes. There a cheaper
    transform measured 54% above its prediction; three quiet pairs of the same runs here
    measured within 5% of theirs."""
    runs: list[tuple[float, dict[str, Any], Path]] = []
    for i in range(tries):
        d = tmp_path / f"try{i}"
        d.mkdir(parents=True)
        report, _ = run_case(d, code, *args, sets=sets)
        runs.append((disturbed(report), report, d / "run"))
        if runs[-1][0] < QUIET_MAX:
            break
    _, report, run = min(runs, key=lambda r: r[0])
    return report, run


@contextlib.contextmanager
def noisy_reader(big: Path) -> Iterator[None]:
    """Another process that reads a 96 MiB file at ``big`` over and over, with direct I/O so
    that every read reaches the disk, for the block."""
    with open(big, "wb") as fh:
        for _ in range(96):
            fh.write(os.urandom(1 << 20))
    noisy = subprocess.Popen(
        ["bash", "-c", f"while true; do dd if={big} of=/dev/null bs=256k iflag=direct "
                       "status=none; done"], start_new_session=True)
    try:
        yield
    finally:
        os.killpg(noisy.pid, 9)
        noisy.wait()


def classes(report: dict[str, Any]) -> list[str]:
    return [f["class"] for f in report["findings"]]


def test_heavy_compute_with_cached_data_is_compute_bound(tmp_path: Path) -> None:
    report, err = run_case(tmp_path, COMPUTE_BOUND, "8")
    v = report["verdict"]
    assert v["class"] == "compute-bound", (v, err)
    assert v["severity"] == "none" and v["data_wait_share"] < 0.05
    assert "noisy-neighbor" not in classes(report)


def test_a_compute_bound_job_beside_a_heavy_reader_has_a_noisy_neighbor(tmp_path: Path) -> None:
    need(os.geteuid() == 0, "needs root to drop the noisy reader's file from the page cache")
    with noisy_reader(tmp_path / "neighbor.bin"):
        report, err = run_case(tmp_path, COMPUTE_BOUND, "8")
    v = report["verdict"]
    assert v["class"] == "compute-bound", (v, err)
    (neighbor,) = [f for f in report["findings"] if f["class"] == "noisy-neighbor"]
    assert "by this job" in neighbor["evidence"][0]


def test_checkpoints_that_flood_the_disk_are_a_write_stall(tmp_path: Path) -> None:
    from iolens.demo.slowdisk import SlowDisk, missing_requirements

    missing = missing_requirements()
    need(not missing, "a slow disk needs " + "; ".join(missing))
    # Checkpoints of 48 MiB, synced, to a disk that writes 32 MiB/s: each stalls the
    # loop for about 1.5 s while the disk is saturated by the job's own writes.
    with SlowDisk(256 << 20, write_bps=32 << 20) as disk:
        report, err = run_case(tmp_path, WRITE_STALL, "9", f"{disk.mount_point}/ckpt.bin", "48",
                               disk.cgroup)
    v = report["verdict"]
    assert v["class"] == "write-stall", (v, err, report["devices"])
    assert v["devices"] == [disk.loop_name]
    assert "writes by the training process" in v["evidence"][0]
    assert "asynchronously" in v["recommendations"][0]["action"]
    assert report["devices"][disk.loop_name]["util_max_pct"] >= 90
    # Watched from the first checkpoint opened there, not only when a scan of the open
    # files happens to catch one open.
    assert "the job writes files in" in report["devices"][disk.loop_name]["why"]
