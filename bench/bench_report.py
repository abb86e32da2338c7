"""Time and memory of `iolens report` on a long synthetic run, beside the parse floor.

Writes a run directory as `iolens run` would after a week of training at a
1-second interval (by default 604,800 intervals, 4 devices, 8 DataLoader
workers, one GPU), through the recorder's own writer (records.jsonl and the
rollups beside it, NOTE [rollups] in iolens/rundir/rollup.py), then runs
`iolens report --format json`, `--format text` and `--format html` on it,
each as its own subprocess, and measures its wall time and peak RSS (from
wait4(2), so each figure is that command's alone). Beside them, in the same
rounds: the parse floor (a process per core parsing every line of
records.jsonl with orjson, and nothing else); with the rollups moved aside,
the json report of the finished run (which folds the records into rollups,
writes them and reads them: NOTE [rollups rebuilt] in
iolens/analysis/rebuild.py; the files it writes are compared with the
recorder's), and the json and text reports of the run marked not finished
(no ``end`` in its meta.json: read from the records alone).

The run: a steady job reading its dataset from nvme0n1, a one-hour
checkpoint rhythm writing to sdb, a 20-minute storage stall every six hours
(nvme0n1 saturated, the loop waiting for data), and single-interval spikes
scattered through it, which the HTML charts must keep however far they
downsample. Goals: json and text at most 1.5x the parse floor and under
1 GB each (from the rollups: the week in 1 s); the HTML file under 20 MB.

    python bench/bench_report.py --days 1 --out bench/RESULTS.md
"""

from __future__ import annotations

import argparse
import contextlib
import filecmp
import json
import os
import platform
import random
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson

from iolens.rundir import RunDir  # the recorder's writer: records and rollups
from iolens.rundir.rollup import ROLLUP_LEVELS, rollups_file

START = datetime(2026, 11, 1, 8, 0, 0, tzinfo=UTC)
DEVICES = ("nvme0n1", "sdb", "sda", "loop0", "vdc", "vdd", "vde", "vdf")


def _dev(*, util: float, r_s: float, rkb: float, r_await: float, w_s: float, wkb: float,
         w_await: float, aqu: float) -> dict[str, float]:
    return {"r_s": round(r_s, 2), "rkB_s": round(rkb, 2), "rrqm_s": 0.0,
            "r_await": round(r_await, 4), "rareq_sz": round(rkb / r_s, 4) if r_s else 0.0,
            "w_s": round(w_s, 2), "wkB_s": round(wkb, 2), "wrqm_s": 0.0,
            "w_await": round(w_await, 4), "wareq_sz": round(wkb / w_s, 4) if w_s else 0.0,
            "d_s": 0.0, "f_s": 0.0, "aqu_sz": round(aqu, 4), "util": round(min(util, 100.0), 2)}


def _dist(mean: float, rng: random.Random) -> dict[str, float]:
    p50 = mean * rng.uniform(0.9, 1.0)
    return {"count": 0, "sum_s": 0.0, "max_s": round(mean * rng.uniform(1.5, 3.0), 6),
            "p50_s": round(p50, 6), "p95_s": round(mean * rng.uniform(1.2, 1.5), 6)}


def make_record(i: int, interval: float, devices: int, workers: int,
                rng: random.Random) -> dict[str, Any]:
    """Interval ``i`` of the synthetic run, shaped as the recorder writes it."""
    elapsed = (i + 1) * interval
    in_stall = (elapsed % 21600) < 1200  # 20 minutes every 6 hours
    in_ckpt = (elapsed % 3600) < 30  # 30 s of checkpoint writes every hour
    spike = rng.random() < 0.0005
    batches = 10
    step = 0.1 * rng.uniform(0.95, 1.05)
    wait = 0.09 * rng.uniform(0.9, 1.0) if in_stall else 0.004 * rng.uniform(0.5, 1.5)
    if in_ckpt:
        step *= 2.5
    if spike:
        wait *= 20
        step += wait
    batches = max(1, round(interval / step))
    read_kb = 40 * 64 if in_stall else 160 * 64 * rng.uniform(0.8, 1.2)
    devs: dict[str, Any] = {}
    names = DEVICES[:devices]
    for n, name in enumerate(names):
        if n == 0:
            util = 98.0 if in_stall else 35 * rng.uniform(0.8, 1.2)
            if spike:
                util = 100.0
            devs[name] = _dev(util=util, r_s=read_kb / 64, rkb=read_kb,
                              r_await=31.0 if in_stall else 0.4, w_s=2, wkb=8, w_await=1.0,
                              aqu=3.4 if in_stall else 0.2)
        elif n == 1:
            wkb = 400_000.0 if in_ckpt else 20.0
            devs[name] = _dev(util=100.0 if in_ckpt else 0.5, r_s=0.0, rkb=0.0, r_await=0.0,
                              w_s=wkb / 512, wkb=wkb, w_await=45.0 if in_ckpt else 1.0,
                              aqu=8.0 if in_ckpt else 0.01)
        else:
            devs[name] = _dev(util=rng.uniform(0, 3), r_s=rng.uniform(0, 5),
                              rkb=rng.uniform(0, 100), r_await=0.5, w_s=rng.uniform(0, 5),
                              wkb=rng.uniform(0, 100), w_await=1.0, aqu=0.01)
    job_read = read_kb * 1024 * 0.97
    rchar = job_read / (0.2 if not in_stall else 0.95)
    main_write = 400_000.0 * 1024 if in_ckpt else 2000.0
    worker_cpu = (8.0 if in_stall else 45.0) * workers * rng.uniform(0.9, 1.1)
    roles = {
        "main": {"pids": 1, "cpu_pct": round(95 * rng.uniform(0.9, 1.05), 2),
                 "read_bytes_s": 0.0, "write_bytes_s": round(main_write, 1),
                 "rchar_s": round(rng.uniform(1e6, 2e6), 1), "wchar_s": round(main_write, 1),
                 "cache_hit": 1.0},
        "worker": {"pids": workers, "cpu_pct": round(worker_cpu, 2),
                   "read_bytes_s": round(job_read, 1), "write_bytes_s": 0.0,
                   "rchar_s": round(rchar, 1), "wchar_s": 0.0,
                   "cache_hit": round(max(0.0, 1 - job_read / rchar), 4)},
    }
    data_wait, step_d = _dist(wait, rng), _dist(step, rng)
    for d, per in ((data_wait, wait), (step_d, step)):
        d["count"] = batches
        d["sum_s"] = round(per * batches, 6)
    idle = 20.0 if in_stall else 45.0
    t = START + timedelta(seconds=elapsed)
    return {
        "schema": 2, "seq": i, "t": round(t.timestamp(), 3),
        "time": t.isoformat(timespec="milliseconds"),
        "elapsed_s": round(elapsed, 3), "interval_s": interval,
        "devices": devs,
        "job": {"pids": 1 + workers, "cpu_pct": round(roles["main"]["cpu_pct"] + worker_cpu, 2),
                "read_bytes_s": round(job_read, 1), "write_bytes_s": round(main_write, 1),
                "rchar_s": round(rchar + 1.5e6, 1), "wchar_s": round(main_write, 1),
                "cache_hit": round(max(0.0, 1 - job_read / (rchar + 1.5e6)), 4),
                "states": {"D": workers // 2, "S": workers - workers // 2, "R": 1}
                if in_stall else {"S": workers, "R": 1},
                "roles": roles},
        "cpu": {"user": round(100 - idle - 5, 2), "system": 5.0,
                "iowait": 25.0 if in_stall else 1.0, "idle": idle - 1, "steal": 0.0},
        "mem": {"cached_bytes": 40 << 30, "dirty_bytes": (6 << 30) if in_ckpt else 1 << 20,
                "writeback_bytes": 0, "available_bytes": 80 << 30},
        "gpu": [{"index": 0, "util_pct": 15.0 if in_stall else 92.0 * rng.uniform(0.95, 1.0),
                 "mem_util_pct": 40.0, "mem_used_bytes": 30 << 30, "mem_total_bytes": 80 << 30}],
        "train": {"batches": batches, "epochs_started": 1 if i % 3600 == 0 else 0,
                  "data_wait": data_wait, "step": step_d, "step_source": "dataloader",
                  "data_wait_share": round(wait / step, 4),
                  # schema 2: the workers' stage figures of the interval's batches
                  "pipeline": {
                      "batches": batches, "samples": batches * 32, "processes": workers,
                      "in_process": False, "fetch_s": round(batches * wait * 0.9, 6),
                      "fetch_cpu_s": round(batches * wait * (0.1 if in_stall else 0.6), 6),
                      "fetch_max_s": round(wait * 1.5, 6),
                      "collate_s": round(batches * 0.0004, 6),
                      "idle_s": round(batches * (0.0 if in_stall else step * 0.3), 6),
                      "files": batches * 32, "handover": _dist(0.0008, rng) | {
                          "count": batches, "sum_s": round(batches * 0.0008, 6)}}},
        "storage": {"/data": {"waiting": 3 if in_stall else 0}},
    }


def write_run(folder: str, n: int, interval: float, devices: int, workers: int) -> float:
    """Write the run directory; returns the seconds it took."""
    start = time.perf_counter()
    os.makedirs(folder, exist_ok=True)
    rng = random.Random(1)
    meta = {
        "schema": 2, "iolens_version": "bench", "host": "bench", "cpus": 32,
        "command": ["python", "train.py", "--epochs", "168"], "cwd": "/data/job",
        "interval_s": interval, "start": START.isoformat(timespec="milliseconds"),
        "start_t": START.timestamp(), "duration_s": n * interval, "exit_code": 0,
        "end": (START + timedelta(seconds=n * interval)).isoformat(timespec="milliseconds"),
        "devices": {name: "the job reads its dataset there" if k == 0 else "watched"
                    for k, name in enumerate(DEVICES[:devices])},
        "disk_source": "/proc/diskstats", "instrumented": True, "records": n,
        "gpu": {"available": True, "reason": None, "names": ["H100"]}, "notes": [],
    }
    with open(os.path.join(folder, "meta.json"), "w") as fh:
        json.dump(meta, fh)
    run = RunDir(folder)
    for i in range(n):
        if not run.append(make_record(i, interval, devices, workers, rng)):
            raise SystemExit(f"bench: cannot write the run: {run.write_error}")
    run.close()
    return time.perf_counter() - start


def parse_floor(path: str) -> int:
    """Parse every line of ``path`` with orjson, a process per core over byte ranges (as
    the report reads a long run), and nothing else; the lines parsed."""
    size = os.path.getsize(path)
    jobs = os.cpu_count() or 1
    bounds = [size * i // jobs for i in range(jobs + 1)]
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        return sum(pool.map(_parse_range, [path] * jobs, bounds[:-1], bounds[1:]))


def _parse_range(path: str, start: int, stop: int) -> int:
    n = 0
    with open(path, "rb") as fh:
        if start:
            fh.seek(start - 1)
            fh.readline()
        pos = fh.tell()
        while pos < stop:
            line = fh.readline()
            if not line:
                break
            pos += len(line)
            orjson.loads(line)
            n += 1
    return n


def measure(cmd: list[str], timeout: float, mem_limit: int) -> tuple[int, float, float]:
    """Run ``cmd``; its exit status, wall seconds and peak RSS in MiB (wait4's ru_maxrss).
    The wait blocks until the command ends (a timer kills it at ``timeout``), so the wall
    time is the command's to the scheduler's wake-up, not to a polling step."""
    with tempfile.TemporaryFile() as errf:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=errf)
        if mem_limit:  # set from outside: the child is still starting Python then
            resource.prlimit(proc.pid, resource.RLIMIT_AS, (mem_limit, mem_limit))
        killer = threading.Timer(timeout, proc.send_signal, (signal.SIGKILL,))
        killer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            killer.cancel()
        wall = time.perf_counter() - start
        proc.returncode = rc = os.waitstatus_to_exitcode(status)
        errf.seek(0)
        err = errf.read().decode(errors="replace")
    if rc != 0:
        print(f"bench: {' '.join(cmd[3:])} exited {rc}: {err[-600:]}", file=sys.stderr)
    return rc, wall, usage.ru_maxrss / 1024


def compiled() -> None:
    """The package's bytecode written, as an installed package has it: where the
    environment sets PYTHONDONTWRITEBYTECODE, each report would otherwise compile every
    module it imports (0.1 s of a week's report)."""
    import compileall  # noqa: PLC0415 - the bench's own step

    import iolens  # noqa: PLC0415

    compileall.compile_dir(os.path.dirname(iolens.__file__), quiet=1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--days", type=float, default=7.0)
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--devices", type=int, default=4, choices=range(1, len(DEVICES) + 1))
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--dir", help="write the run here and keep it (default: a temporary "
                                  "directory, removed afterwards)")
    ap.add_argument("--formats", default="json,text,html")
    ap.add_argument("--rounds", type=int, default=2,
                    help="rounds of every measurement, interleaved (default 2)")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per report")
    ap.add_argument("--mem-limit-gb", type=float, default=16.0,
                    help="address-space limit of each report process (0: none)")
    ap.add_argument("--out", help="append a Markdown summary here")
    ap.add_argument("--parse-floor", metavar="RECORDS", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.parse_floor:
        print(parse_floor(args.parse_floor))
        return 0
    n = round(args.days * 86400 / args.interval)
    tmp = None if args.dir else tempfile.mkdtemp(prefix="iolens-bench-report-")
    folder = args.dir or os.path.join(tmp or ".", "run")
    records = os.path.join(folder, "records.jsonl")
    rollups = [os.path.join(folder, rollups_file(slot_s)) for slot_s in ROLLUP_LEVELS]
    limit = int(args.mem_limit_gb * 2**30)
    runs: dict[tuple[str, str], list[tuple[int, float, float, int | None]]] = {}
    rebuilt_same: list[bool] = []

    def report(fmt: str, source: str) -> None:
        target = os.path.join(folder, f"report.{'txt' if fmt == 'text' else fmt}")
        cmd = [sys.executable, "-m", "iolens", "report", folder, "--format", fmt, "-o", target]
        print(f"bench: iolens report --format {fmt} ({source})", file=sys.stderr)
        rc, wall, rss = measure(cmd, args.timeout, limit)
        out_size = os.path.getsize(target) if rc == 0 and os.path.exists(target) else None
        runs.setdefault((fmt, source), []).append((rc, wall, rss, out_size))

    try:
        if not (args.dir and all(os.path.exists(p) for p in rollups)):
            print(f"bench: writing {n} intervals to {folder}", file=sys.stderr)
            gen_s = write_run(folder, n, args.interval, args.devices, args.workers)
        else:
            gen_s = 0.0
        size = os.path.getsize(records)
        rolled = sum(os.path.getsize(p) for p in rollups)
        compiled()
        for _ in range(args.rounds):
            print("bench: parse floor", file=sys.stderr)
            rc, wall, rss = measure([sys.executable, __file__, "--parse-floor", records],
                                    args.timeout, limit)
            runs.setdefault(("parse floor", "records"), []).append((rc, wall, rss, None))
            for fmt in args.formats.split(","):
                report(fmt, "rollups")
            for p in rollups:
                os.replace(p, p + ".aside")
            meta_path = os.path.join(folder, "meta.json")
            with open(meta_path, "rb") as mf:
                meta = mf.read()
            try:
                # a finished run without rollups: the report rebuilds and writes them
                report("json", "records, rollups rebuilt")
                same = all(os.path.exists(p) and filecmp.cmp(p, p + ".aside", shallow=False)
                           for p in rollups)
                rebuilt_same.append(same)
                for p in rollups:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(p)
                # a run not finished (no end in its meta): read from its records alone
                with open(meta_path, "w") as tf:
                    json.dump({k: v for k, v in json.loads(meta).items() if k != "end"}, tf)
                for fmt in [f for f in args.formats.split(",") if f != "html"]:
                    report(fmt, "records")
            finally:
                with open(meta_path, "wb") as bf:
                    bf.write(meta)
                for p in rollups:
                    os.replace(p + ".aside", p)
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    floor = runs[("parse floor", "records")]
    floor_s = sorted(w for _, w, _, _ in floor)[len(floor) // 2]
    lines = [
        "",
        f"# Benchmark: iolens report on a synthetic {args.days:g}-day run",
        "",
        f"- when: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
        f"- machine: {platform.machine()}, {os.cpu_count()} CPUs, "
        f"{platform.system()} {platform.release()}, Python {platform.python_version()}",
        f"- run: {n} intervals of {args.interval:g} s, {args.devices} devices, "
        f"{args.workers} workers, 1 GPU; records.jsonl {size / 2**20:.0f} MiB"
        + (f", written with its rollups ({rolled / 2**20:.0f} MiB) "
           f"through the recorder's writer in {gen_s:.0f} s" if gen_s else ""),
        f"- each command a separate process, limited to {args.mem_limit_gb:g} GiB of address "
        f"space and {args.timeout:g} s; peak RSS from wait4(2); {args.rounds} rounds, "
        "interleaved: the range of the wall times, and their median against the parse "
        "floor's",
        "",
        "| command | read from | exit | wall (s) | x parse floor | peak RSS (MiB) "
        "| output (MiB) | goal | met |",
        "|---|---|---:|---:|---:|---:|---:|---|---|",
    ]
    for (fmt, source), got in runs.items():
        rc = max(r[0] for r in got)
        walls = sorted(r[1] for r in got)
        wall = walls[len(walls) // 2]
        rss = max(r[2] for r in got)
        out_size = got[-1][3]
        span = _secs(walls[0]) + (f"-{_secs(walls[-1])}" if len(walls) > 1 else "")
        if fmt == "parse floor":
            goal, met = "-", ""
        elif fmt == "html":
            goal = "file < 20 MB"
            met = "yes" if rc == 0 and out_size is not None and out_size < 20e6 else "no"
        elif source == "rollups":
            goal = "< 1 s, < 1 GB"
            met = "yes" if rc == 0 and wall < 1 and rss * 2**20 < 1e9 else "no"
        elif source != "records":
            goal, met = "< 1 GB, the recorder's rollups", (
                "yes" if rc == 0 and rss * 2**20 < 1e9 and rebuilt_same
                and all(rebuilt_same) else "no")
        else:
            goal = "< 1.5x the floor, < 1 GB"
            met = "yes" if rc == 0 and wall <= 1.5 * floor_s and rss * 2**20 < 1e9 else "no"
        out_mib = f"{out_size / 2**20:.3f}" if out_size is not None else "-"
        name = fmt if fmt == "parse floor" else f"report --format {fmt}"
        lines.append(f"| {name} | {source} | {rc} | {span} | {wall / floor_s:.2f} | "
                     f"{rss:.0f} | {out_mib} | {goal} | {met} |")
    if rebuilt_same:
        lines += ["", f"- rollups rebuilt by the report: byte for byte the recorder's in "
                  f"{sum(rebuilt_same)} of {len(rebuilt_same)} rounds"]
    lines.append("")
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "a") as fh:
            fh.write(text)
    return 0 if all(r[0] == 0 for got in runs.values() for r in got) else 1


def _secs(x: float) -> str:
    """Seconds to a hundredth below 10 s (the week's report is read against 1 s), else to a
    tenth."""
    return f"{x:.2f}" if x < 10 else f"{x:.1f}"


if __name__ == "__main__":
    sys.exit(main())
