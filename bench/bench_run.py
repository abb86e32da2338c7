"""Training throughput under `iolens run` against the bare script, and the recorder's own cost.

The same CPU training (a DataLoader with 2 workers decoding in-memory
samples, a small CNN, a fixed number of batches) runs bare, under
`iolens run --interval 1` and under `iolens run --interval 0.1`, in
interleaved rounds so that the machine's drift hits every mode alike. The
script reports its own loop throughput (samples/s from the first batch to
the last). Goals: ratio to bare >= 0.995 at 1 s and >= 0.99 at 0.1 s.

While each recorded run goes on, /proc/<iolens pid> is read every 0.25 s:
the recorder's CPU over the steady part of the run (after its first 2 s)
as a share of one core, and its peak resident memory (VmHWM). Goals: under
1% of a core at 1 s, under 100 MB.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

JOB = textwrap.dedent("""
    import json, sys, time, torch
    from torch.utils.data import DataLoader, Dataset

    class Decode(Dataset):
        def __len__(self):
            return 100_000
        def __getitem__(self, i):
            g = torch.Generator().manual_seed(i)
            raw = torch.randint(0, 256, (3, 64, 64), dtype=torch.uint8, generator=g)
            return raw.float().div_(255).sub_(0.5), i % 4

    torch.manual_seed(0)
    torch.set_num_threads(1)
    batches = int(sys.argv[1])
    loader = DataLoader(Decode(), batch_size=32, shuffle=True, num_workers=int(sys.argv[2]))
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, stride=2), torch.nn.ReLU(), torch.nn.Conv2d(16, 16, 3),
        torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(4), torch.nn.Flatten(),
        torch.nn.Linear(256, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    first = None
    n = 0
    for x, y in loader:
        if first is None:
            first = time.perf_counter()  # worker start-up is not the loop's throughput
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(); loss.backward(); opt.step()
        n += 1
        if n > batches:
            break
    dt = time.perf_counter() - first
    del x, y
    import gc, resource
    gc.collect()  # the loader's iterator ends its workers, whose CPU then counts as children's
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime
    print(json.dumps({"samples_per_s": batches * 32 / dt, "loop_s": dt, "job_cpu_s": cpu}))
""")

MODES = {"bare": None, "interval 1 s": 1.0, "interval 0.1 s": 0.1}


def _proc_stat(pid: int) -> tuple[int, int] | None:
    """(utime + stime ticks, VmHWM kB) of a live process, None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rpartition(")")[2].split()
        ticks = int(fields[11]) + int(fields[12])
        hwm = 0
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    hwm = int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return ticks, hwm


def one_run(script: str, batches: int, interval: float | None, out: str,
            workers: int = 2) -> dict[str, float]:
    job = [sys.executable, script, str(batches), str(workers)]
    cmd = job if interval is None else [
        sys.executable, "-m", "iolens", "run", "--quiet", "--no-live", "--interval",
        str(interval), "--out", out, "--", *job]
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    readings: list[tuple[float, int, int]] = []
    while proc.poll() is None:
        if interval is not None:
            st = _proc_stat(proc.pid)
            if st is not None:
                readings.append((time.monotonic() - start, *st))
        time.sleep(0.25)
    stdout, _ = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"bench_run: {cmd} exited {proc.returncode}")
    result: dict[str, float] = json.loads(stdout.strip().splitlines()[-1])
    result["wall_s"] = time.monotonic() - start
    if readings:
        result["recorder_cpu_s"] = readings[-1][1] / os.sysconf("SC_CLK_TCK")
    steady = [r for r in readings if r[0] >= 2.0]
    if len(steady) >= 2:
        tck = os.sysconf("SC_CLK_TCK")
        result["recorder_cpu_pct"] = ((steady[-1][1] - steady[0][1]) / tck
                                      / (steady[-1][0] - steady[0][0]) * 100)
        result["recorder_hwm_mb"] = max(r[2] for r in readings) / 1024
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batches", type=int, default=1200)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--cpu", type=int, default=None,
                    help="pin the job and the recorder to this one CPU (less scheduling noise; "
                         "the recorder then takes its CPU from the job's own core)")
    ap.add_argument("--out", help="append a Markdown summary here")
    args = ap.parse_args()
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})  # inherited by every run
    results: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "job.py")
        with open(script, "w") as fh:
            fh.write(JOB)
        order = list(MODES)
        for r in range(args.rounds):
            for i, mode in enumerate(order[r % 3:] + order[:r % 3]):  # rotate the order
                res = one_run(script, args.batches, MODES[mode], os.path.join(tmp, f"run{r}{i}"),
                              args.workers)
                results[mode].append(res)
                print(f"round {r + 1}/{args.rounds} {mode}: {res['samples_per_s']:.1f} "
                      f"samples/s", file=sys.stderr, flush=True)
    base = statistics.median(x["samples_per_s"] for x in results["bare"])
    goals = {"interval 1 s": (">= 0.995", "< 1% of a core"),
             "interval 0.1 s": (">= 0.99", "-")}
    rows = []
    for mode, runs in results.items():
        thr = [x["samples_per_s"] for x in runs]
        med = statistics.median(thr)
        cpu = [x["recorder_cpu_pct"] for x in runs if "recorder_cpu_pct" in x]
        hwm = [x["recorder_hwm_mb"] for x in runs if "recorder_hwm_mb" in x]
        goal = goals.get(mode, ("-", "-"))
        # The bound: a job that keeps every core busy loses at most the CPU the
        # recorder takes, r of one core: 1 - r when it all comes out of one core the job
        # needs, 1 - r / cores when it is spread over all of them.
        taken = statistics.median(cpu) / 100 if cpu else 0.0
        ncpu = os.cpu_count() or 1
        bound = f"{1 - taken:.4f} / {1 - taken / ncpu:.4f}" if cpu else "-"
        rows.append(
            f"| {mode} | {med:.1f} | {min(thr):.1f} - {max(thr):.1f} | {med / base:.4f} "
            f"({goal[0]}) | {bound} | "
            + (f"{statistics.median(cpu):.2f}% ({goal[1]}) | {max(hwm):.1f} (< 100) |"
               if cpu else "- | - |"))
    u = os.uname()
    text = "\n".join([
        "",
        "# Benchmark: training throughput under `iolens run`",
        "",
        f"- when: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        f"- machine: {platform.machine()}, {os.cpu_count()} CPUs, {u.sysname} {u.release}, "
        f"Python {platform.python_version()}",
        f"- job: {args.batches} batches of 32 decoded 3x64x64 samples, {args.workers} DataLoader "
        "workers, "
        "a small CNN, torch on 1 thread; the CPUs are fully busy, so the recorder's CPU "
        "competes with the job's",
        f"- {args.rounds} rounds, the three modes in rotated order each round; medians"
        + (f"; everything pinned to CPU {args.cpu}" if args.cpu is not None else ""),
        "- bound from recorder CPU: the throughput ratio a CPU-bound job keeps when the "
        "recorder's steady CPU r (a share of one core) comes out of one core it needs (1 - r) "
        f"or out of all {os.cpu_count()} (1 - r/{os.cpu_count()}). The wall-clock ratio is "
        "the measurement; its range shows how far this machine lets it be trusted",
        "",
        "| mode | samples/s (median) | range | ratio to bare (goal) | bound from recorder CPU "
        "| recorder CPU, one core (goal) | recorder peak RSS MB (goal) |",
        "|---|---:|---:|---:|---:|---:|---:|",
        *rows,
        "",
    ])
    print(text)
    if args.out:
        with open(args.out, "a") as fh:
            fh.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
