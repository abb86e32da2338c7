"""Storage advice followed, on a real slow disk (a throttled loop device): the run with the
command alone, the storage probe the verdict offers, the advice it settles, and the fix.

- a disk that limits bytes (8 MiB/s, as a cloud volume's throughput cap) under 64 KiB
  files: the probe finds the bandwidth limit, packing is declined (it would read the
  same bytes; the review saw a pack make such a run 2.5x slower), and the cache it
  advises is followed: the dataset copied to /dev/shm, the run again, the throughput
  held against the prediction, and `iolens compare` says whether it held;
- the same bytes a second limited on the loop device itself, as a cgroup's limit on a
  volume: the device is not saturated, the verdict finds the limit from the fetch's own
  wait, and the cache it advises is followed and held;
- a disk that limits requests (IOPS) under the same files: the probe finds the request
  limit and packing is advised with a prediction; followed with iolens' own tools (`iolens
  pack --shuffle`, then iolens.data's HDF5Dataset read through BlockShuffleSampler), the
  run again is held against the prediction;
- the same disk under one HDF5 file of those samples, read a row at a time by the job's
  own dataset class: the data is packed already, so the advice is to read it in blocks of
  consecutive rows (BlockShuffleSampler, with a __getitems__ written as a user would), and
  the run after is held against the prediction.

The training joins the slow disk's blkio group itself, and drops its dataset's pages from
the page cache before every epoch: those are the lab's stand-ins for a slow device and for
a dataset larger than RAM, not hints to iolens.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import need
from tests.test_lab import run_case

pytest.importorskip("torch")

FILES = 1200  # 75 MiB: more than a run reads at 8 MiB/s, so no file is read twice
KIB = 64

LOOP = """
loader = DataLoader(ds, batch_size=16, num_workers=2, persistent_workers=True, **order)
end = time.monotonic() + SECONDS
while time.monotonic() < end:
    evict()
    for x, y in loader:
        time.sleep(STEP_S)  # the model step
        if time.monotonic() > end:
            break
print("done")
"""
"""The lab jobs' training loop (after their dataset ``ds`` and its ``order``): 2 workers,
the dataset's pages dropped before every epoch, a sleep for the model step."""

TRAIN = """
import os, sys, time, torch
from torch.utils.data import DataLoader, Dataset
import h5py  # read in before the throttle, as torch is
torch.set_num_threads(1)
D, SECONDS, CGROUP = sys.argv[1], float(sys.argv[2]), sys.argv[3]
PACKED = len(sys.argv) > 4 and sys.argv[4] == "pack"
STEP_S = float(sys.argv[5]) if len(sys.argv) > 5 else 0.005
if CGROUP != "-":  # the slow disk's readers
    with open(os.path.join(CGROUP, "cgroup.procs"), "w") as fh:
        fh.write(str(os.getpid()))

def evict():  # a dataset larger than RAM: no epoch finds it in the page cache
    for name in os.listdir(D):
        fd = os.open(os.path.join(D, name), os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)

def tensor(data):
    return torch.frombuffer(bytearray(data[:256]), dtype=torch.uint8).float()

if PACKED:  # as the pack advice says: shuffled blocks of consecutive samples, a batch each
    from iolens.data import BlockShuffleSampler, HDF5Dataset
    ds = HDF5Dataset(D, transform=tensor)
    order = dict(sampler=BlockShuffleSampler(ds, 16))
else:
    NAMES = sorted(os.listdir(D))
    class Files(Dataset):
        def __len__(self):
            return len(NAMES)
        def __getitem__(self, i):
            with open(os.path.join(D, NAMES[i]), "rb") as fh:
                return tensor(fh.read()), i % 4
    ds, order = Files(), dict(shuffle=True)
""" + LOOP


def need_slow_disk() -> None:
    from iolens.demo.slowdisk import missing_requirements

    need(os.geteuid() == 0, "needs root to attach loop devices and make blkio cgroups")
    missing = missing_requirements()
    need(not missing, "cannot make a slow disk here: needs " + "; ".join(missing))


def iolens(*args: str, cgroup: str | None = None) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "iolens", *args]
    if cgroup is not None:  # run where the job's reads are throttled, as the job is
        cmd = ["sh", "-c", f'echo $$ > {cgroup}/cgroup.procs && exec "$@"', "sh", *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180, check=False)


@pytest.fixture
def dataset_disk(request: pytest.FixtureRequest) -> Iterator[Any]:
    from iolens.demo.slowdisk import SlowDisk

    need_slow_disk()
    with SlowDisk(224 << 20, **request.param) as disk:  # the files, and a pack of them
        data = Path(disk.mount_point) / "data"
        data.mkdir()
        for i in range(FILES):
            (data / f"{i:05d}.bin").write_bytes(os.urandom(KIB << 10))
        disk.evict()
        yield disk


def report(run: Path) -> dict[str, Any]:
    out = iolens("report", str(run), "--format", "json")
    assert out.returncode == 0, out.stderr
    return dict(json.loads(out.stdout))


STOLEN_MAX = 10.0
"""CPU stolen by the host (%) under which a run after the advice stands for this machine."""


@pytest.mark.parametrize("dataset_disk", [{"read_bps": 8 << 20}], indirect=True)
def test_a_bandwidth_cap_is_not_packed_and_the_cache_it_advises_holds(
        tmp_path: Path, dataset_disk: Any) -> None:
    disk = dataset_disk
    data = Path(disk.mount_point) / "data"
    first, err = run_case(tmp_path, TRAIN, str(data), "6", disk.cgroup)
    v = first["verdict"]
    assert v["class"] == "storage-bound", (v, err)
    assert any("iolens probe --storage" in r["action"] for r in v["recommendations"]), v
    # the probe the verdict offers, run as it says, where the job runs
    probe = iolens("probe", "--storage", str(data), "--run", str(tmp_path / "run"),
                   "--format", "json", cgroup=disk.cgroup)
    assert probe.returncode == 0, probe.stderr
    assert json.loads(probe.stdout)["limit"] == "bandwidth", probe.stdout
    v = report(tmp_path / "run")["verdict"]
    assert any("limits bytes" in e for e in v["evidence"]), v["evidence"]
    assert not any("pack" in (r.get("change") or {}) for r in v["recommendations"]), v
    assert any("pack" in (r.get("change") or {}) for r in v["declined"]), v["declined"]
    cache = v["recommendations"][0]
    assert cache["change"] == {"storage": "ram"} and cache["prediction"], cache
    # followed: the dataset in RAM, the same training again. This loop is bound by the
    # hand-over, a wake-up of the training process per batch, which CPU the host steals
    # slows tenfold: in the clean-clone CI, runs with 28-33% of their CPU stolen ran 42-49
    # steps/s (hand-over 15-17 ms a batch) where runs with under 6% ran 129-151 (1.5 ms).
    # The prediction is for this machine as the run before saw it (8% stolen): up to four
    # runs, the two with the least stolen are held to it, and the steal is in the message.
    shm = Path("/dev/shm") / f"iolens-lab-{os.getpid()}"
    shutil.copytree(data, shm)
    try:
        after: list[tuple[float, float]] = []
        fed: list[float] = []
        for i in range(4):
            d = tmp_path / f"after{i}"
            d.mkdir()
            rep, _ = run_case(d, TRAIN, str(shm), "6", "-")
            after.append((float(rep["cpu"].get("steal") or 0.0),
                          float(rep["verdict"]["figures"]["steps_per_s"])))
            fed.append(float(rep["verdict"]["model"]["compute_ms"]))
            if sum(steal < STOLEN_MAX for steal, _ in after) >= 2:
                break
    finally:
        shutil.rmtree(shm, ignore_errors=True)
    # The starved run's compute is the fed runs' (each batch's step less its own wait): the
    # model read it from the intervals' sums once, and a starved run gave 6-98 ms a batch
    # for a 5 ms step.
    starved = float(first["verdict"]["model"]["compute_ms"])
    assert starved == pytest.approx(statistics.median(fed), rel=0.15), (starved, fed)
    p = cache["prediction"]
    kept = [rate for _, rate in sorted(after)[:2]]
    mean = sum(kept) / len(kept)
    assert abs(mean / p["steps_per_s"] - 1) <= 0.25, (p, "(steal %, steps/s):", after)
    cmp = iolens("compare", str(tmp_path / "run"), str(tmp_path / "after0" / "run"),
                 "--format", "json")
    proof = json.loads(cmp.stdout)["prediction"]
    assert proof["change"].get("storage") == "ram", proof
    assert proof["held"] is (abs(proof["error"]) <= 0.25 and not proof["wrong_way"]), proof


@pytest.mark.parametrize("dataset_disk", [{"read_bps": 8 << 20, "above": True}],
                         indirect=True)
def test_a_limit_above_the_device_is_found_from_the_wait_and_its_cache_holds(
        tmp_path: Path, dataset_disk: Any) -> None:
    """The same 8 MiB/s, set on the loop device itself (a cgroup's limit on a volume): the
    device is not saturated, yet the fetch blocks reading it. The verdict finds the limit
    from the workers' own timing, names the device, and the cache it advises holds."""
    disk = dataset_disk
    data = Path(disk.mount_point) / "data"
    first, err = run_case(tmp_path, TRAIN, str(data), "6", disk.cgroup)
    v = first["verdict"]
    assert v["class"] == "storage-bound", (v, err)
    assert v["devices"] == [disk.loop_name], v
    load = first["devices"][disk.loop_name]
    assert load["util_pct"] < 50, load  # the requests wait above the device
    # The workers, read from /proc, were in state D (NOTE [blocked by role]).
    roles = [json.loads(line)["job"].get("roles") or {}
             for line in (tmp_path / "run" / "records.jsonl").read_text().splitlines()]
    workers = [r["worker"] for r in roles if "worker" in r]
    assert sum(w["blocked"] for w in workers) > 0, workers
    cache = v["recommendations"][0]
    assert cache["change"] == {"storage": "ram"} and cache["prediction"], cache
    assert "above" in cache["because"], cache
    assert not any("num_workers" in (r.get("change") or {}) for r in v["recommendations"]), v
    shm = Path("/dev/shm") / f"iolens-lab-{os.getpid()}"
    shutil.copytree(data, shm)
    try:
        after = []
        for i in range(2):
            d = tmp_path / f"after{i}"
            d.mkdir()
            rep, _ = run_case(d, TRAIN, str(shm), "6", "-")
            after.append(float(rep["verdict"]["figures"]["steps_per_s"]))
    finally:
        shutil.rmtree(shm, ignore_errors=True)
    # Two clean-clone CI runs predicted 132 and 135 steps/s for 165-169 measured, from a
    # hand-over timed while the loop waited (NOTE [the loop's own hand-over] in
    # iolens/analysis/model/records.py); bounded by the loop's CPU, 165 for 168.
    p = cache["prediction"]
    print(f"\nlab: a limit above the device, {p['now_steps_per_s']:.1f} steps/s; cache "
          f"predicted {p['steps_per_s']:.1f} ({p['low']:.1f}-{p['high']:.1f}); measured {after}")
    assert abs(statistics.fmean(after) / p["steps_per_s"] - 1) <= 0.25, (p, after)


# A step long enough that the packed run is bound by it, not by the disk: the probe's
# O_DIRECT reads and the page cache's in-order reads reach this loop device in requests of
# different sizes (512 KiB and more, as the memory behind them allows), so the disk's
# rate after packing is known to about +-25% only (73 to 124 MiB/s seen), while the step
# is measured.
STEP_S = "0.015"


@pytest.mark.parametrize("dataset_disk", [{"read_iops": 150}], indirect=True)
def test_a_request_cap_is_packed_and_the_pack_holds_its_prediction(
        tmp_path: Path, dataset_disk: Any) -> None:
    disk = dataset_disk
    data = Path(disk.mount_point) / "data"
    first, err = run_case(tmp_path, TRAIN, str(data), "6", disk.cgroup, "files", STEP_S)
    assert first["verdict"]["class"] == "storage-bound", (first["verdict"], err)
    probe = iolens("probe", "--storage", str(data), "--run", str(tmp_path / "run"),
                   "--format", "json", cgroup=disk.cgroup)
    assert probe.returncode == 0, probe.stderr
    found = json.loads(probe.stdout)
    assert found["limit"] == "iops", probe.stdout
    v = report(tmp_path / "run")["verdict"]
    pack = next(r for r in v["recommendations"] if "pack" in (r.get("change") or {}))
    p = pack["prediction"]
    assert p is not None and p["steps_per_s"] > 1.5 * p["now_steps_per_s"], pack
    assert "limits requests" in pack["because"], pack
    assert "--shuffle" in pack["action"] and "BlockShuffleSampler" in pack["action"], pack
    # followed: packed onto the same slow disk (as HDF5, which every epoch's eviction reaches:
    # the pages of an LMDB map stay while a worker maps them), read as the advice says
    packed = Path(disk.mount_point) / "packed"
    done = iolens("pack", str(data), str(packed), "--format", "hdf5", "--shuffle")
    assert done.returncode == 0, done.stderr
    after, fed = [], []
    for i in range(2):
        d = tmp_path / f"after{i}"
        d.mkdir()
        rep, err = run_case(d, TRAIN, str(packed), "6", disk.cgroup, "pack", STEP_S)
        after.append(float(rep["verdict"]["figures"]["steps_per_s"]))
        fed.append(float(rep["verdict"]["model"]["compute_ms"]))
    # the run starved by the request cap reads the compute of the packed runs, which their
    # step binds
    starved = float(v["model"]["compute_ms"])
    assert starved == pytest.approx(statistics.fmean(fed), rel=0.15), (starved, fed)
    mean = sum(after) / len(after)
    print(f"\nlab: IOPS cap, {p['now_steps_per_s']:.1f} steps/s; pack predicted "
          f"{p['steps_per_s']:.1f} ({p['low']:.1f}-{p['high']:.1f}, {p['limit']}); "
          f"measured {after}; probe: {found['iops_ceiling']:.0f} reads/s, "
          f"{found['bandwidth_ceiling'] / 2**20:.1f} MiB/s in "
          f"{found['sequential']['request_bytes'] >> 10} KiB reads")
    assert abs(mean / p["steps_per_s"] - 1) <= 0.25, (p, after, err)
    cmp = iolens("compare", str(tmp_path / "run"), str(tmp_path / "after0" / "run"),
                 "--format", "json")
    proof = json.loads(cmp.stdout)["prediction"]
    assert proof["change"].get("pack") is True, proof
    assert proof["held"] is (abs(proof["error"]) <= 0.25 and not proof["wrong_way"]), proof


def test_a_rate_limited_store_gets_no_more_workers_and_more_do_not_help(
        tmp_path: Path) -> None:
    """rclone over loopback WebDAV at 20 requests/s: the probe finds the rate limit, more
    workers are predicted to gain nothing, and a run with them (on a fresh mount, so that
    no page is cached) gains nothing."""
    from tests.fuselab import fuse_lab_skip_reason, slow_fuse
    from tests.test_lab_pipeline import FILES as FUSE_TRAIN

    reason = fuse_lab_skip_reason()
    need(reason is None, reason or "")
    src = tmp_path / "bucket"
    src.mkdir()
    for i in range(300):
        (src / f"{i:04d}.bin").write_bytes(os.urandom(32 << 10))
    before_dir = tmp_path / "before"
    before_dir.mkdir()
    with slow_fuse(str(src), 20, tmp=tmp_path / "m1") as lab:
        first, err = run_case(before_dir, FUSE_TRAIN, lab.mount_point, "6", "2", "0.005")
        assert first["verdict"]["class"] == "storage-bound", (first["verdict"], err)
        probe = iolens("probe", "--storage", lab.mount_point, "--run",
                       str(before_dir / "run"), "--format", "json")
    assert probe.returncode == 0, probe.stderr
    assert json.loads(probe.stdout)["limit"] == "rate", probe.stdout
    v = report(before_dir / "run")["verdict"]
    assert any("rate limit" in e for e in v["evidence"]), v["evidence"]
    assert not any(r["action"].startswith("raise num_workers") for r in v["recommendations"])
    rec = next(r for r in v["recommendations"] if r["action"].startswith("do not add"))
    p = rec["prediction"]
    assert p["steps_per_s"] < 1.05 * p["now_steps_per_s"], rec
    assert any((r.get("change") or {}) == {"storage": "ram"} and r["prediction"]
               for r in v["recommendations"]), v["recommendations"]
    # the counterfactual: the workers it advises against
    n = str(rec["change"]["num_workers"])
    after = []
    for i in range(2):
        d = tmp_path / f"after{i}"
        d.mkdir()
        with slow_fuse(str(src), 20, tmp=tmp_path / f"m{i + 2}") as lab:
            rep, _ = run_case(d, FUSE_TRAIN, lab.mount_point, "6", n, "0.005")
        after.append(float(rep["verdict"]["figures"]["steps_per_s"]))
    mean = sum(after) / len(after)
    assert abs(mean / p["steps_per_s"] - 1) <= 0.25, (p, after)


H5_TRAIN = """
import os, sys, time, torch
from torch.utils.data import DataLoader, Dataset
import h5py
torch.set_num_threads(1)
PATH, SECONDS, CGROUP, ORDER = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4]
STEP_S = float(sys.argv[5])
with open(os.path.join(CGROUP, "cgroup.procs"), "w") as fh:  # the slow disk's readers
    fh.write(str(os.getpid()))

def evict():  # a dataset larger than RAM
    fd = os.open(PATH, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)

class Rows(Dataset):  # one HDF5 file, one row of bytes per sample
    def __init__(self):
        with h5py.File(PATH, "r") as f:
            self.n = len(f["x"])
        self.x = None
    def __len__(self):
        return self.n
    def rows(self):
        if self.x is None:  # opened in the worker that reads it
            self.x = h5py.File(PATH, "r")["x"]
        return self.x
    def __getitem__(self, i):
        return torch.from_numpy(self.rows()[i][:256]).float(), i % 4

class Blocks(Rows):  # as the advice says: a run of consecutive rows in one read
    def __getitems__(self, idx):
        a = idx[0]
        if list(idx) != list(range(a, a + len(idx))):
            return [self[i] for i in idx]
        rows = self.rows()[a:a + len(idx)]
        return [(torch.from_numpy(r[:256]).float(), i % 4) for r, i in zip(rows, idx)]

if ORDER == "blocks":
    from iolens.data import BlockShuffleSampler
    ds = Blocks()
    order = dict(sampler=BlockShuffleSampler(ds, 16))
else:
    ds, order = Rows(), dict(shuffle=True)
""" + LOOP


def write_rows(folder: Path) -> Path:
    """``folder``/rows.h5: FILES rows of KIB KiB of random bytes in one contiguous HDF5
    array (a row read alone is one read of its size), written back to the disk."""
    import h5py  # type: ignore[import-untyped,unused-ignore]
    import numpy as np

    folder.mkdir()
    path = folder / "rows.h5"
    rng = np.random.default_rng(0)
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=rng.integers(0, 256, (FILES, KIB << 10), np.uint8))
    os.sync()
    return path


def test_a_large_file_read_a_sample_at_a_time_is_told_to_read_in_blocks_and_that_holds(
        tmp_path: Path) -> None:
    """One HDF5 file of 75 MiB, a row of 64 KiB per sample, read by the job's own dataset
    class in a shuffled order: a request per sample on a disk that limits requests (150/s).
    The probe finds the request limit; the data is packed already, so the advice is to read
    it in blocks (BlockShuffleSampler, with a __getitems__ reading a block in one slice,
    written here as a user would); followed, the run is held against the prediction."""
    from iolens.demo.slowdisk import SlowDisk

    pytest.importorskip("h5py")
    need_slow_disk()
    with SlowDisk(128 << 20, read_iops=150) as disk:
        data = Path(disk.mount_point) / "data"
        path = write_rows(data)
        first, err = run_case(tmp_path, H5_TRAIN, str(path), "6", disk.cgroup, "rows", STEP_S)
        assert first["verdict"]["class"] == "storage-bound", (first["verdict"], err)
        probe = iolens("probe", "--storage", str(data), "--run", str(tmp_path / "run"),
                       "--format", "json", cgroup=disk.cgroup)
        assert probe.returncode == 0, probe.stderr
        found = json.loads(probe.stdout)
        assert found["limit"] == "iops", probe.stdout
        v = report(tmp_path / "run")["verdict"]
        rec = next(r for r in v["recommendations"] if "pack" in (r.get("change") or {}))
        assert rec["action"].startswith("read the large files in larger requests"), rec
        assert "BlockShuffleSampler" in rec["action"], rec
        p = rec["prediction"]
        assert p is not None and p["steps_per_s"] > 1.5 * p["now_steps_per_s"], rec
        after = []
        for i in range(2):
            d = tmp_path / f"after{i}"
            d.mkdir()
            rep, err = run_case(d, H5_TRAIN, str(path), "6", disk.cgroup, "blocks", STEP_S)
            after.append(float(rep["verdict"]["figures"]["steps_per_s"]))
    mean = sum(after) / len(after)
    print(f"\nlab: one HDF5 file, IOPS cap, {p['now_steps_per_s']:.1f} steps/s; blocks "
          f"predicted {p['steps_per_s']:.1f} ({p['low']:.1f}-{p['high']:.1f}, {p['limit']}); "
          f"measured {after}")
    assert abs(mean / p["steps_per_s"] - 1) <= 0.25, (p, after, err)
    cmp = iolens("compare", str(tmp_path / "run"), str(tmp_path / "after0" / "run"),
                 "--format", "json")
    proof = json.loads(cmp.stdout)["prediction"]
    assert proof["change"].get("pack") is True, proof
    assert proof["held"] is (abs(proof["error"]) <= 0.25 and not proof["wrong_way"]), proof
