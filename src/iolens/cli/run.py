"""``iolens run``: run a training command and record why it waits."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from typing import Any

from iolens.cli._checks import INTERVAL_RANGE, check_interval, check_watch
from iolens.job.run import RunOptions
from iolens.job.run import run as run_job
from iolens.rundir import RECORDS, default_run_dir
from iolens.sinks.base import SinkError

_EPILOG = """\
The job runs unchanged: same stdin, stdout, terminal and exit code (128+N
when signal N ended it). Python jobs get their DataLoader timed with no code
change (a sitecustomize bootstrap on PYTHONPATH; --no-instrument turns it off).
Processes the job leaves running when it exits are recorded until they exit,
for at most 10 s more (--linger). If the run directory's filesystem fills up or
turns read-only, the intervals are kept in memory and written at the end, or
the whole run is saved under the temporary directory instead (the path is
printed); the job's timing goes to a spare folder in /dev/shm meanwhile. No
root is needed: `iolens doctor` says which feature needs which privilege.

Live view: while the job runs, a full-screen view of the watched devices,
the job's processes, CPU, GPUs and data wait is drawn on stderr when it is a
terminal and the job's own output goes elsewhere (`iolens run -- python
train.py > train.log`), so that nothing the job prints is drawn over.
--live draws it even over the job's output; --no-live never draws it.

Recorded into the run directory:
  meta.json       command, host, devices watched and why, versions, start/end, summary
  records.jsonl   one JSON object per interval: watched devices (iostat -x figures),
                  the job's processes by role (main, worker) with I/O, page-cache hit
                  and CPU, system CPU and iowait, page cache and dirty memory, GPUs
                  (NVML), and the loop's data wait and step time (count, sum, max,
                  p50, p95)
  timing/         the training processes' raw per-batch records
Every record carries its time twice: `time` (RFC 3339) and `t` (Unix epoch seconds).

Other outputs, while the job runs (each opened before the job starts: a
port in use, a bad path or a missing package is an error and the job is
not started; a failure later drops that output with a note in meta.json
and a warning, and the job runs on):
  --prometheus [HOST:]PORT  serve /metrics for Prometheus (HOST defaults to 127.0.0.1;
                            0.0.0.0 listens on every interface); needs prometheus-client
  --csv FILE                one row per interval, fixed header (see the README)
  --tensorboard DIR         key figures as TensorBoard scalars, step = record seq
  --mlflow                  key figures as MLflow metrics, the verdict as tags and the
                            report as the artifact iolens/report.html: in the job's own
                            active MLflow run, or a new one in the store and experiment
                            MLFLOW_TRACKING_URI and MLFLOW_EXPERIMENT_NAME name; needs mlflow
  --wandb                   the same into a new W&B run (the summary holds the verdict), in
                            the project WANDB_PROJECT names, or the job's own run's project
                            and group; offline (for `wandb sync`) with no W&B login here and
                            no WANDB_MODE; needs wandb

examples:
  iolens run -- python train.py --epochs 3
  iolens run --path /data/imagenet --interval 0.5 -- torchrun --nproc-per-node 2 train.py
  iolens run --out runs/baseline --device nvme1n1 -- python train.py
  iolens run --prometheus 9478 --csv run.csv -- python train.py
  iolens run --set num_workers=4 persistent_workers=true -- python train.py
  iolens run --autotune -- python train.py --epochs 10
  MLFLOW_TRACKING_URI=sqlite:///mlflow.db iolens run --mlflow -- python train.py
  WANDB_MODE=offline WANDB_PROJECT=loader iolens run --wandb -- python train.py
"""


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``iolens run``."""
    p = argparse.ArgumentParser(
        prog="iolens run",
        usage="iolens run [--out DIR] [--interval S] [--path P ...] [--device D ...] "
              "[--no-instrument] [--set KEY=VALUE ...] [--set-loader NAME] [--autotune] "
              "[--linger S] [--prometheus [HOST:]PORT] [--job NAME] [--csv FILE] "
              "[--tensorboard DIR] [--mlflow] [--wandb] [--live | --no-live] -- CMD ...",
        description="Run CMD and record, every interval, the disks, the job's processes and "
                    "how long its training loop waits for data.",
        epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", metavar="DIR",
                   help="run directory to create (default: iolens-runs/<time>-<program>)")
    p.add_argument("--interval", type=float, default=1.0, metavar="S",
                   help="seconds between records, "
                        f"{INTERVAL_RANGE} (default 1)")
    p.add_argument("--path", action="append", default=[], metavar="P",
                   help="also watch the devices serving P, e.g. the dataset (repeatable)")
    p.add_argument("--device", action="append", default=[], metavar="D",
                   help="also watch block device D, e.g. nvme0n1 (repeatable)")
    p.add_argument("--no-instrument", dest="instrument", action="store_false",
                   help="do not time the DataLoader inside the job")
    p.add_argument("--set", dest="settings", action="extend", nargs="+", default=[],
                   metavar="KEY=VALUE",
                   help="DataLoader settings the job's loaders take instead of their own, "
                        "with no code change: num_workers and prefetch_factor (numbers), "
                        "persistent_workers and pin_memory (true/false), "
                        "multiprocessing_context (fork, spawn, forkserver); repeatable, "
                        "e.g. --set num_workers=4 persistent_workers=true")
    p.add_argument("--set-loader", dest="set_loaders", action="append", default=[],
                   metavar="NAME",
                   help="--set only the loaders whose dataset's class is NAME (its bare "
                        "name, e.g. ImageFolder; a Subset's dataset counts too; repeatable; "
                        "default: every loader)")
    p.add_argument("--autotune", action="store_true",
                   help="pick num_workers and prefetch_factor between epochs: at each "
                        "epoch's start the model proposes the setting it predicts best, the "
                        "epoch runs with it, and its measured rate keeps it or goes back; "
                        "the report lists each epoch's setting, prediction and rate, and the "
                        "setting to write into the code (map-style datasets; an epoch waits "
                        "at most 30 s for the answer)")
    p.add_argument("--linger", type=float, default=10.0, metavar="S",
                   help="go on recording processes the job leaves running for at most S "
                        "seconds after it exits (default 10; 0: stop with the job)")
    p.add_argument("--prometheus", metavar="[HOST:]PORT",
                   help="serve Prometheus metrics at http://HOST:PORT/metrics while the job "
                        "runs (HOST 127.0.0.1 unless given; port 0 picks a free one)")
    p.add_argument("--job", metavar="NAME",
                   help="the job label of the Prometheus metrics (default: the run "
                        "directory's name)")
    p.add_argument("--csv", metavar="FILE",
                   help="also write one CSV row per interval into FILE (replaced)")
    p.add_argument("--mlflow", action="store_true",
                   help="also log the key figures, the verdict and the report into MLflow "
                        "(the job's active run, or a new one)")
    p.add_argument("--wandb", action="store_true",
                   help="also log the key figures, the verdict and the report into a new W&B "
                        "run (offline when there is no W&B login here)")
    p.add_argument("--tensorboard", metavar="DIR",
                   help="also write the key figures as TensorBoard scalars into DIR")
    live = p.add_mutually_exclusive_group()
    live.add_argument("--live", dest="live", action="store_const", const=True, default=None,
                      help="draw the full-screen live view on stderr's terminal even when the "
                           "job prints to it too (its lines are drawn over while the view is "
                           "up)")
    live.add_argument("--no-live", dest="live", action="store_const", const=False,
                      help="no live view: print nothing but the final lines")
    p.add_argument("--quiet", action="store_true", help="print nothing at all")
    p.add_argument("--proc-root", default="/proc", help=argparse.SUPPRESS)
    p.add_argument("--sys-root", default="/sys", help=argparse.SUPPRESS)
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="CMD",
                   help="the command to run, after --")
    return p


def _settings(p: argparse.ArgumentParser, ns: argparse.Namespace) -> dict[str, Any]:
    """``--set`` checked before the job starts: a usage error (exit 2) otherwise."""
    from iolens.training import overrides  # noqa: PLC0415

    try:
        settings = overrides.parse(ns.settings)
    except overrides.SetError as exc:
        p.error(str(exc))
    if settings and not ns.instrument:
        p.error("--set works through the DataLoader's instrumentation: not with "
                "--no-instrument")
    if ns.autotune and not ns.instrument:
        p.error("--autotune works through the DataLoader's instrumentation: not with "
                "--no-instrument")
    if ns.set_loaders and not settings:
        p.error("--set-loader names the loaders --set applies to: it needs --set")
    return settings


def parse(argv: list[str]) -> argparse.Namespace:
    """Parse ``iolens run`` arguments (options before ``--``, the command after)."""
    p = build_parser()
    ns = p.parse_args(argv)
    ns.parser = p
    return ns


def run(ns: argparse.Namespace) -> int:
    """Run the job; returns its exit code."""
    p: argparse.ArgumentParser = ns.parser
    command = list(ns.command)
    if command and command[0] == "--":
        command = command[1:]
    settings = _settings(p, ns)
    if not command:
        p.error("no command to run: iolens run [OPTIONS] -- CMD ...")
    if shutil.which(command[0]) is None and not os.path.exists(command[0]):
        p.error(f"command not found: {command[0]}")
    check_interval(p, ns.interval)
    check_watch(p, ns)
    if ns.prometheus is not None:
        from iolens.sinks.prometheus import parse_listen  # noqa: PLC0415 - only when asked for

        try:
            parse_listen(ns.prometheus)
        except ValueError as exc:
            p.error(f"--prometheus {exc}")
    elif ns.job is not None:
        p.error("--job names the Prometheus metrics' job: it needs --prometheus")
    for flag, value in (("--csv", ns.csv), ("--tensorboard", ns.tensorboard), ("--job", ns.job)):
        if value is not None and not value.strip():
            p.error(f"{flag} needs a value")
    if not 0 <= ns.linger <= 3600:
        p.error(f"--linger must be between 0 and 3600 seconds, not {ns.linger:g}")
    out = ns.out or default_run_dir("iolens-runs", command)
    held = os.path.join(out, RECORDS)  # (a symlink planted there is no run: RunDir replaces it)
    if os.path.isfile(held) and not os.path.islink(held):
        p.error(f"--out {out} already holds a run; choose another folder")
    opts = RunOptions(command=command, out=out, interval=ns.interval, paths=ns.path,
                      devices=ns.device, proc_root=ns.proc_root, sys_root=ns.sys_root,
                      instrument=ns.instrument, quiet=ns.quiet, live=ns.live,
                      prometheus=ns.prometheus, job=ns.job, csv=ns.csv,
                      tensorboard=ns.tensorboard, mlflow=ns.mlflow, wandb=ns.wandb,
                      linger=ns.linger, settings=settings, set_loaders=ns.set_loaders,
                      autotune=ns.autotune)
    try:
        return run_job(opts)
    except SinkError as exc:
        # NOTE [outputs fail before the job starts] in iolens/job/run.py: one line, exit 2.
        print(f"iolens run: error: {exc}; the job was not started", file=sys.stderr)
        return 2
