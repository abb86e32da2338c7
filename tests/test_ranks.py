"""Multi-rank jobs: per-rank timing, the straggler finding, torchrun, and runs of several nodes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from array import array
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from iolens.analysis import rules
from iolens.analysis.verdict import straggler
from iolens.rundir import records
from iolens.rundir.timing import TrainingAggregator
from tests.conftest import need


def rank(r: str, share: float, batches: int = 100, host: str = "n1") -> dict[str, Any]:
    return {"rank": r, "host": host, "batches": batches, "data_wait_share": share}


def test_the_straggler_is_the_rank_that_waits_far_more() -> None:
    f = straggler([rank("0", 0.03), rank("1", 0.62, host="n2"), rank("2", 0.04)])
    assert f is not None and f.subject == {"rank": "1", "host": "n2"}
    assert f.evidence[0].startswith("rank 1 on n2 waited 62% of its step time for data, "
                                    "the other 2 rank(s) 4% (median)")
    assert f.recommendations[0].gain.startswith("up to 2.41x")  # 1 / (1 - (0.62 - 0.035))


@pytest.mark.parametrize(("slow", "found"), [
    (0.03 + rules.STRAGGLER_GAP - 0.001, False), (0.03 + rules.STRAGGLER_GAP + 0.001, True)])
def test_straggler_gap(slow: float, found: bool) -> None:
    assert (straggler([rank("0", 0.03), rank("1", slow)]) is not None) is found


def test_straggler_ratio_and_sample_size() -> None:
    # 10 points apart but not twice the others: everyone waits, no one rank is to blame.
    assert straggler([rank("0", 0.30), rank("1", 0.45)]) is None
    few = rules.STRAGGLER_MIN_BATCHES - 1
    assert straggler([rank("0", 0.01), rank("1", 0.90, batches=few)]) is None
    assert straggler([rank("0", 0.01)]) is None


def test_rank_records_give_per_rank_figures() -> None:
    agg = TrainingAggregator()
    for pid, rk, wait in ((100, 0, 1_000_000), (200, 1, 9_000_000)):
        recs = array("q", [records.RANK, rk, 2, records.EPOCH, 0, 2])
        for i in range(5):
            t = 10_000_000 * (i + 1)
            recs.extend((records.BATCH, t, t + wait))
        agg.feed(pid, recs)
    out = agg.take()
    assert out["world_size"] == 2
    assert out["ranks"]["0"]["batches"] == out["ranks"]["1"]["batches"] == 5
    assert out["ranks"]["1"]["data_wait_s"] == pytest.approx(0.045)
    assert "ranks" not in agg.take()  # nothing new in the next interval


DDP = textwrap.dedent("""
    import os, sys, time, torch, torch.distributed as dist
    from torch.utils.data import DataLoader, Dataset
    rank = int(os.environ["RANK"])
    data = sys.argv[1 + rank]          # each rank its own dataset folder
    cgroup = sys.argv[3] if rank == 1 else ""
    if cgroup:                          # rank 1 reads through the throttle
        with open(os.path.join(cgroup, "cgroup.procs"), "w") as fh:
            fh.write(str(os.getpid()))
    torch.set_num_threads(1)
    dist.init_process_group("gloo")

    class Files(Dataset):
        def __init__(self):
            self.paths = sorted(os.path.join(data, f) for f in os.listdir(data))
        def __len__(self):
            return len(self.paths)
        def __getitem__(self, i):
            with open(self.paths[i], "rb") as fh:
                raw = fh.read()
            return torch.frombuffer(bytearray(raw[:256]), dtype=torch.uint8).float(), 0

    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(256, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(Files(), batch_size=8, num_workers=2)
    for x, y in loader:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(); loss.backward(); opt.step()
    dist.destroy_process_group()
""")


def fill(folder: Path, files: int, kib: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(files):
        (folder / f"{i:05d}.bin").write_bytes(os.urandom(kib * 1024))


def test_torchrun_with_one_rank_on_a_slow_disk_names_it_the_straggler(tmp_path: Path) -> None:
    from iolens.demo.slowdisk import SlowDisk, missing_requirements

    missing = missing_requirements()
    need(not missing, "a slow disk needs " + "; ".join(missing))
    fast = tmp_path / "fast"
    fill(fast, 480, 64)  # written just now: in the page cache
    script = tmp_path / "ddp.py"
    script.write_text(DDP)
    with SlowDisk(96 << 20, read_bps=4 << 20) as disk:
        slow = Path(disk.mount_point) / "data"
        fill(slow, 480, 64)
        disk.evict()
        out = subprocess.run(
            [sys.executable, "-m", "iolens", "run", "--interval", "0.5", "--out",
             str(tmp_path / "run"), "--no-live", "--", sys.executable, "-m",
             "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
             str(script), str(fast), str(slow), disk.cgroup],
            cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    rep = json.loads(subprocess.run(
        [sys.executable, "-m", "iolens", "report", str(tmp_path / "run"), "--format", "json"],
        capture_output=True, text=True, check=True, timeout=120).stdout)
    ranks = {r["rank"]: r for r in rep["training"]["ranks"]}
    assert set(ranks) == {"0", "1"} and ranks["0"]["batches"] == ranks["1"]["batches"] == 60
    (f,) = [f for f in rep["findings"] if f["class"] == "straggler"]
    assert f["rank"] == "1", (f, ranks)
    assert ranks["1"]["data_wait_share"] > ranks["0"]["data_wait_share"] + 0.1


# 60 steps of 20 ms: the worker's start-up (up to 0.3 s on a loaded machine) stays a
# small part of a fast node's wait.
SINGLE = textwrap.dedent("""
    import sys, time, torch
    from torch.utils.data import DataLoader, Dataset
    delay = float(sys.argv[1])
    class D(Dataset):
        def __len__(self):
            return 480
        def __getitem__(self, i):
            time.sleep(delay)
            return torch.zeros(4)
    for x in DataLoader(D(), batch_size=8, num_workers=1):
        time.sleep(0.02)
""")


def test_a_folder_of_node_runs_reports_the_straggler_node(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SINGLE)
    job = tmp_path / "job"
    nodes = []
    for node, rk, delay in (("node-a", "0", "0.0002"), ("node-b", "1", "0.008")):
        env = {**os.environ, "RANK": rk, "WORLD_SIZE": "2"}  # as torchrun sets on each node
        nodes.append(subprocess.Popen(  # (at once, as the nodes of one job run)
            [sys.executable, "-m", "iolens", "run", "--interval", "0.5", "--out",
             str(job / node), "--no-live", "--", sys.executable, str(script), delay],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    for p in nodes:
        _, err = p.communicate(timeout=180)
        assert p.returncode == 0, err
    out = subprocess.run([sys.executable, "-m", "iolens", "report", str(job), "--format", "json"],
                         capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    rep = json.loads(out.stdout)
    assert len(rep["nodes"]) == 2 and [r["rank"] for r in rep["ranks"]] == ["0", "1"]
    (f,) = [f for f in rep["findings"] if f["class"] == "straggler"]
    assert (f["rank"], f["run"]) == ("1", "node-b")
    assert rep["verdict"]["node"] == rep["nodes"][1]["host"]
    text = subprocess.run([sys.executable, "-m", "iolens", "report", str(job)],
                          capture_output=True, text=True, timeout=120, check=True).stdout
    assert "straggler" in text and "node-b" in text
    html = subprocess.run([sys.executable, "-m", "iolens", "report", str(job), "--format",
                           "html"], capture_output=True, text=True, timeout=120, check=False)
    assert html.returncode == 2 and "one run" in html.stderr


def test_a_folder_of_runs_one_after_another_is_not_read_as_the_nodes_of_one_job(
        tmp_path: Path) -> None:
    """A run and the run after its fix, side by side in one folder (as the demo leaves
    them): not ranks of one job, so no straggler between them; the report says what to run
    instead. Runs that overlap (nodes a second apart) still read as one job."""
    import shutil

    kept = Path(__file__).parent / "fixtures" / "runs" / "nothing-worth-changing"
    job = tmp_path / "demo"
    for name in ("1-files", "2-packed"):
        shutil.copytree(kept, job / name)
    meta = json.loads((kept / "meta.json").read_text())
    start = datetime.fromisoformat(meta["start"])

    def begin(after_s: float) -> None:
        later = (start + timedelta(seconds=after_s)).isoformat()
        (job / "2-packed" / "meta.json").write_text(json.dumps({**meta, "start": later}))

    begin(meta["duration_s"] + 20)
    out = subprocess.run([sys.executable, "-m", "iolens", "report", str(job)],
                         capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 2 and out.stdout == "", out
    assert out.stderr.strip() == (
        f"iolens report: {job}: its runs did not run at once, as the nodes of one job do "
        f"(1-files ended 20 s before 2-packed began): report each run (iolens report "
        f"{job / '2-packed'}), or compare two (iolens compare {job / '1-files'} "
        f"{job / '2-packed'})")
    begin(1.0)
    out = subprocess.run([sys.executable, "-m", "iolens", "report", str(job), "--format",
                          "json"], capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    assert len(json.loads(out.stdout)["nodes"]) == 2
