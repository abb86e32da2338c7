"""A run of several hours compressed into minutes: `iolens run --interval 0.05`.

At 0.05 s an interval, the default 600 s give 12,000 intervals, as many as
3 h 20 min at 1 s. The test samples the resident memory of the recorder
(the `iolens run` process) and of the job's main process from outside and
fits a line through the second half of the run: neither may grow. The run
mostly sleeps, so `scripts/unit.sh` runs it beside the rest of the suite.
IOLENS_SOAK_SECONDS shortens it for a quick look.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest

pytestmark = pytest.mark.soak

SECONDS = float(os.environ.get("IOLENS_SOAK_SECONDS", "600"))
INTERVAL = 0.05
# Allowed growth over the second half of the run, from a fitted line, so that
# one allocator step does not count. A leak of one record per interval
# (~300 bytes) would show as 1.8 MB over 6,000 intervals.
MAX_GROWTH_BYTES = 1.5 * 2**20

JOB = textwrap.dedent("""
    import sys, time, torch
    from torch.utils.data import DataLoader, Dataset
    # One thread: torch's default pool spins between ops, and with it this job took half
    # a core of the two the rest of the suite, running beside it, measures its lab cases on.
    torch.set_num_threads(1)

    class Samples(Dataset):
        def __len__(self):
            return 256
        def __getitem__(self, i):
            return torch.full((64,), float(i)), i % 4

    if __name__ == "__main__":
        end = time.monotonic() + float(sys.argv[1])
        loader = DataLoader(Samples(), batch_size=16, num_workers=2, persistent_workers=True)
        model = torch.nn.Linear(64, 4)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        steps = 0
        while time.monotonic() < end:
            for x, y in loader:
                loss = torch.nn.functional.cross_entropy(model(x), y)
                opt.zero_grad(); loss.backward(); opt.step()
                steps += 1
                time.sleep(0.02)  # a light job: the soak must not load the machine
        print("steps", steps, flush=True)
""")


def rss_bytes(pid: int) -> int | None:
    """VmRSS of ``pid``, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None


def child_pid(pid: int) -> int | None:
    """The first child of ``pid`` (the job under `iolens run`)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as fh:
            kids = fh.read().split()
    except OSError:
        kids = []
    if kids:
        return int(kids[0])
    # Without CONFIG_PROC_CHILDREN: scan for a process whose parent is pid.
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    stat = fh.read()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                return int(entry)
    return None


def growth(samples: list[tuple[float, int]]) -> float:
    """Bytes gained over the second half of ``samples``, from a least-squares line."""
    half = samples[len(samples) // 2:]
    n = len(half)
    mt = sum(t for t, _ in half) / n
    mv = sum(v for _, v in half) / n
    var = sum((t - mt) ** 2 for t, _ in half)
    slope = sum((t - mt) * (v - mv) for t, v in half) / var
    return slope * (half[-1][0] - half[0][0])


def test_fast_interval_for_minutes_without_memory_growth(
        tmp_path: Path, record_property: Callable[[str, object], None]) -> None:
    """0.05 s interval for 10 minutes (12,000 intervals): neither recorder nor job grows in memory.

    The memory of both is sampled from outside every few seconds while the job trains.
    """
    (tmp_path / "job.py").write_text(JOB)
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "iolens", "run", "--out", str(run_dir), "--interval", str(INTERVAL),
         "--no-live", "--", sys.executable, str(tmp_path / "job.py"), str(SECONDS)],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    recorder: list[tuple[float, int]] = []
    job: list[tuple[float, int]] = []
    job_pid: int | None = None
    start = time.monotonic()
    try:
        while proc.poll() is None:
            now = time.monotonic() - start
            if job_pid is None and now > 5:
                job_pid = child_pid(proc.pid)
            # The first 10% is warm-up: imports, first epoch, worker start. Once
            # the job is gone the recorder reads the whole run for its verdict,
            # which is not growth: sampling stops there.
            job_rss = rss_bytes(job_pid) if job_pid is not None else None
            rec_rss = rss_bytes(proc.pid)
            if job_rss is not None and rec_rss is not None and now > SECONDS * 0.1:
                recorder.append((now, rec_rss))
                job.append((now, job_rss))
            time.sleep(max(SECONDS / 200, 0.2))
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err[-3000:]
    assert out.startswith("steps "), out
    lines = (run_dir / "records.jsonl").read_text().splitlines()
    meta = json.loads((run_dir / "meta.json").read_text())
    assert len(recorder) > 20 and len(job) > 20
    rec_growth, job_growth = growth(recorder), growth(job)
    expected = SECONDS / INTERVAL
    record_property("measured", f"{len(lines)} intervals recorded; the job trained for "
                                f"{SECONDS:.0f} s ({expected:.0f} intervals)")
    record_property("measured", f"recorder RSS {recorder[0][1] / 2**20:.1f} -> "
                                f"{recorder[-1][1] / 2**20:.1f} MiB, fitted growth over the second "
                                f"half {rec_growth / 2**10:+.0f} KiB")
    record_property("measured", f"job RSS {job[0][1] / 2**20:.1f} -> {job[-1][1] / 2**20:.1f} MiB, "
                                f"fitted growth over the second half {job_growth / 2**10:+.0f} KiB")
    # A loaded machine may delay some intervals, but most must be there.
    assert len(lines) > 0.5 * expected, (len(lines), expected)
    assert meta.get("lost_lines", 0) == 0
    assert rec_growth < MAX_GROWTH_BYTES, recorder
    assert job_growth < MAX_GROWTH_BYTES, job
