"""The prediction table: each lab case's advice followed, and the prediction held against
what the runs after it measured.

Each case runs once under `iolens run` with the command alone; its first recommendation
that changes the named setting gives the prediction (steps/s and its 90% interval); the
case then runs three times with that change made, and the table gives each run's
throughput, the error of their mean, and how many fell inside the interval. Goal (issue
"Predictions that hold"): every case within 25% and inside its interval in three of three
runs. The cases are the suite's lab cases (tests/test_lab_advice.py, test_lab_cores.py,
test_lab_gate.py, test_lab_storage_advice.py), so the table measures what CI asserts once
per case.

The storage cases need root (a loop device behind a blkio throttle); without it they are
left out and the table says so. The largest error of a single run after a fix, over the
cases, is what iolens.analysis.model.MODEL_ERROR should hold.

A case whose speed is its CPU (the CPU-heavy and JPEG cases) takes each of its runs as the
suite does (`tests.test_lab.quiet_case`): again, at most three times, until a run has
lost under 10% of the machine to the host's steal and to processes outside the job, the
least disturbed kept. The table gives the most any kept run of a case lost.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.test_lab import QUIET_MAX, disturbed, quiet_case, run_case
from tests.test_lab_advice import TRAIN as ADVICE
from tests.test_lab_cores import TRAIN as JPEG
from tests.test_lab_cores import build_images
from tests.test_lab_gate import SPAWN
from tests.test_lab_storage_advice import H5_TRAIN, STEP_S, write_rows
from tests.test_lab_storage_advice import TRAIN as STORAGE

from iolens.analysis.rules import MIN_GAIN
from iolens.demo.slowdisk import SlowDisk

RUNS_AFTER = 3


@dataclass
class Case:
    name: str
    built: str
    """How the case is made, in a few words."""
    code: str
    before: list[str]
    key: str
    """The setting the followed fix changes (a key of its ``change``)."""
    after: Callable[[dict[str, Any]], list[str]]
    """The arguments of a run with the fix made, from the recommendation."""
    root: bool = False
    remodel: bool = False
    """The fix is made other than the advice says (a cheaper transform by the factor it
    came to): the prediction is `iolens compare`'s, of the change measured, from the run
    before and the first run after."""
    probe: tuple[str, str] | None = None
    """(path, cgroup): `iolens probe --storage` of the path, run where the job's reads are
    throttled, after the run before, as the verdict offers; the advice is the report's
    after it."""
    quiet: bool = False
    """Its speed is its CPU: each run is a quiet one (see the module's docstring)."""


@dataclass
class Row:
    case: Case
    action: str = ""
    predicted: float | None = None
    low: float | None = None
    high: float | None = None
    measured: list[float] = field(default_factory=list)
    note: str = ""
    lost: list[float] = field(default_factory=list)
    """The share (%) of the machine each run kept lost to others."""

    @property
    def errors(self) -> list[float]:
        p = self.predicted
        return [m / p - 1 for m in self.measured] if p else []

    @property
    def inside(self) -> int:
        lo, hi = self.low, self.high
        return sum(1 for m in self.measured if lo is not None and hi is not None
                   and lo <= m <= hi)


def _advice_cases() -> list[Case]:
    s = "6"
    return [
        Case("remote wait, 1 worker", "5 ms off CPU a sample, batch 16, 20 ms step",
             ADVICE, ["remote", s, "1", "0.005"], "num_workers",
             lambda r: ["remote", s, str(r["change"]["num_workers"]), "0.005"]),
        Case("remote wait, no workers", "as above, num_workers=0",
             ADVICE, ["remote", s, "0", "0.005"], "num_workers",
             lambda r: ["remote", s, str(r["change"]["num_workers"]), "0.005"]),
        Case("CPU-heavy, a free core", "20 ms of CPU a sample, batch 8, 1 worker",
             ADVICE, ["cpu", s, "1", "0.02"], "num_workers",
             lambda r: ["cpu", s, str(r["change"]["num_workers"]), "0.02"], quiet=True),
        Case("CPU-heavy, cores busy", "as above, 2 workers; the fix halves the CPU",
             ADVICE, ["cpu", s, "2", "0.02"], "fetch_cpu", lambda r: ["cpu", s, "2", "0.01"],
             quiet=True),
        Case("CPU-heavy, 6 workers on 2 cores", "as above, 6 workers queueing for the 2 "
             "cores; the fix lowers num_workers", ADVICE, ["cpu", s, "6", "0.02"],
             "num_workers", lambda r: ["cpu", s, str(r["change"]["num_workers"]), "0.02"],
             quiet=True),
        Case("CPU-heavy, 12 workers on 2 cores", "as above, 12 workers: the first batch "
             "after a second; the fix lowers num_workers", ADVICE, ["cpu", s, "12", "0.02"],
             "num_workers", lambda r: ["cpu", s, str(r["change"]["num_workers"]), "0.02"],
             quiet=True),
        Case("many tensors a batch", "16 fields a sample, a tensor each, batch 8, 2 "
             "workers that keep up, 2 ms step; the fix stacks the fields into one tensor",
             ADVICE, ["fields", s, "2", "0"], "handover", lambda r: ["fields-one", s, "2", "0"]),
        Case("a pickled batch", "4 samples of 1 MiB of bytes a batch, pickled whole, 2 "
             "workers that keep up, 2 ms step; the fix returns the bytes as one uint8 tensor",
             ADVICE, ["handover", s, "2", "0"], "handover",
             lambda r: ["handover-tensor", s, "2", "0"]),
        Case("NumPy samples kept apart", "8 samples of 512 KiB a batch, a NumPy array each, "
             "kept in a list by the collate_fn, 2 workers that keep up, 2 ms step; the fix "
             "returns tensors the default collate stacks", ADVICE, ["arrays", s, "2", "0"],
             "handover", lambda r: ["arrays-tensor", s, "2", "0"]),
        Case("spawn workers each epoch", "spawn, 3 workers, 4 epochs of 100 batches",
             SPAWN, ["0"], "persistent_workers", lambda r: ["1"]),
    ]


@contextmanager
def _slow_disk(read_bps: int | None = None, read_iops: int | None = None, above: bool = False
               ) -> Iterator[tuple[Path, str, Path]]:
    """A throttled loop device holding 1200 files of 64 KiB, and their copy in /dev/shm."""
    with SlowDisk(224 << 20, read_bps=read_bps, read_iops=read_iops, above=above) as disk:
        data = Path(disk.mount_point) / "data"
        data.mkdir()
        for i in range(1200):
            (data / f"{i:05d}.bin").write_bytes(os.urandom(64 << 10))
        shm = Path(tempfile.mkdtemp(dir="/dev/shm", prefix="iolens-bench-"))
        try:
            shutil.copytree(data, shm / "data")
            disk.evict()
            yield data, disk.cgroup, shm / "data"
        finally:
            shutil.rmtree(shm, ignore_errors=True)


def _storage_rows(out: list[Row]) -> None:
    cases: tuple[tuple[str, dict[str, Any], str], ...] = (
        ("disk capped in bytes", {"read_bps": 8 << 20},
         "8 MiB/s loop device, 64 KiB files, 2 workers; the fix copies to /dev/shm"),
        ("disk capped in requests", {"read_iops": 120},
         "120 reads/s loop device, 64 KiB files, 2 workers; the fix copies to /dev/shm"),
        ("a limit above the device", {"read_bps": 8 << 20, "above": True},
         "8 MiB/s set on the loop device itself (its util stays low), 64 KiB files, 2 "
         "workers; the fix copies to /dev/shm"))
    for name, limits, built in cases:
        case = Case(name, built, STORAGE, [], "storage", lambda r: [], root=True)
        row = Row(case)
        out.append(row)
        try:
            with _slow_disk(**limits) as (data, cgroup, shm):
                case.before = [str(data), "6", cgroup]
                case.after = _copied(shm)
                _follow(row)
        except Exception as e:  # noqa: BLE001 - a case that cannot run says why in the table
            row.note = f"not run: {e}"


def _blocks_row(out: list[Row]) -> None:
    """One HDF5 file read a row at a time on a disk that limits requests; the fix reads it
    in blocks (BlockShuffleSampler and a __getitems__ of one slice)."""
    row = Row(Case("one large file, capped in requests",
                   "150 reads/s loop device, one HDF5 file of 64 KiB rows read in a shuffled "
                   "order, 2 workers; the fix reads a batch of consecutive rows at once",
                   H5_TRAIN, [], "pack", lambda r: [], root=True))
    out.append(row)
    try:
        with SlowDisk(128 << 20, read_iops=150) as disk:
            path = str(write_rows(Path(disk.mount_point) / "data"))
            row.case.before = [path, "6", disk.cgroup, "rows", STEP_S]
            row.case.after = lambda r: [path, "6", disk.cgroup, "blocks", STEP_S]
            row.case.probe = (os.path.dirname(path), disk.cgroup)
            _follow(row)
    except Exception as e:  # noqa: BLE001 - a case that cannot run says why in the table
        row.note = f"not run: {e}"


def _copied(shm: Path) -> Callable[[dict[str, Any]], list[str]]:
    """The arguments of a run that reads the copy in /dev/shm."""
    return lambda rec: [str(shm), "6", "-"]


def _run(row: Row, d: Path, args: list[str]) -> tuple[dict[str, Any], Path]:
    """One run of the case in ``d``: its report and run directory."""
    if row.case.quiet:
        report, run = quiet_case(d, row.case.code, *args)
    else:
        report, _ = run_case(d, row.case.code, *args)
        run = d / "run"
    row.lost.append(disturbed(report))
    return report, run


def _follow(row: Row) -> None:
    case = row.case
    with tempfile.TemporaryDirectory() as tmp:
        before, before_run = _run(row, Path(tmp), case.before)
        if case.probe is not None:
            _probe(before_run, *case.probe)
            before = json.loads(subprocess.run(
                [sys.executable, "-m", "iolens", "report", str(before_run), "--format",
                 "json"], capture_output=True, text=True, timeout=300, check=True).stdout)
        v = before["verdict"]
        rec = next((r for r in v["recommendations"] if case.key in (r.get("change") or {})),
                   None)
        if rec is None or not rec.get("prediction"):
            row.note = (f"no fix on {case.key} with a prediction (class {v['class']}: "
                        + "; ".join(r["action"][:60] for r in v["recommendations"][:2]) + ")")
            held = next((r for r in v.get("declined") or []
                         if case.key in (r.get("change") or {})), None)
            if held is not None:
                q = held.get("prediction") or {}
                row.note = (f"not advised, under the {MIN_GAIN - 1:.0%} gain advice needs: "
                            f"{held['action'].split(':')[0][:60]}, predicted "
                            f"{q.get('steps_per_s', 0):.1f} ({q.get('low', 0):.1f}-"
                            f"{q.get('high', 0):.1f})")
            return
        p = rec["prediction"]
        row.action, row.predicted, row.low, row.high = (rec["action"], p["steps_per_s"],
                                                        p["low"], p["high"])
        for i in range(RUNS_AFTER):
            d = Path(tmp) / f"after{i}"
            d.mkdir()
            after, after_run = _run(row, d, case.after(rec))
            row.measured.append(float(after["verdict"]["figures"]["steps_per_s"]))
            if case.remodel and i == 0:
                proof = json.loads(subprocess.run(
                    [sys.executable, "-m", "iolens", "compare", str(before_run),
                     str(after_run), "--format", "json"], capture_output=True, text=True,
                    timeout=300, check=True).stdout)["prediction"]
                q = proof["predicted"]
                row.action, row.predicted, row.low, row.high = (
                    proof["action"], q["steps_per_s"], q["low"], q["high"])


def _probe(run: Path, path: str, cgroup: str) -> None:
    """`iolens probe --storage PATH --run RUN`, in the throttled group, as the job read."""
    subprocess.run(["sh", "-c", f'echo $$ > {cgroup}/cgroup.procs && exec "$@"', "sh",
                    sys.executable, "-m", "iolens", "probe", "--storage", path, "--run",
                    str(run), "--format", "json"], capture_output=True, text=True,
                   timeout=300, check=True)


def _table(rows: list[Row], started: float) -> str:
    lines = [
        "# Benchmark: predictions followed",
        "",
        f"- when: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(started))}",
        f"- machine: {platform.machine()}, {os.cpu_count()} CPUs, Linux {platform.release()}",
        f"- each case once before the fix, {RUNS_AFTER} times after it; error = measured / "
        "predicted - 1",
        f"- quiet runs: a case marked * took each run again (at most 3 tries) until it lost "
        f"under {QUIET_MAX:.0f}% of the machine to others; lost: the most a run kept lost",
        "",
        "| case | how it is made | fix | predicted (90% interval) | measured after | "
        "error of the mean | runs inside | lost |",
        "|---|---|---|---|---|---:|---:|---:|",
    ]
    for r in rows:
        name = r.case.name + (" *" if r.case.quiet else "")
        lost = f"{max(r.lost):.0f}%" if r.lost else "-"
        if r.predicted is None:
            lines.append(f"| {name} | {r.case.built} | {r.note} | - | - | - | - | {lost} |")
            continue
        mean = statistics.fmean(r.measured)
        lines.append(
            f"| {name} | {r.case.built} | {r.action.split(':')[0][:60]} | "
            f"{r.predicted:.1f} ({r.low:.1f}-{r.high:.1f}) | "
            f"{', '.join(f'{m:.1f}' for m in r.measured)} | "
            f"{(mean / r.predicted - 1) * 100:+.1f}% | "
            f"{r.inside} of {len(r.measured)} | {lost} |")
    errs = [abs(e) for r in rows for e in r.errors]
    if errs:
        lines += ["", f"- largest error of a single run after a fix: {max(errs) * 100:.1f}%; "
                      f"median {statistics.median(errs) * 100:.1f}% "
                      f"({len(errs)} runs, {sum(1 for r in rows if r.measured)} cases)"]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="append the table to this Markdown file")
    ap.add_argument("--only", help="run only the cases whose name contains this")
    args = ap.parse_args()
    started = time.time()
    rows: list[Row] = []
    for case in _advice_cases():
        if args.only and args.only not in case.name:
            continue
        rows.append(Row(case))
        _follow(rows[-1])
        print(f"{case.name}: {rows[-1].predicted} -> {rows[-1].measured} {rows[-1].note}",
              flush=True)
    if not args.only or "JPEG" in args.only:
        with tempfile.TemporaryDirectory() as tmp:
            images = str(build_images(Path(tmp)))
            rows.append(Row(Case(
                "JPEG, no workers, 2 cores", "Pillow decode and augmentation, 3.5 ms of CPU "
                "a sample, batch 16, a CPU step of 15 ms; the workers take the step's cores",
                JPEG, [images, "8", "0", "full"], "num_workers",
                lambda r: [images, "8", str(r["change"]["num_workers"]), "full"],
                quiet=True)))
            _follow(rows[-1])
            rows.append(Row(Case(
                "JPEG, 2 workers, cheaper transform", "as above, 2 workers; the fix decodes "
                "at a quarter scale, no jitter or crop (about a third of the CPU, not the "
                "half advised)", JPEG, [images, "8", "2", "full"], "fetch_cpu",
                lambda r: [images, "8", "2", "light"], remodel=True, quiet=True)))
            _follow(rows[-1])
            rows.append(Row(Case(
                "JPEG, 6 workers, 2 cores", "as above, 6 workers queueing for the 2 cores; "
                "the fix lowers num_workers", JPEG, [images, "8", "6", "full"], "num_workers",
                lambda r: [images, "8", str(r["change"]["num_workers"]), "full"], quiet=True)))
            _follow(rows[-1])
    if not args.only or "disk" in args.only:
        if os.geteuid() == 0:
            _storage_rows(rows)
            _blocks_row(rows)
        else:
            rows.append(Row(Case("storage cases", "loop devices", "", [], "", lambda r: []),
                            note="not run: they need root"))
    text = _table(rows, started)
    print(text)
    if args.out:
        with open(args.out, "a") as fh:
            fh.write("\n" + text)


if __name__ == "__main__":
    main()
