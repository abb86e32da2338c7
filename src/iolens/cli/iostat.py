"""``iolens iostat``: extended device statistics in iostat's ``-x -d`` layout."""

from __future__ import annotations

import argparse
import glob
import os
import re
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime

from iolens._errors import StatsUnavailableError, UnknownDeviceError
from iolens.core.devselect import select_devices
from iolens.core.rates import snapshot_rates
from iolens.sinks.iostat import json_report, text_report
from iolens.sources.counters import DiskSnapshot
from iolens.sources.devmap import device_for_path
from iolens.sources.disk import DiskSampler, read_snapshot_dir
from iolens.sources.sysblock import Topology, guess_topology, read_topology

_EPILOG = """\
Every column, its width and its two decimals match sysstat's `iostat -x -d`,
so the output can be diffed against `LC_ALL=C iostat -x -d` line for line.
The first report covers the time since boot, as iostat's does; -y skips it.

examples:
  iolens iostat                     one report: averages since boot
  iolens iostat -y 1 5              five 1-second reports
  iolens iostat -m -z 2             every 2 s, MB/s, idle devices hidden
  iolens iostat --path ./data 1     the disks that serve ./data, every second
  iolens iostat -p sda 1 3          sda and its partitions
  iolens iostat --json -y 1 3       one JSON object per report (iostat's key names)
  iolens iostat --proc-root /host/proc --sys-root /host/sys 5
                                    a host's disks, from inside a container
  iolens iostat --replay s1 s2 s3   reports between saved snapshots; each folder
                                    holds `diskstats` and `uptime`, e.g. made with
                                    mkdir s1 && cat /proc/diskstats > s1/diskstats
                                    && cat /proc/uptime > s1/uptime

exit codes: 0 ok, 1 statistics unavailable, 2 usage error or unknown device,
130 interrupted, 141 output closed early (e.g. piped into head).
"""

_NUMBER = re.compile(r"^\d+(\.\d+)?$")
_NUMBER_LIKE = re.compile(r"^[-+.\d]")  # what a user meant as a number, even if malformed
_MAX_INTERVAL = 86400.0

_UNAVAILABLE_HINT = (
    "This system does not expose disk statistics (common in gVisor, AWS Fargate and "
    "locked-down containers), so device reports are unavailable here; the job's own "
    "I/O from /proc/<pid>/io and training-side timing still work. Point --proc-root "
    "at a host's /proc if one is mounted."
)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``iolens iostat``."""
    p = argparse.ArgumentParser(
        prog="iolens iostat",
        usage="iolens iostat [-m] [-p] [-z] [-y] [-t] [--json] [--proc-root DIR] "
              "[--sys-root DIR] [--path P] [--replay SNAP...] [interval [count]] [DEVICE ...]",
        description="Extended statistics of block devices, column for column as iostat -x -d.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("-m", dest="megabytes", action="store_true",
                   help="throughput in MB/s instead of kB/s (request sizes stay in kB)")
    p.add_argument("-p", dest="partitions", action="store_true",
                   help="show partitions too: of the named disks, or of every disk")
    p.add_argument("-z", dest="omit_idle", action="store_true",
                   help="hide devices that completed no I/O during the interval")
    p.add_argument("-y", dest="skip_first", action="store_true",
                   help="skip the first report (the averages since boot) when an interval is given")
    p.add_argument("-t", dest="timestamp", action="store_true",
                   help="print the time of each report (S_TIME_FORMAT=ISO for ISO 8601)")
    p.add_argument("-x", "-d", dest="compat", action="store_true",
                   help="accepted for iostat habits; the report is always -x -d")
    p.add_argument("--json", action="store_true",
                   help="one JSON object per line and report, with iostat's JSON key names")
    p.add_argument("--proc-root", default="/proc", metavar="DIR",
                   help="read diskstats and uptime here (default /proc)")
    p.add_argument("--sys-root", default="/sys", metavar="DIR",
                   help="read block device topology here (default /sys)")
    p.add_argument("--path", action="append", default=[], metavar="P",
                   help="show the devices that serve path P (repeatable)")
    p.add_argument("--replay", nargs="+", metavar="SNAP",
                   help="print the reports between saved snapshot folders instead of sampling")
    p.add_argument("operands", nargs="*", metavar="interval [count] [DEVICE]",
                   help="seconds between reports, how many, and devices to show (ALL: "
                        "every device, unused ones too)")
    return p


@dataclass
class Options:
    """The parsed operands and flags."""

    interval: float | None = None
    count: int | None = None
    devices: list[str] = field(default_factory=list)


def _parse_operands(ns: argparse.Namespace) -> Options:
    opts = Options()
    numbers: list[str] = []
    for op in ns.operands:
        if _NUMBER.match(op):
            numbers.append(op)
        elif _NUMBER_LIKE.match(op):
            ns.parser.error(f"{op!r} is not a valid interval or count: use a positive number "
                            "of seconds (e.g. 1 or 0.5) and a whole count")
        else:
            # iostat also takes comma-separated lists (-p sda,sdb).
            opts.devices.extend(d for d in op.split(",") if d)
    if len(numbers) > 2:
        ns.parser.error(f"too many numbers: {' '.join(numbers)} (expected: interval [count])")
    if numbers:
        opts.interval = float(numbers[0])
        if opts.interval > _MAX_INTERVAL:
            ns.parser.error(f"interval {numbers[0]} s is longer than a day ({_MAX_INTERVAL:.0f} s)")
        if opts.interval == 0:
            if len(numbers) > 1:
                ns.parser.error("an interval of 0 takes no count (it means one report)")
            opts.interval = None
    if len(numbers) == 2:
        if "." in numbers[1] or int(numbers[1]) == 0:
            ns.parser.error(f"count must be a positive whole number, not {numbers[1]}")
        opts.count = int(numbers[1])
    return opts


def _cpu_count() -> int:
    n = len(glob.glob("/sys/devices/system/cpu/cpu[0-9]*"))
    return n or os.cpu_count() or 1


def _iso() -> bool:
    return os.environ.get("S_TIME_FORMAT") == "ISO"


def banner() -> str:
    """iostat's first line and the blank line after it."""
    u = os.uname()
    date = time.strftime("%Y-%m-%d" if _iso() else "%m/%d/%y")
    cpus = _cpu_count()
    return f"{u.sysname} {u.release} ({u.nodename}) \t{date} \t_{u.machine}_\t({cpus} CPU)\n\n"


def stamp(when: float) -> str:
    """A report's time line as iostat prints it under LC_ALL=C (or ISO 8601)."""
    dt = datetime.fromtimestamp(when).astimezone()
    return dt.strftime("%Y-%m-%dT%H:%M:%S%z" if _iso() else "%m/%d/%y %H:%M:%S")


class _Printer:
    def __init__(self, ns: argparse.Namespace, devices: list[str]) -> None:
        self.ns = ns
        self.devices = devices
        self.warned_skips = (0, 0)

    def check_devices(self, *snaps: DiskSnapshot) -> None:
        """Raise UnknownDeviceError for a named device that none of the snapshots holds.

        Checked once, up front: a device that vanishes later is skipped while
        absent, as docs/metrics.md says, rather than ending the run.
        """
        known: set[str] = set()
        for snap in snaps:
            known.update(snap.devices)
        for name in self.devices:
            if name != "ALL" and name not in known:
                raise UnknownDeviceError(name, known)

    def warn_skips(self, snap: DiskSnapshot) -> None:
        key = (snap.skipped_lines, snap.old_format_lines)
        if key != self.warned_skips and (snap.skipped_lines or snap.old_format_lines):
            parts = []
            if snap.skipped_lines:
                parts.append(f"{snap.skipped_lines} malformed line(s)")
            if snap.old_format_lines:
                parts.append(f"{snap.old_format_lines} old-format partition line(s) "
                             "without extended statistics")
            print(f"iolens: skipped {' and '.join(parts)} in {snap.source}", file=sys.stderr)
        self.warned_skips = key

    def report(self, prev: DiskSnapshot, cur: DiskSnapshot, topo: Topology,
               when: float | None) -> None:
        self.warn_skips(cur)
        ns = self.ns
        names = select_devices(cur, prev, topo, names=self.devices,
                               partitions=ns.partitions, omit_idle=ns.omit_idle)
        rates = snapshot_rates(prev, cur)
        chosen = [rates[n] for n in names]
        ts = stamp(when) if (ns.timestamp and when is not None) else None
        if ns.json:
            sys.stdout.write(json_report(chosen, ns.megabytes, ts) + "\n")
        else:
            sys.stdout.write(text_report(chosen, ns.megabytes, ts))
        sys.stdout.flush()


def _devices_for_paths(ns: argparse.Namespace) -> list[str]:
    found: list[str] = []
    for path in ns.path:
        try:
            mapping = device_for_path(path, ns.proc_root, ns.sys_root)
        except (OSError, ValueError) as exc:
            ns.parser.error(f"--path {path!r}: {getattr(exc, 'strerror', None) or exc}")
        if not mapping.disks:
            ns.parser.error(f"--path {path}: {mapping.reason}")
        where = mapping.device or "/".join(mapping.disks)
        fs = f" ({mapping.fstype} at {mapping.mount_point})" if mapping.fstype else ""
        print(f"iolens: {mapping.path} is on {where}{fs}; watching {', '.join(mapping.disks)}",
              file=sys.stderr)
        found.extend(d for d in mapping.disks if d not in found)
    return found


def _replay(ns: argparse.Namespace, opts: Options, printer: _Printer) -> int:
    if opts.interval is not None:
        ns.parser.error("--replay takes no interval or count: the snapshots set the intervals")
    snaps: list[tuple[DiskSnapshot, float]] = []
    for folder in ns.replay:
        try:
            snap = read_snapshot_dir(folder)
        except StatsUnavailableError as exc:
            ns.parser.error(f"--replay: {exc}; a snapshot folder holds `diskstats` and `uptime` "
                            "(--replay takes every word after it: put device names first)")
        except ValueError as exc:
            ns.parser.error(f"--replay: {exc}")
        snaps.append((snap, os.path.getmtime(os.path.join(folder, "uptime"))))
    printer.check_devices(*(s for s, _ in snaps))
    topo: Topology | None = None
    if ns.sys_root != "/sys":
        topo = read_topology(ns.sys_root)
    if not ns.json:
        sys.stdout.write(banner())
    prev = DiskSnapshot.zero()
    for i, (snap, when) in enumerate(snaps):
        t = topo or guess_topology(snap.devices)
        if i == 0 and ns.skip_first and len(snaps) > 1:
            if not ns.json:
                sys.stdout.write("\n")
        else:
            try:
                printer.report(prev, snap, t, when)
            except ValueError as exc:
                ns.parser.error(f"--replay {ns.replay[i - 1]} -> {ns.replay[i]}: {exc}")
        prev = snap
    return 0


def _live(ns: argparse.Namespace, opts: Options, printer: _Printer) -> int:
    sampler = DiskSampler(ns.proc_root, ns.sys_root)
    notes_shown = 0
    try:
        try:
            cur = sampler.snapshot()
        except StatsUnavailableError as exc:
            print(f"iolens iostat: {exc}. {_UNAVAILABLE_HINT}", file=sys.stderr)
            return 1
        printer.check_devices(cur)
        if not ns.json:
            sys.stdout.write(banner())
        prev = DiskSnapshot.zero()
        skip = ns.skip_first and opts.interval is not None
        printed = 0
        start = time.monotonic()
        tick = 0
        while True:
            for note in sampler.notes[notes_shown:]:
                print(f"iolens: {note}", file=sys.stderr)
            notes_shown = len(sampler.notes)
            if skip:
                skip = False
                if not ns.json:
                    sys.stdout.write("\n")
            elif cur.uptime_cs < prev.uptime_cs:
                # The clock went back (a replaced --proc-root, a restored VM): no
                # interval can be measured across it, so start again from here.
                print("iolens: the uptime clock went backwards; skipping this interval",
                      file=sys.stderr)
            else:
                printer.report(prev, cur, sampler.topology(cur), time.time())
                printed += 1
            if opts.interval is None or (opts.count is not None and printed >= opts.count):
                return 0
            prev = cur
            tick += 1
            delay = start + tick * opts.interval - time.monotonic()
            if delay < 0:  # fell behind (suspended, overloaded): start counting afresh
                start, tick, delay = time.monotonic(), 0, 0.0
            time.sleep(delay)
            try:
                cur = sampler.snapshot()
            except StatsUnavailableError as exc:
                print(f"iolens iostat: {exc}; stopping after {printed} report(s)",
                      file=sys.stderr)
                return 1
    finally:
        sampler.close()


def run(ns: argparse.Namespace) -> int:
    """Run ``iolens iostat`` with parsed arguments; returns the exit code."""
    opts = _parse_operands(ns)
    for flag, root in (("--proc-root", ns.proc_root), ("--sys-root", ns.sys_root)):
        if not ns.replay and not os.path.isdir(root):
            ns.parser.error(f"{flag} {root}: no such folder")
    devices = opts.devices + _devices_for_paths(ns)
    printer = _Printer(ns, devices)
    try:
        if ns.replay:
            return _replay(ns, opts, printer)
        return _live(ns, opts, printer)
    except UnknownDeviceError as exc:
        ns.parser.error(str(exc))
    except BrokenPipeError:
        # The reader went away (`| head`): stop quietly, without a traceback at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
    raise AssertionError("unreachable: parser.error exits")
