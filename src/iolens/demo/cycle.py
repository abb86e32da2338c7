"""The demo's whole cycle (``make demo``): a training on slow storage, the verdict with
its prediction, the fix made with iolens' own tools, the training again, and
``iolens compare`` setting the prediction beside what was measured.

    python -m iolens.demo.cycle [--out DIR] [--iops N] [--files N] [--epochs N]

1. A slow disk (iolens.demo.slowdisk: a loop device whose reads are limited to
   ``--iops`` requests per second, as a cloud volume's IOPS cap) holds the demo's
   dataset of small files; the training (``python -m iolens.demo``) runs under
   ``iolens run`` with nothing but the command, joins the disk's blkio group and
   drops its dataset from the page cache before every epoch (a dataset larger
   than memory).
2. The storage probe the verdict offers (``iolens probe --storage DATA --run RUN``),
   run where the job runs, and the verdict it settles: pack, with its prediction.
3. The fix as the advice gives it: ``iolens pack DATA PACK --shuffle`` on the same
   disk, and the training again on the pack, read in shuffled blocks of a batch.
4. ``iolens compare`` of the two runs, and the HTML report of the second.

Everything goes under ``--out`` (default ``iolens-runs/demo-<time>``). The slow
disk is removed at the end, also after an error or Ctrl-C. Where it cannot be
made (not root, no loop devices, no cgroup v1 blkio), the plain demo runs under
``iolens run`` instead, and the cycle says what it skipped and why.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

IOPS = 150
"""The slow disk's reads per second: a small cloud volume's cap."""


def say(text: str) -> None:
    print(f"demo: {text}", flush=True)


def iolens(*args: str, cgroup: str | None = None, capture: bool = False,
           ) -> subprocess.CompletedProcess[str]:
    """``iolens ARGS``, in ``cgroup`` (the slow disk's readers) when given."""
    cmd = [sys.executable, "-m", "iolens", *args]
    join = None
    if cgroup is not None:
        procs = os.path.join(cgroup, "cgroup.procs")

        def join() -> None:
            with open(procs, "w") as fh:
                fh.write(str(os.getpid()))
    return subprocess.run(cmd, preexec_fn=join, capture_output=capture, text=True,
                          check=False)


def training(run: str, data_args: Sequence[str], args: argparse.Namespace,
             cgroup: str | None) -> int:
    """One training of the demo under ``iolens run`` (the command alone, as a user runs it)."""
    cmd = ["run", "--interval", "0.25", "--out", run, "--", sys.executable, "-m",
           "iolens.demo", *data_args, "--epochs", str(args.epochs), "--workers",
           str(args.workers)]
    if cgroup is not None:
        cmd += ["--throttle", cgroup]
    return iolens(*cmd).returncode


def verdict(run: str) -> dict[str, Any]:
    out = iolens("report", run, "--format", "json", capture=True)
    if out.returncode != 0:
        raise RuntimeError(f"iolens report {run} failed: {out.stderr.strip()}")
    v: dict[str, Any] = json.loads(out.stdout)["verdict"]
    return v


def advice(v: dict[str, Any]) -> list[str]:
    """The verdict's class and each recommendation with its prediction, a line each."""
    from iolens.analysis.verdict import verdict_lines  # noqa: PLC0415

    lines = verdict_lines(v)[:2]
    for r in v.get("recommendations") or []:
        sep = ": " if r.get("prediction") else "; "
        lines.append(f"try: {r.get('action')}{sep}{r.get('expected_gain')}")
    return lines


def _first_pack(v: dict[str, Any]) -> dict[str, Any] | None:
    return next((r for r in v.get("recommendations") or []
                 if (r.get("change") or {}).get("pack")), None)


def plain(out: str, why: str) -> int:
    """The plain demo under ``iolens run``, where the slow disk cannot be made."""
    say(f"the slow-disk cycle is skipped, it needs: {why}; running the plain demo instead "
        "(its dataset on this machine's own disk, mostly in the page cache)")
    if os.geteuid() == 0 and os.access("/proc/sys/vm/drop_caches", os.W_OK):
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as fh:
            fh.write("3")
    run = os.path.join(out, "run")
    code = iolens("run", "--interval", "0.25", "--out", run, "--", sys.executable, "-m",
                  "iolens.demo").returncode
    if code == 0:
        html = os.path.join(out, "report.html")
        if iolens("report", run, "--format", "html", "-o", html).returncode == 0:
            say(f"HTML report: {html}")
        say(f"skipped: the slow disk, the storage probe, the pack and the run after it "
            f"(they need: {why})")
    return code


def cycle(out: str, args: argparse.Namespace) -> int:
    from iolens.demo.__main__ import make_dataset, slow_disk_size  # noqa: PLC0415
    from iolens.demo.slowdisk import SlowDisk  # noqa: PLC0415

    size = args.file_kib << 10
    # the files and a pack of them
    with SlowDisk(2 * slow_disk_size(args.files, size), read_iops=args.iops) as disk:
        say(f"1/5 slow disk: {disk.describe()}")
        data = os.path.join(disk.mount_point, "data")
        make_dataset(data, args.files, size)
        disk.evict()
        say(f"1/5 training on {args.files} files of {args.file_kib} KiB there, under "
            "`iolens run` with nothing but the command")
        before = os.path.join(out, "1-files")
        if training(before, ["--data", data], args, disk.cgroup) != 0:
            say(f"the first training failed; its run directory is {before}")
            return 1
        v = verdict(before)
        say(f"2/5 verdict: {v['class']} ({v['severity']}); the storage probe it offers, "
            "run where the job runs:")
        probe = iolens("probe", "--storage", data, "--run", before, cgroup=disk.cgroup)
        if probe.returncode != 0:
            say("the storage probe failed; the rest of the cycle needs its answer")
            return 1
        v = verdict(before)
        rec = _first_pack(v)
        say(f"2/5 the verdict with the probe's answer (iolens report {before}):")
        for line in advice(v):
            print(f"  {line}", flush=True)
        if rec is None or not rec.get("prediction"):
            say("the verdict advises no pack with a prediction here, so the cycle stops: "
                f"see the report above ({before})")
            return 0
        p = rec["prediction"]
        say(f"3/5 following it: pack, predicted {p['steps_per_s']:.1f} steps/s "
            f"({p['low']:.1f}-{p['high']:.1f}), now {p['now_steps_per_s']:.1f}")
        packed = os.path.join(disk.mount_point, "data.pack")
        disk.evict()
        t = time.monotonic()
        if iolens("pack", data, packed, "--shuffle", cgroup=disk.cgroup).returncode != 0:
            say("the pack failed (see above)")
            return 1
        say(f"3/5 packed in {time.monotonic() - t:.1f} s, through the same limit")
        disk.evict()
        say("4/5 the same training on the pack, read in shuffled blocks of a batch "
            "(iolens.data.BlockShuffleSampler)")
        after = os.path.join(out, "2-packed")
        if training(after, ["--pack", packed], args, disk.cgroup) != 0:
            say(f"the training on the pack failed; its run directory is {after}")
            return 1
    say("5/5 did the prediction hold? iolens compare BEFORE AFTER:")
    iolens("compare", before, after)
    html = os.path.join(out, "report.html")
    if iolens("report", after, "--format", "html", "-o", html).returncode == 0:
        say(f"HTML report of the run after the fix: {html}")
    say(f"runs: {before} (files) and {after} (packed)")
    say("the slow disk is removed: a command in their reports that names it (its mount "
        "or its cgroup) needs a slow disk of its own to run again")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m iolens.demo.cycle", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="the folder of the runs and the report (default "
                                  "iolens-runs/demo-<time>)")
    ap.add_argument("--iops", type=int, default=IOPS,
                    help=f"the slow disk's reads per second (default {IOPS})")
    ap.add_argument("--files", type=int, default=2000, help="sample files (default 2000)")
    ap.add_argument("--file-kib", type=int, default=64, help="their size (default 64)")
    ap.add_argument("--epochs", type=int, default=2, help="epochs per training (default 2)")
    ap.add_argument("--workers", type=int, default=2, help="DataLoader workers (default 2)")
    args = ap.parse_args(argv)
    for name in ("iops", "files", "file_kib", "epochs", "workers"):
        if getattr(args, name) < (0 if name == "workers" else 1):
            ap.error(f"--{name.replace('_', '-')} is too small")
    out = args.out or os.path.join("iolens-runs", time.strftime("demo-%Y%m%d-%H%M%S"))
    os.makedirs(out, exist_ok=True)
    from iolens.demo.slowdisk import (  # noqa: PLC0415
        SlowDiskUnavailable,
        missing_requirements,
    )

    missing = missing_requirements()
    if missing:
        return plain(out, "; ".join(missing))
    try:
        return cycle(out, args)
    except SlowDiskUnavailable as exc:
        return plain(out, str(exc))
    except KeyboardInterrupt:
        say("interrupted; the slow disk is removed")
        return 130


if __name__ == "__main__":
    sys.exit(main())
