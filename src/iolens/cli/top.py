"""``iolens top``: the live view of a process tree, or of the whole machine."""

from __future__ import annotations

import argparse
import os

from iolens.cli._checks import INTERVAL_RANGE, check_interval, check_watch
from iolens.live.top import TopOptions, process_exists, top, top_watch

_EPILOG = """\
Shown every interval: the watched devices' MB/s, r/s, w/s, r_await, w_await,
aqu-sz and %util (iostat -x figures) with a %util history; with --pid the
process tree's disk and read() MB/s, page-cache hit, CPU by role (main,
DataLoader workers) and pids; system CPU with iowait, page cache and dirty
memory; and each GPU's utilization and memory (NVML).

Devices watched: with --pid, those serving the process's working directory
and any the process tree has files open on; without --pid, every whole disk
that did I/O since boot (iostat's default list); plus each --path and
--device (given any of these without --pid, only those).

On a terminal the view is full screen until Ctrl-C (exit 0). When stdout is
not a terminal, or with --once, each interval prints a plain-text snapshot.

examples:
  iolens top                          the machine's busy disks, CPU and GPUs
  iolens top --pid 4242               a training job started elsewhere
  iolens top --path /data --interval 0.5
  iolens top --count 3 --interval 2 > top.txt
  iolens top --once --pid 4242        one snapshot, even on a terminal

exit codes: 0 ok (Ctrl-C, --count reached, or the process ended), 1 the view
could not be drawn, 2 usage error (bad option, no such process, unknown device),
141 output closed early (piped into head).
"""


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``iolens top``."""
    p = argparse.ArgumentParser(
        prog="iolens top",
        usage="iolens top [--pid PID] [--interval S] [--path P ...] [--device D ...] "
              "[--count N] [--once] [--proc-root DIR] [--sys-root DIR]",
        description="Live view of the disks, a process tree (or the whole machine), CPU and "
                    "GPUs, refreshed every interval.",
        epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pid", type=int, metavar="PID",
                   help="watch this process and its descendants (default: the whole machine)")
    p.add_argument("--interval", type=float, default=1.0, metavar="S",
                   help="seconds between refreshes, "
                        f"{INTERVAL_RANGE} (default 1)")
    p.add_argument("--path", action="append", default=[], metavar="P",
                   help="also watch the devices serving P, e.g. the dataset (repeatable)")
    p.add_argument("--device", action="append", default=[], metavar="D",
                   help="also watch block device D, e.g. nvme0n1 (repeatable)")
    p.add_argument("--count", type=int, metavar="N",
                   help="stop after N refreshes (default: until Ctrl-C)")
    p.add_argument("--once", action="store_true",
                   help="print one plain snapshot after one interval and exit")
    p.add_argument("--proc-root", default="/proc", metavar="DIR",
                   help="read processes and diskstats here (default /proc)")
    p.add_argument("--sys-root", default="/sys", metavar="DIR",
                   help="read block device topology here (default /sys)")
    return p


def run(ns: argparse.Namespace) -> int:
    """Run ``iolens top`` with parsed arguments; returns the exit code."""
    p: argparse.ArgumentParser = ns.parser
    check_interval(p, ns.interval)
    if ns.count is not None and ns.count < 1:
        p.error(f"--count must be a positive whole number, not {ns.count}")
    for flag, root in (("--proc-root", ns.proc_root), ("--sys-root", ns.sys_root)):
        if not os.path.isdir(root):
            p.error(f"{flag} {root}: no such folder")
    if ns.pid is not None and (ns.pid <= 0 or not process_exists(ns.pid, ns.proc_root)):
        p.error(f"--pid {ns.pid}: no such process in {ns.proc_root}")
    check_watch(p, ns)
    opts = TopOptions(pid=ns.pid, interval=ns.interval, paths=ns.path, devices=ns.device,
                      proc_root=ns.proc_root, sys_root=ns.sys_root, count=ns.count,
                      once=ns.once)
    try:
        watch, notes = top_watch(opts)
    except ValueError as exc:
        p.error(str(exc))
    return top(opts, watch, notes)
