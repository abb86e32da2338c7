"""The recorder's CPU with the dataset discovery of every process (open files, memory maps,
TCP peers), against the recorder before it, side by side.

The same job (torch imported, a DataLoader with 8 workers reading a folder of small
files, a 20 ms step) runs under `iolens run --interval 1` of this tree and of an earlier
commit (``--before``, checked out into a temporary worktree), in interleaved rounds.
/proc/<iolens pid> is read every 0.25 s: the recorder's CPU as a share of one core over
the run's first 10 s (where discovery now runs at every sample, on every process, each
process's maps of a torch process's size) and over the rest (every 5 samples). Goal: the
recorder under 1% of a core in the steady part, as bench_run's goal at 1 s.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

JOB = textwrap.dedent("""
    import os, sys, time, torch
    from torch.utils.data import DataLoader, Dataset
    torch.set_num_threads(1)
    D, SECONDS = sys.argv[1], float(sys.argv[2])
    NAMES = sorted(os.listdir(D))

    class Files(Dataset):
        def __len__(self):
            return len(NAMES)
        def __getitem__(self, i):
            with open(os.path.join(D, NAMES[i]), "rb") as fh:
                return torch.frombuffer(bytearray(fh.read(256)), dtype=torch.uint8).float()

    loader = DataLoader(Files(), batch_size=16, num_workers=8, shuffle=True,
                        persistent_workers=True)
    end = time.monotonic() + SECONDS
    while time.monotonic() < end:
        for x in loader:
            time.sleep(0.02)
            if time.monotonic() > end:
                break
""")

EARLY_S = 10.0


def _ticks(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rpartition(")")[2].split()
        return int(fields[11]) + int(fields[12])
    except (OSError, ValueError, IndexError):
        return None


def _maps_lines(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/maps", "rb") as fh:
            return fh.read().count(b"\n")
    except OSError:
        return 0


def one_run(src: str, script: str, data: str, seconds: float, out: str) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": src}
    cmd = [sys.executable, "-m", "iolens", "run", "--quiet", "--no-live", "--interval", "1",
           "--out", out, "--", sys.executable, script, data, str(seconds)]
    start = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL)
    readings: list[tuple[float, int]] = []
    maps = 0
    while proc.poll() is None:
        t = _ticks(proc.pid)
        if t is not None:
            readings.append((time.monotonic() - start, t))
        if not maps and time.monotonic() - start > 5:
            kids = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True,
                                  text=True, check=False).stdout.split()
            maps = max((_maps_lines(int(k)) for k in kids), default=0)
        time.sleep(0.25)
    if proc.wait() != 0:
        raise SystemExit(f"bench_discovery: {cmd} exited {proc.returncode}")
    tck = os.sysconf("SC_CLK_TCK")

    def pct(lo: float, hi: float) -> float:
        part = [r for r in readings if lo <= r[0] <= hi]
        return (part[-1][1] - part[0][1]) / tck / (part[-1][0] - part[0][0]) * 100

    # (the first second is the recorder's own start-up: imports, the first snapshot)
    return {"early": pct(1.0, EARLY_S), "steady": pct(EARLY_S + 1, seconds),
            "maps_lines": float(maps)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--before", default="e18a7fe",
                    help="the commit to compare with (default: the last before the discovery "
                         "of every process)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=40.0)
    ap.add_argument("--out", help="append a Markdown summary here")
    args = ap.parse_args()
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    results: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory() as tmp:
        old = os.path.join(tmp, "before")
        subprocess.run(["git", "-C", here, "worktree", "add", "--detach", old, args.before],
                       check=True, capture_output=True)
        try:
            data = os.path.join(tmp, "data")
            os.mkdir(data)
            for i in range(2000):
                with open(os.path.join(data, f"{i:05d}.bin"), "wb") as fh:
                    fh.write(os.urandom(4096))
            script = os.path.join(tmp, "job.py")
            with open(script, "w") as fh:
                fh.write(JOB)
            srcs = {"before": os.path.join(old, "src"), "after": os.path.join(here, "src")}
            for r in range(args.rounds):
                order = ["before", "after"] if r % 2 == 0 else ["after", "before"]
                for mode in order:
                    res = one_run(srcs[mode], script, data, args.seconds,
                                  os.path.join(tmp, f"run-{mode}-{r}"))
                    results[mode].append(res)
                    print(f"round {r + 1}/{args.rounds} {mode}: {res['early']:.2f}% early, "
                          f"{res['steady']:.2f}% steady", file=sys.stderr, flush=True)
        finally:
            subprocess.run(["git", "-C", here, "worktree", "remove", "--force", old],
                           check=False, capture_output=True)
    rows = []
    for mode, runs in results.items():
        early = [x["early"] for x in runs]
        steady = [x["steady"] for x in runs]
        rows.append(f"| {mode} | {statistics.median(early):.2f} ({min(early):.2f} - "
                    f"{max(early):.2f}) | {statistics.median(steady):.2f} ({min(steady):.2f} - "
                    f"{max(steady):.2f}) |")
    maps = max(x["maps_lines"] for runs in results.values() for x in runs)
    med = {m: statistics.median(x["steady"] for x in runs) for m, runs in results.items()}
    early_med = {m: statistics.median(x["early"] for x in runs) for m, runs in results.items()}
    u = os.uname()
    text = "\n".join([
        "",
        "# Benchmark: the recorder's CPU with the discovery of every process",
        "",
        f"- when: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        f"- machine: {platform.machine()}, {os.cpu_count()} CPUs, {u.sysname} {u.release}, "
        f"Python {platform.python_version()}",
        f"- job: torch imported, 8 DataLoader workers (maps files of {maps:.0f} lines each) "
        f"reading 2000 files of 4 KiB, a 20 ms step; {args.seconds:.0f} s under `iolens run "
        f"--interval 1`, of commit {args.before} (before) and of this tree (after), "
        f"{args.rounds} rounds in alternating order; medians (range)",
        f"- the first {EARLY_S:.0f} s: discovery at every sample on every process (after); "
        "then every 5 samples",
        "",
        "| recorder | CPU, one core, s 1-10 | CPU, one core, steady (goal < 1%) |",
        "|---|---:|---:|",
        *rows,
        "",
        f"Steady: after / before = {med['after'] / med['before']:.2f}; the first "
        f"{EARLY_S:.0f} s: {early_med['after'] / early_med['before']:.2f}.",
        "",
    ])
    print(text)
    if args.out:
        with open(args.out, "a") as fh:
            fh.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
