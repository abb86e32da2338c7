"""Stage timing inside the DataLoader workers (NOTE [stage timing] in iolens/training/_hooks.py).

Unit tests of the recorder's aggregation and join on constructed records, then
real trainings under `iolens run` (the command alone: no --path, no hint) with
fork, spawn and forkserver workers, map-style, ``__getitems__`` and iterable
datasets, persistent or not: the stage figures are there and add up, and
faults inside the workers leave the training's result unchanged.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from array import array
from pathlib import Path
from typing import Any

import pytest

from iolens.analysis.pipeline import pipeline
from iolens.rundir import records
from iolens.rundir.timing import TrainingAggregator

MS = 1_000_000


def recs(*triples: tuple[int, int, int]) -> array[int]:
    return array("q", [v for t in triples for v in t])


def worker_batch(idx: int, ready: int, fetch: int = 8 * MS, cpu: int = 2 * MS,
                 collate: int = MS, idle: int = 3 * MS, samples: int = 4,
                 files: int = 4) -> list[tuple[int, int, int]]:
    return [(records.FETCH, fetch, cpu), (records.STAGE, collate, idle),
            (records.COUNT, samples, files), (records.READY, idx, ready)]


def test_worker_stages_sum_per_interval_and_join_the_hand_over() -> None:
    agg = TrainingAggregator()
    tag = 1 << records.TAG_SHIFT
    agg.feed(10, recs((records.EPOCH | tag, 0, 2), (records.WORKER | tag, 11, 0)))
    # The worker made batch 0 ready at 20 ms, batch 1 at 30 ms.
    agg.feed(11, recs(*worker_batch(0, 20 * MS), *worker_batch(1, 30 * MS)))
    # The loop asked for batch 0 at 15 ms (before it was ready: hand-over from 20 ms),
    # and for batch 1 at 40 ms (after it was ready: hand-over from 40 ms).
    agg.feed(10, recs((records.BATCH | tag, 15 * MS, 22 * MS), (records.HANDOVER | tag, 0, 15 * MS),
                      (records.BATCH | tag, 40 * MS, 41 * MS),
                      (records.HANDOVER | tag, 1, 40 * MS)))
    out = agg.take()["pipeline"]
    assert out["batches"] == 2 and out["samples"] == 8 and out["files"] == 8
    assert out["fetch_s"] == pytest.approx(0.016) and out["fetch_cpu_s"] == pytest.approx(0.004)
    assert out["collate_s"] == pytest.approx(0.002) and out["idle_s"] == pytest.approx(0.006)
    assert out["handover"]["count"] == 2
    assert out["handover"]["sum_s"] == pytest.approx(0.002 + 0.001)
    assert out["in_process"] is False and out["processes"] == 1


def test_a_hand_over_waits_for_its_worker_record_and_skips_an_older_epoch() -> None:
    agg = TrainingAggregator()
    tag = 1 << records.TAG_SHIFT
    agg.feed(10, recs((records.EPOCH | tag, 0, 1), (records.WORKER | tag, 11, 0)))
    agg.feed(11, recs(*worker_batch(5, 10 * MS)))  # epoch 1's batch 5, never taken
    agg.feed(10, recs((records.EPOCH | tag, 100 * MS, 1),
                      (records.BATCH | tag, 150 * MS, 160 * MS),
                      (records.HANDOVER | tag, 5, 150 * MS)))
    assert agg.take()["pipeline"]["handover"]["count"] == 0  # epoch 2's batch 5: not yet
    agg.feed(11, recs(*worker_batch(5, 155 * MS)))
    assert agg.take()["pipeline"]["handover"]["sum_s"] == pytest.approx(0.005)


def test_a_hand_over_keeps_its_epoch_when_the_next_epoch_starts_before_the_join() -> None:
    """Short epochs: epoch 1's last hand-over and epoch 2's start reach the recorder in one
    poll, the worker's READY for that batch in a later one: it still joins."""
    agg = TrainingAggregator()
    tag = 1 << records.TAG_SHIFT
    agg.feed(10, recs((records.EPOCH | tag, 0, 1), (records.WORKER | tag, 11, 0),
                      (records.BATCH | tag, 30 * MS, 33 * MS),
                      (records.HANDOVER | tag, 0, 30 * MS),
                      (records.EPOCH | tag, 40 * MS, 1)))
    agg.feed(11, recs(*worker_batch(0, 31 * MS)))
    assert agg.take()["pipeline"]["handover"]["sum_s"] == pytest.approx(0.002)


def test_worker_records_before_the_loader_is_known_still_join() -> None:
    agg = TrainingAggregator()
    tag = 1 << records.TAG_SHIFT
    agg.feed(11, recs(*worker_batch(0, 20 * MS)))  # read before the main file
    agg.feed(10, recs((records.EPOCH | tag, 0, 1), (records.WORKER | tag, 11, 0),
                      (records.BATCH | tag, 25 * MS, 27 * MS),
                      (records.HANDOVER | tag, 0, 25 * MS)))
    assert agg.take()["pipeline"]["handover"]["sum_s"] == pytest.approx(0.002)


def test_in_process_fetch_is_marked_and_damaged_stage_records_are_skipped() -> None:
    agg = TrainingAggregator()
    agg.feed(10, recs((records.FETCH, 5 * MS, MS), (records.STAGE, MS, 0),
                      (records.COUNT, 2, 2), (records.FETCH, -1, 0),
                      (records.HANDOVER, 0, 5)))
    out = agg.take()["pipeline"]
    assert out["in_process"] is True and out["batches"] == 1
    assert agg.skipped == 2


def test_pipeline_figures_ignore_figures_that_cannot_be() -> None:
    bad = {"elapsed_s": 1.0, "interval_s": 1.0,
           "train": {"pipeline": {"batches": float("nan"), "samples": float("inf"),
                                  "fetch_s": -1.0, "handover": {"count": "x"}}}}
    good = {"elapsed_s": 2.0, "interval_s": 1.0,
            "train": {"pipeline": {"batches": 1, "samples": 2, "fetch_s": 0.01}}}
    p = pipeline([bad, good])
    assert p is not None and (p.batches, p.samples, p.fetch_s) == (1, 2, 0.01)


def test_pipeline_figures_over_records() -> None:
    def rec(i: int) -> dict[str, Any]:
        return {"elapsed_s": i + 1.0, "interval_s": 1.0,
                "job": {"roles": {"worker": {"rchar_s": 40960.0}}},
                "train": {"pipeline": {"batches": 2, "samples": 8, "fetch_s": 0.08,
                                       "fetch_cpu_s": 0.02, "collate_s": 0.004, "idle_s": 0.016,
                                       "files": 8, "processes": 2, "in_process": False,
                                       "handover": {"count": 2, "sum_s": 0.002}}}}

    p = pipeline([rec(0), rec(1)])
    assert p is not None
    d = p.to_dict()
    assert d["fetch_s_per_sample"] == pytest.approx(0.01)
    assert d["fetch_cpu_share"] == pytest.approx(0.25)
    assert d["fetch_blocked_share"] == pytest.approx(0.75)
    assert d["collate_s_per_batch"] == pytest.approx(0.002)
    assert d["handover_s_per_batch"] == pytest.approx(0.001)
    assert d["worker_idle_share"] == pytest.approx(0.016 / 0.1)
    assert d["bytes_per_sample"] == pytest.approx(40960 * 2 / 16)
    assert d["files_per_sample"] == pytest.approx(1.0)
    assert pipeline([{"elapsed_s": 1.0, "train": {}}]) is None


@pytest.mark.parametrize("intervals", [3, 4, 6])
def test_a_loop_without_workers_counts_its_bytes_after_its_first_batchs_interval(
        intervals: int) -> None:
    """NOTE [the loop's own reads]: the training process imports its code as its first
    epoch starts, 0.77 MB in a lab run that read no file, in the interval of its first
    batch; from 4 intervals with batches that one is left out of the bytes a sample."""
    def rec(i: int) -> dict[str, Any]:
        return {"elapsed_s": i + 1.0, "interval_s": 1.0,
                "job": {"roles": {"main": {"rchar_s": 800_000.0 if i == 0 else 4096.0 * 8}}},
                "train": {"pipeline": {"batches": 2, "samples": 8, "fetch_s": 0.08,
                                       "fetch_cpu_s": 0.002, "processes": 1,
                                       "in_process": True}}}

    p = pipeline([rec(i) for i in range(intervals)])
    assert p is not None and p.in_process and p.samples == 8 * intervals
    if intervals < 4:  # (too few to leave one out)
        assert p.bytes_per_sample == pytest.approx(
            (800_000 + 4096 * 8 * (intervals - 1)) / (8 * intervals))
    else:
        assert p.bytes_per_sample == pytest.approx(4096)


# -- real trainings ---------------------------------------------------------------------

pytest.importorskip("torch")

SCRIPT = """
import os, sys, time, torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info
torch.set_num_threads(1)
DATA = sys.argv[1]
MODE, KIND, PERSIST = sys.argv[2], sys.argv[3], sys.argv[4] == "1"
FAULT = sys.argv[5] if len(sys.argv) > 5 else ""
FILES = sorted(os.listdir(DATA))

def load(i):
    if FAULT == "raise" and i == 37:
        raise ValueError(f"bad sample {i}")
    if FAULT == "kill" and i == 37:
        os.kill(os.getpid(), 9)
    if FAULT == "fds" and i == 5:
        # replace and close the files the worker holds in the run's timing folder
        null = os.open(os.devnull, os.O_WRONLY)
        for fd in os.listdir("/proc/self/fd"):
            try:
                target = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                continue
            if "/timing/" in target:
                os.dup2(null, int(fd)) if int(fd) % 2 else os.close(int(fd))
    with open(os.path.join(DATA, FILES[i % len(FILES)]), "rb") as fh:
        raw = fh.read()
    end = time.thread_time() + 0.002
    while time.thread_time() < end:  # 2 ms of CPU per sample
        pass
    time.sleep(0.004)  # and 4 ms off it
    return torch.tensor(raw[0], dtype=torch.float32)

class Map(Dataset):
    def __len__(self):
        return 96
    def __getitem__(self, i):
        return load(i)

class Items(Map):
    def __getitems__(self, idxs):
        return [load(i) for i in idxs]

class Stream(IterableDataset):
    def __iter__(self):
        info = get_worker_info()
        n, k = (info.num_workers, info.id) if info else (1, 0)
        return (load(i) for i in range(k, 96, n))

def started(worker_id):
    with open(os.path.join(os.environ["STARTS"], f"{os.getpid()}"), "w") as fh:
        fh.write(str(time.monotonic_ns()))

if __name__ == "__main__":
    ds = {"map": Map(), "getitems": Items(), "iterable": Stream()}[KIND]
    loader = DataLoader(ds, batch_size=4, num_workers=2, multiprocessing_context=MODE,
                        persistent_workers=PERSIST, worker_init_fn=started)
    total = 0.0
    try:
        for epoch in range(2):
            for x in loader:
                total += float(x.sum())
                time.sleep(0.005)
    except Exception as exc:
        print("error", type(exc).__name__, str(exc).split("\\n")[0][:40])
    print("total", total)
"""


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("pipe-data")
    for i in range(48):
        (d / f"{i:03d}.bin").write_bytes(bytes([i]) * 4096)
    return d


def _train(tmp_path: Path, dataset: Path, *args: str,
           under: bool = True) -> tuple[subprocess.CompletedProcess[str], Path]:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT))
    starts = tmp_path / ("starts" if under else "starts-bare")
    starts.mkdir(exist_ok=True)
    run = tmp_path / "run"
    cmd = [sys.executable, str(script), str(dataset), *args]
    if under:
        cmd = [sys.executable, "-m", "iolens", "run", "--interval", "0.25", "--out", str(run),
               "--no-live", "--", *cmd]
    env = {**os.environ, "STARTS": str(starts)}
    out = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=240,
                         check=False, env=env)
    return out, run


def _worker_files(run: Path, starts: Path) -> dict[int, array[int]]:
    out = {}
    for name in os.listdir(starts):
        path = run / "timing" / f"{name}.bin"
        a: array[int] = array("q")
        if path.exists():
            a.frombytes(path.read_bytes())
        out[int(name)] = a
    return out


CASES = [("fork", "map", "0"), ("spawn", "getitems", "0"), ("forkserver", "iterable", "0"),
         ("fork", "iterable", "1"), ("spawn", "map", "1"), ("forkserver", "getitems", "1")]


@pytest.mark.parametrize(("mode", "kind", "persist"), CASES)
def test_stage_figures_of_every_worker_kind_add_up(tmp_path: Path, dataset: Path, mode: str,
                                                   kind: str, persist: str) -> None:
    """Every batch's fetch, collate and idle are timed in every worker, and they add up to
    the worker's wall time (within 10%)."""
    out, run = _train(tmp_path, dataset, mode, kind, persist)
    assert out.returncode == 0, out.stderr
    assert "total" in out.stdout and "error" not in out.stdout, out.stdout
    workers = _worker_files(run, tmp_path / "starts")
    assert len(workers) == (2 if persist == "1" else 4)  # two per epoch unless persistent
    batches = 0
    for pid, a in workers.items():
        triples = [(a[i] & records.TYPE_MASK, a[i + 1], a[i + 2]) for i in range(0, len(a), 3)]
        fetch = sum(x for t, x, _ in triples if t == records.FETCH)
        stage = [(x, y) for t, x, y in triples if t == records.STAGE]
        ready = [y for t, _, y in triples if t == records.READY]
        assert ready, (pid, triples[:8])
        batches += len(ready)
        timed = fetch + sum(c + i for c, i in stage)
        start = int((tmp_path / "starts" / str(pid)).read_text())
        wall = max(ready) - start
        assert abs(timed - wall) <= 0.10 * wall, (pid, timed, wall)
        samples = sum(x for t, x, _ in triples if t == records.COUNT)
        files = sum(y for t, _, y in triples if t == records.COUNT)
        assert files >= samples > 0
    assert batches == 48  # 96 samples in batches of 4, twice
    report = json.loads(subprocess.run(
        [sys.executable, "-m", "iolens", "report", str(run), "--format", "json"],
        capture_output=True, text=True, check=True, timeout=120).stdout)
    p = report["pipeline"]
    assert p["samples"] == 192 and p["batches"] == 48
    # 2 ms on CPU and 4 ms asleep per sample: about a third on CPU.
    assert 0.15 <= p["fetch_cpu_share"] <= 0.6, p
    assert p["fetch_s_per_sample"] >= 0.006
    assert p["files_per_sample"] >= 1.0
    assert p["handover_s_per_batch"] is not None and p["handover_s_per_batch"] >= 0
    assert [s["fstype"] for s in report["storage"]], report["storage"]
    assert any(str(dataset) in f for s in report["storage"] for f in s["folders"])
    # Workers are counted as workers from the start, spawned ones too.
    meta = json.loads((run / "meta.json").read_text())
    assert meta["storage"][0]["folders"] == [str(dataset)]
    # (Before that, two spawned workers importing torch showed as "other" for about
    # a second each, at a core each: half the workers' CPU time.)
    lines = [json.loads(x) for x in (run / "records.jsonl").read_text().splitlines()]

    def cpu_s(role: str) -> float:
        return float(sum(r["job"]["roles"].get(role, {}).get("cpu_pct", 0) / 100
                         * r["interval_s"] for r in lines))

    assert cpu_s("other") <= 0.2 * cpu_s("worker"), (cpu_s("other"), cpu_s("worker"))


@pytest.mark.parametrize("fault", ["raise", "kill", "fds"])
def test_faults_inside_a_worker_leave_the_training_unchanged(tmp_path: Path, dataset: Path,
                                                             fault: str) -> None:
    """An exception in __getitem__, a worker killed mid-epoch, a worker that replaces or
    closes the timing files: the training prints and exits as without iolens."""
    bare, _ = _train(tmp_path, dataset, "fork", "map", "0", fault, under=False)
    under, run = _train(tmp_path, dataset, "fork", "map", "0", fault)
    meta = json.loads((run / "meta.json").read_text())
    assert under.returncode == meta["exit_code"], (under.returncode, meta["exit_code"])
    if fault == "kill":
        # torch's SIGCHLD handler raises in the main thread wherever it is when the worker
        # dies: inside the loop's try (exit 0), or now and then after it (exit 1), with
        # iolens or without: rare (one run of CI exited 1 so), and the same job's chance.
        assert {under.returncode, bare.returncode} <= {0, 1}, (under.stderr, bare.stderr)
    else:
        assert under.returncode == bare.returncode, (under.stderr, bare.stderr)
    clean = [ln.split(" (pid")[0] for ln in under.stdout.splitlines()]
    expected = [ln.split(" (pid")[0] for ln in bare.stdout.splitlines()]
    if fault == "kill":
        # How and when the loop notices a dead worker depends on timing, with iolens or
        # without: torch raises its "worker is killed" RuntimeError, or the reset of the
        # dead worker's connection; the batches summed before it differ from run to run.
        died = ("error RuntimeError DataLoader worker", "error ConnectionResetError")
        assert clean[0].startswith(died) and expected[0].startswith(died), (
            under.stdout, bare.stdout)
    else:
        assert clean == expected, (under.stdout, bare.stdout)
    if fault == "fds":
        assert "error" not in under.stdout
    else:
        assert under.stdout.startswith("error"), under.stdout
    assert (run / "meta.json").exists()


STOPS = """
import sys, time, torch
from torch.utils.data import DataLoader, Dataset
torch.set_num_threads(1)

class Slow(Dataset):
    def __len__(self):
        return 400
    def __getitem__(self, i):
        time.sleep(float(sys.argv[2]))
        return torch.zeros(8)

loader = DataLoader(Slow(), batch_size=4, num_workers=1, persistent_workers=True,
                    prefetch_factor=4)
n = 0
for x in loader:
    n += len(x)
    if n >= 4 * int(sys.argv[1]):
        break
print("samples", n)
"""


@pytest.mark.parametrize("sample_s", ["0.006", "0.0003"])
def test_a_loop_that_stops_mid_epoch_keeps_the_records_of_every_batch_it_took(
        tmp_path: Path, sample_s: str) -> None:
    """The loop breaks and the job exits: multiprocessing ends the persistent worker
    with SIGTERM while it fetches batches nobody takes, and every batch the loop took
    is still in the worker's records. (Written only each flush period, 125 ms here, a
    batch of 24 ms could be lost: 164 samples recorded of the 168 the loop took.) A
    batch under 5 ms is written when the worker idles, its prefetch done, before the
    loop's exit ends it: 1.2 ms batches are all kept too."""
    script = tmp_path / "stops.py"
    script.write_text(STOPS)
    for k, stop in enumerate((41, 42, 43)):
        run = tmp_path / f"run{k}"
        out = subprocess.run(
            [sys.executable, "-m", "iolens", "run", "--interval", "0.5", "--out", str(run),
             "--no-live", "--", sys.executable, str(script), str(stop), sample_s],
            cwd=tmp_path, capture_output=True, text=True, timeout=120, check=True)
        assert f"samples {4 * stop}" in out.stdout, out.stdout
        report = json.loads(subprocess.run(
            [sys.executable, "-m", "iolens", "report", str(run), "--format", "json"],
            capture_output=True, text=True, check=True, timeout=120).stdout)
        # those the loop took, and at most the 4 prefetched and the one being fetched
        assert 4 * stop <= report["pipeline"]["samples"] <= 4 * (stop + 5), (
            stop, report["pipeline"])


MEMMAP = """
import os, sys, time
import numpy as np, torch
from torch.utils.data import DataLoader, Dataset
torch.set_num_threads(1)

class Rows(Dataset):
    def __init__(self, path):
        self.rows = np.memmap(path, dtype=np.float32, mode="r").reshape(-1, 1024)
    def __len__(self):
        return len(self.rows)
    def __getitem__(self, i):
        return torch.from_numpy(np.array(self.rows[i]))

end = time.monotonic() + 4
while time.monotonic() < end:
    for x in DataLoader(Rows(sys.argv[1]), batch_size=16, num_workers=2):
        time.sleep(0.01)
print("done")
"""


def test_a_memmapped_dataset_is_found_from_the_mapping(tmp_path: Path) -> None:
    """numpy.memmap opens its file once and closes it: no fd, no open in a worker. The
    recorder finds the file in the processes' memory maps, with no --path."""
    pytest.importorskip("numpy")
    data = tmp_path / "arrays"
    data.mkdir()
    (data / "rows.f32").write_bytes(bytes(4096 * 512))
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(MEMMAP))
    run = tmp_path / "run"
    out = subprocess.run([sys.executable, "-m", "iolens", "run", "--interval", "0.25", "--out",
                          str(run), "--no-live", "--", sys.executable, str(script),
                          str(data / "rows.f32")], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120, check=False)
    assert out.returncode == 0 and "done" in out.stdout, out.stderr
    meta = json.loads((run / "meta.json").read_text())
    assert any(str(data) in s["folders"] for s in meta["storage"]), meta["storage"]
    # opened in the dataset's __init__ and read through the map: mapped all the same
    # (NOTE [opened and mapped] in iolens/recorder/storage.py)
    entry = next(s for s in meta["storage"] if str(data) in s["folders"])
    assert entry["opens"] >= 1 and entry.get("mapped") is True, entry
