"""``iolens exporter``: serve a machine's (or a process tree's) disks, CPU, memory and GPUs
to Prometheus."""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import time
from types import FrameType

from iolens.cli._checks import INTERVAL_RANGE, check_interval, check_watch
from iolens.live.top import TopOptions, command_line, process_exists, top_watch
from iolens.recorder.sampler import Recorder
from iolens.recorder.totals import LiveTotals, job_rank
from iolens.sinks.base import SinkError
from iolens.sinks.prometheus import (
    DEFAULT_PORT,
    Exporter,
    ExporterError,
    ExportLabels,
    IolensCollector,
    parse_listen,
    require_client,
)

_EPILOG = """\
Serves http://HOST:PORT/metrics in the Prometheus text format until
stopped (Ctrl-C or SIGTERM, exit 0), or until the --pid process ends:
  iolens_disk_*      each watched device's raw counters, node_exporter's names
                     and units (e.g. iolens_disk_io_time_seconds_total)
  iolens_job_*       with --pid, the process tree's I/O and CPU by role (main,
                     worker, other), processes that ended included
  iolens_cpu_*, iolens_memory_*   the machine's CPU times, page cache, Dirty, Writeback
  iolens_gpu_*       each GPU's utilization and memory (NVML), where present
Every series has the labels host, job and rank. The training metrics (data
wait and step time histograms, the verdict) come with
`iolens run --prometheus`, which times the training loop.

The counters are read every --interval (default 1 s) by a sampler of their
own; a scrape answers from the latest sample and never waits for one.

It listens on 127.0.0.1 (this machine only) unless --listen names another
address; the first line on stderr says where, and warns when the metrics
are open to the network: the endpoint has no authentication.

Devices watched: as `iolens top` (with --pid, those serving the process's
working directory and any it has files open on; without, every whole disk
that did I/O since boot; plus each --path and --device).

examples:
  iolens exporter                             127.0.0.1:9478, the machine's busy disks
  iolens exporter --listen 0.0.0.0:9478       on every interface, for a Prometheus elsewhere
  iolens exporter --pid 4242 --job resnet50   a training job started elsewhere

exit codes: 0 stopped, or the --pid process ended; 1 prometheus-client is
missing; 2 usage error (bad address, port in use, no such process, unknown
device).
"""


class _Stop(BaseException):
    """Raised by the SIGTERM handler: unwinds like Ctrl-C, past the sampler's own handler."""


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``iolens exporter``."""
    p = argparse.ArgumentParser(
        prog="iolens exporter",
        usage="iolens exporter [--listen [HOST:]PORT] [--interval S] [--path P ...] "
              "[--device D ...] [--pid PID] [--job NAME]",
        description="Serve Prometheus metrics of the disks, a process tree, CPU, memory and "
                    "GPUs.",
        epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--listen", default=f"127.0.0.1:{DEFAULT_PORT}", metavar="[HOST:]PORT",
                   help=f"where to serve (default 127.0.0.1:{DEFAULT_PORT}; a bare port "
                        "listens on 127.0.0.1, 0.0.0.0 on every interface, port 0 on any "
                        "free port)")
    p.add_argument("--interval", type=float, default=1.0, metavar="S",
                   help="seconds between samples, "
                        f"{INTERVAL_RANGE} (default 1)")
    p.add_argument("--path", action="append", default=[], metavar="P",
                   help="also watch the devices serving P (repeatable)")
    p.add_argument("--device", action="append", default=[], metavar="D",
                   help="also watch block device D (repeatable)")
    p.add_argument("--pid", type=int, metavar="PID",
                   help="also report this process tree's I/O and CPU; stop when it ends")
    p.add_argument("--job", metavar="NAME",
                   help="the job label (default: the --pid process's program, else iolens)")
    p.add_argument("--proc-root", default="/proc", metavar="DIR", help=argparse.SUPPRESS)
    p.add_argument("--sys-root", default="/sys", metavar="DIR", help=argparse.SUPPRESS)
    return p


def run(ns: argparse.Namespace) -> int:
    """Serve until stopped; returns the exit code."""
    p: argparse.ArgumentParser = ns.parser
    check_interval(p, ns.interval)
    try:
        host, port = parse_listen(ns.listen, default_port=DEFAULT_PORT)
    except ValueError as exc:
        p.error(f"--listen {exc}")
    if ns.pid is not None and (ns.pid <= 0 or not process_exists(ns.pid, ns.proc_root)):
        p.error(f"--pid {ns.pid}: no such process in {ns.proc_root}")
    if ns.job is not None and not ns.job.strip():
        p.error("--job needs a name")
    check_watch(p, ns)
    try:
        require_client()
    except ExporterError as exc:
        print(f"iolens exporter: error: {exc}", file=sys.stderr)
        return 1
    opts = TopOptions(pid=ns.pid, interval=ns.interval, paths=ns.path, devices=ns.device,
                      proc_root=ns.proc_root, sys_root=ns.sys_root)
    try:
        watch, notes = top_watch(opts)
    except ValueError as exc:
        p.error(str(exc))
    rank = job_rank(_environ(ns.pid, ns.proc_root)) if ns.pid is not None else "0"
    labels = ExportLabels(socket.gethostname(), ns.job or _job_name(ns.pid, ns.proc_root), rank)
    totals = LiveTotals(rank=rank, interval=ns.interval, proc_root=ns.proc_root,
                        training=False)
    try:
        exporter = Exporter(host, port, IolensCollector(totals.latest, labels))
    except SinkError as exc:
        print(f"iolens exporter: error: {exc}", file=sys.stderr)
        return 2
    recorder: Recorder | None = None
    ended = False

    def wait(timeout: float) -> bool:
        nonlocal ended
        time.sleep(timeout)
        if ns.pid is not None and not process_exists(ns.pid, ns.proc_root):
            ended = True
        return ended

    previous = signal.signal(signal.SIGTERM, _raise_stop)
    try:
        recorder = Recorder(None, ns.pid, ns.interval, watch, proc_root=ns.proc_root,
                            sys_root=ns.sys_root, discover=ns.pid is not None, totals=totals)
        exporter.start()
        watched = ", ".join(f"{d} ({why})" for d, why in recorder.watch.items()) or "no device"
        print(f"iolens exporter: serving {exporter.notice('--listen')}", file=sys.stderr,
              flush=True)
        print(f"iolens exporter: sampling every {ns.interval:g} s; watching {watched}",
              file=sys.stderr, flush=True)
        for note in [*notes, *recorder.notes]:
            print(f"iolens exporter: note: {note}", file=sys.stderr, flush=True)
        recorder.loop(wait)
    except (KeyboardInterrupt, _Stop):
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        exporter.close()
        if recorder is not None:
            recorder.close()
    if ended:
        print(f"iolens exporter: process {ns.pid} has exited", file=sys.stderr)
    return 0


def _raise_stop(signum: int, frame: FrameType | None) -> None:
    del signum, frame
    raise _Stop


def _environ(pid: int | None, proc_root: str) -> dict[str, str]:
    try:
        with open(os.path.join(proc_root, str(pid), "environ"), "rb") as fh:
            raw = fh.read(1 << 20)
    except OSError:
        return {}
    out: dict[str, str] = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.decode(errors="replace").partition("=")
        if sep:
            out[key] = value
    return out


def _job_name(pid: int | None, proc_root: str) -> str:
    """The program a process runs (a Python script's name), for the job label."""
    if pid is None:
        return "iolens"
    args = command_line(pid, proc_root).split()
    if not args:
        return f"pid{pid}"
    prog = os.path.basename(args[0])
    if prog.startswith("python"):
        script = next((a for a in args[1:] if not a.startswith("-")), "")
        prog = os.path.splitext(os.path.basename(script))[0] or prog
    return prog.strip("[]") or f"pid{pid}"
