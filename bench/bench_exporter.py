"""The Prometheus endpoint's cost: scrape latency at scale, and the exporter's own CPU.

1. Scrape latency: the collector serves a synthetic state the size of a big
   node (16 devices, a job with 16 DataLoader workers, 8 ranks each with
   its data-wait and step-time histograms, a minute of records for the live
   verdict) from a real HTTP server on loopback; `/metrics` is fetched with
   urllib, the wall time of each whole request measured. Two cases: each
   scrape after a new sample (the verdict is drawn again, as when the scrape
   interval is longer than the sampling interval), and scrapes of the same
   sample (the verdict cached). Goal: under 20 ms.
2. The exporter's own CPU: `iolens exporter` runs for --seconds (default 60)
   sampling every 1 s, scraped every 15 s (Prometheus' usual interval);
   its utime + stime over the steady part (after 3 s) as a share of one core,
   and its peak RSS. Once watching the machine only, once with --pid on a
   process tree of 17 (a parent and 16 sleeping children).
"""

from __future__ import annotations

import argparse
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from typing import Any

from iolens.recorder.totals import ExportState, Histogram, RankState, RoleState
from iolens.sinks.prometheus import Exporter, ExportLabels, IolensCollector
from iolens.sources.counters import DiskCounters
from iolens.sources.procfs import CpuTimes, ProcIO

DEVICES, WORKERS, RANKS, RECENT = 16, 16, 8, 60
GOAL_MS = 20.0


def synthetic_state(samples: int) -> ExportState:
    """A state as a node with DEVICES devices, WORKERS workers and RANKS ranks would publish."""
    devices = tuple(DiskCounters(259, i, f"nvme{i}n1", 10_000 + i, 10, 2_000_000, 50_000,
                                 5_000, 5, 400_000, 9_000, 1, 123_456, 654_321, 7, 1, 64, 3, 2,
                                 5) for i in range(DEVICES))
    roles = {"main": RoleState(RANKS, ProcIO(1 << 30, 1 << 20, 1 << 28, 1 << 20, 0), 3600.0),
             "worker": RoleState(WORKERS, ProcIO(1 << 34, 1 << 20, 1 << 33, 0, 0), 7200.0),
             "other": RoleState(0, ProcIO(), 0.0)}
    ranks = []
    for r in range(RANKS):
        wait, step = Histogram(), Histogram()
        wait.observe_ns([(i % 200 + 1) * 1_000_000 for i in range(5000)])
        step.observe_ns([(i % 300 + 20) * 1_000_000 for i in range(5000)])
        ranks.append(RankState(str(r), wait.state(), step.state(), 3))
    recent = tuple(_record(i) for i in range(RECENT))
    return ExportState(samples=samples, time=time.time(), devices=devices, roles=roles,
                       cpu=CpuTimes(10_000, 10, 3_000, 50_000, 2_000, 10, 20, 0),
                       mem={"cached_bytes": 1 << 34, "dirty_bytes": 1 << 20,
                            "writeback_bytes": 0, "available_bytes": 1 << 35},
                       gpus=tuple({"index": g, "util_pct": 55.0, "mem_util_pct": 20.0,
                                   "mem_used_bytes": 40 << 30, "mem_total_bytes": 80 << 30,
                                   "job_pids": [100 + g]} for g in range(RANKS)),
                       ranks=tuple(ranks), recent=recent, training=True)


def _record(seq: int) -> dict[str, Any]:
    dev = {"r_s": 900.0, "rkB_s": 57_600.0, "rrqm_s": 0.0, "r_await": 14.0, "rareq_sz": 64.0,
           "w_s": 1.0, "wkB_s": 4.0, "wrqm_s": 0.0, "w_await": 1.0, "wareq_sz": 4.0,
           "d_s": 0.0, "f_s": 0.0, "aqu_sz": 12.6, "util": 93.0}
    dist = {"count": 40, "sum_s": 0.9, "max_s": 0.05, "p50_s": 0.02, "p95_s": 0.045}
    role = {"pids": WORKERS, "cpu_pct": 30.0, "read_bytes_s": 6.0e7, "write_bytes_s": 0.0,
            "rchar_s": 6.1e7, "wchar_s": 0.0, "cache_hit": 0.02}
    return {
        "schema": 1, "seq": seq, "t": time.time() - RECENT + seq, "elapsed_s": float(seq + 1),
        "interval_s": 1.0, "devices": {f"nvme{i}n1": dict(dev) for i in range(DEVICES)},
        "job": {**role, "pids": WORKERS + RANKS, "states": {"S": WORKERS, "D": RANKS},
                "roles": {"worker": role, "main": {**role, "pids": RANKS, "cpu_pct": 50.0}}},
        "cpu": {"user": 40.0, "system": 10.0, "iowait": 30.0, "idle": 20.0, "steal": 0.0},
        "mem": {"cached_bytes": 1 << 34, "dirty_bytes": 1 << 20},
        "train": {"batches": 40 * RANKS, "epochs_started": 0, "data_wait": dist,
                  "step": {**dist, "sum_s": 1.0}, "data_wait_share": 0.9,
                  "step_source": "dataloader"},
    }


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def scrape_latency(rounds: int) -> dict[str, Any]:
    """Milliseconds per whole HTTP scrape, verdict drawn anew and cached."""
    current = {"state": synthetic_state(0)}
    collector = IolensCollector(lambda: current["state"], ExportLabels("node1", "bench", "0"),
                                {"cpus": 64})
    exporter = Exporter("127.0.0.1", 0, collector)
    exporter.start()
    fresh: list[float] = []
    cached: list[float] = []
    size = series = 0
    try:
        for i in range(rounds):
            current["state"] = synthetic_state(i + 1)  # a new sample: the verdict is redrawn
            for bucket in (fresh, cached):
                t0 = time.perf_counter()
                with urllib.request.urlopen(exporter.url, timeout=10) as resp:
                    body = resp.read()
                bucket.append((time.perf_counter() - t0) * 1000)
        size = len(body)
        series = sum(1 for line in body.decode().splitlines()
                     if line and not line.startswith("#"))
        t0 = time.perf_counter()
        for _ in range(rounds):
            list(collector.collect())
        collect_ms = (time.perf_counter() - t0) * 1000 / rounds
    finally:
        exporter.close()
    return {"fresh": fresh, "cached": cached, "bytes": size, "series": series,
            "collect_ms": collect_ms}


def _ticks_and_rss(pid: int) -> tuple[int, int] | None:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rpartition(")")[2].split()
        hwm = 0
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    hwm = int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return int(fields[11]) + int(fields[12]), hwm


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def exporter_cpu(seconds: float, scrape_every: float, pid: int | None) -> dict[str, float]:
    """CPU share of one core and peak RSS of `iolens exporter` over ``seconds``."""
    port = _free_port()
    cmd = [sys.executable, "-m", "iolens", "exporter", "--listen", f"127.0.0.1:{port}"]
    if pid is not None:
        cmd += ["--pid", str(pid)]
    proc = subprocess.Popen(cmd, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/metrics"
    start = time.monotonic()
    readings: list[tuple[float, int, int]] = []
    next_scrape = start + 2.0
    scrapes = 0
    try:
        while time.monotonic() - start < seconds:
            now = time.monotonic()
            if now >= next_scrape:
                try:
                    with urllib.request.urlopen(url, timeout=10) as resp:
                        resp.read()
                    scrapes += 1
                except OSError:
                    pass
                next_scrape += scrape_every
            st = _ticks_and_rss(proc.pid)
            if st is not None:
                readings.append((time.monotonic() - start, *st))
            time.sleep(0.5)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    steady = [r for r in readings if r[0] >= 3.0]
    tck = os.sysconf("SC_CLK_TCK")
    cpu = ((steady[-1][1] - steady[0][1]) / tck / (steady[-1][0] - steady[0][0]) * 100
           if len(steady) >= 2 else float("nan"))
    return {"cpu_pct": cpu, "rss_mb": max(r[2] for r in readings) / 1024, "scrapes": scrapes,
            "startup_cpu_s": steady[0][1] / tck if steady else float("nan")}


_TREE = """
import signal, subprocess, sys, time
ps = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
      for _ in range(int(sys.argv[1]))]
def end(signum, frame):
    for p in ps:
        p.kill()
        p.wait()
    sys.exit(0)
signal.signal(signal.SIGTERM, end)
time.sleep(3600)
"""


def _tree(children: int) -> subprocess.Popen[bytes]:
    """A parent with ``children`` sleeping children; SIGTERM ends them all."""
    return subprocess.Popen([sys.executable, "-c", _TREE, str(children)])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=200, help="scrapes per latency case")
    ap.add_argument("--seconds", type=float, default=60.0, help="exporter CPU run length")
    ap.add_argument("--scrape-every", type=float, default=15.0)
    ap.add_argument("--out", help="append a Markdown summary here")
    args = ap.parse_args()

    lat = scrape_latency(args.rounds)
    print(f"scrape latency: fresh median {statistics.median(lat['fresh']):.2f} ms, cached "
          f"median {statistics.median(lat['cached']):.2f} ms", file=sys.stderr, flush=True)
    machine = exporter_cpu(args.seconds, args.scrape_every, None)
    print(f"exporter, machine only: {machine['cpu_pct']:.2f}% of a core", file=sys.stderr,
          flush=True)
    tree = _tree(WORKERS)
    try:
        time.sleep(1.0)
        job = exporter_cpu(args.seconds, args.scrape_every, tree.pid)
    finally:
        tree.send_signal(signal.SIGTERM)
        tree.wait(timeout=30)
    print(f"exporter, --pid on 17 processes: {job['cpu_pct']:.2f}% of a core", file=sys.stderr,
          flush=True)

    def row(name: str, ms: list[float]) -> str:
        p95, worst = _percentile(ms, 0.95), max(ms)
        return (f"| {name} | {statistics.median(ms):.2f} | {p95:.2f} | {worst:.2f} | "
                f"< {GOAL_MS:g} | {'yes' if p95 < GOAL_MS else 'no'} |")

    u = os.uname()
    text = "\n".join([
        "",
        "# Benchmark: the Prometheus endpoint",
        "",
        f"- when: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        f"- machine: {platform.machine()}, {os.cpu_count()} CPUs, {u.sysname} {u.release}, "
        f"Python {platform.python_version()}",
        f"- scrape latency: a synthetic state of {DEVICES} devices, a job with {WORKERS} "
        f"DataLoader workers, {RANKS} ranks with both histograms, {RANKS} GPUs and "
        f"{RECENT} records for the verdict: {lat['series']} series, {lat['bytes']} bytes; "
        f"{args.rounds} scrapes per case over HTTP on loopback (urllib, a new connection "
        f"each); the collector alone takes {lat['collect_ms']:.2f} ms with the verdict cached",
        "",
        "| scrape | median ms | p95 ms | max ms | goal | met (p95) |",
        "|---|---:|---:|---:|---|---|",
        row("after a new sample (verdict drawn again)", lat["fresh"]),
        row("same sample (verdict cached)", lat["cached"]),
        "",
        f"- exporter CPU: `iolens exporter` sampling every 1 s for {args.seconds:g} s, "
        f"scraped every {args.scrape_every:g} s; utime + stime after the first 3 s",
        "",
        "| exporter | CPU, one core | peak RSS MB | scrapes | start-up CPU s |",
        "|---|---:|---:|---:|---:|",
        f"| the machine only | {machine['cpu_pct']:.2f}% | {machine['rss_mb']:.1f} | "
        f"{machine['scrapes']:.0f} | {machine['startup_cpu_s']:.2f} |",
        f"| --pid on a tree of {WORKERS + 1} processes | {job['cpu_pct']:.2f}% | "
        f"{job['rss_mb']:.1f} | {job['scrapes']:.0f} | {job['startup_cpu_s']:.2f} |",
        "",
    ])
    print(text)
    if args.out:
        with open(args.out, "a") as fh:
            fh.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
