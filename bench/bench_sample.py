"""Cost of one sample of every block device, side by side in one run.

Compares, in interleaved rounds on the same machine and moment:
  bare      os.pread of /proc/diskstats on a descriptor kept open (the floor)
  iolens    DiskSampler.snapshot() + snapshot_rates(): read, parse and rates
  psutil    psutil.disk_io_counters(perdisk=True)
  iostat    one `iostat -x -d` subprocess (what scripts that shell out pay)

Reports the median cost per call of each and the ratios the foundation
issue sets as goals: iolens at least 5x cheaper than psutil, and within 3x
of the bare read. Run with `make bench`; results go to bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime

from iolens import DiskSampler, snapshot_rates


def per_call_us(fn: Callable[[], object], calls: int) -> float:
    start = time.perf_counter_ns()
    for _ in range(calls):
        fn()
    return (time.perf_counter_ns() - start) / calls / 1000


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--calls", type=int, default=2000, help="calls per round for in-process ones")
    ap.add_argument("--iostat-calls", type=int, default=5)
    ap.add_argument("--out", help="write a Markdown summary here")
    args = ap.parse_args()

    fd = os.open("/proc/diskstats", os.O_RDONLY)

    def bare() -> object:
        return os.pread(fd, 65536, 0)

    sampler = DiskSampler()
    state = {"prev": sampler.snapshot()}

    def iolens_sample() -> object:
        cur = sampler.snapshot()
        rates = snapshot_rates(state["prev"], cur)
        state["prev"] = cur
        return rates

    contenders: dict[str, Callable[[], object]] = {"bare": bare, "iolens": iolens_sample}
    try:
        import psutil  # noqa: PLC0415 - optional: the benchmark runs without it

        contenders["psutil"] = lambda: psutil.disk_io_counters(perdisk=True)
    except ImportError:
        print("psutil is not installed: skipping it", file=sys.stderr)
    iostat = shutil.which("iostat")

    def iostat_call() -> object:
        assert iostat is not None
        return subprocess.run([iostat, "-x", "-d"], capture_output=True, check=True)

    results: dict[str, list[float]] = {name: [] for name in contenders}
    if iostat:
        results["iostat"] = []
    for fn in contenders.values():  # warm up caches and imports
        per_call_us(fn, 200)
    for r in range(args.rounds):
        order = list(contenders.items())
        if r % 2:
            order.reverse()  # interleave so that drift hits every contender alike
        for name, fn in order:
            results[name].append(per_call_us(fn, args.calls))
        if iostat:
            results["iostat"].append(per_call_us(iostat_call, args.iostat_calls))

    med = {name: statistics.median(v) for name, v in results.items()}
    ndev = len(state["prev"].devices)
    lines = [
        "# Benchmark: one sample of every block device",
        "",
        f"- when: {datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')}",
        f"- machine: {platform.machine()}, {os.cpu_count()} CPUs, Linux {platform.release()}, "
        f"Python {platform.python_version()}",
        f"- devices in /proc/diskstats: {ndev}",
        f"- rounds: {args.rounds} interleaved; {args.calls} calls per round "
        f"({args.iostat_calls} for the iostat subprocess); median of the rounds",
        "",
        "| what | median per sample (us) | min round | max round |",
        "|---|---:|---:|---:|",
    ]
    for name, v in results.items():
        lines.append(f"| {name} | {med[name]:.2f} | {min(v):.2f} | {max(v):.2f} |")
    lines.append("")
    lines.append("| ratio | value | goal |")
    lines.append("|---|---:|---|")
    if "psutil" in med:
        lines.append(f"| psutil / iolens | {med['psutil'] / med['iolens']:.1f}x | >= 5x |")
    lines.append(f"| iolens / bare read | {med['iolens'] / med['bare']:.2f}x | <= 3x |")
    if "psutil" in med:
        # Every sampler pays the kernel's read; nothing can beat psutil by more than this.
        lines.append(f"| ceiling of psutil / iolens (psutil / bare read) | "
                     f"{med['psutil'] / med['bare']:.1f}x | - |")
    if "iostat" in med:
        lines.append(f"| iostat subprocess / iolens | {med['iostat'] / med['iolens']:.0f}x | - |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text)
    sampler.close()
    os.close(fd)
    return 0


if __name__ == "__main__":
    sys.exit(main())
