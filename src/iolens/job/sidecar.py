"""The sidecar that ``iolens.monitor()`` starts: records a process that is already running.

    python -m iolens.job.sidecar --pid PID --out DIR [--interval S] [--path P] [--device D]
                                 [--mlflow] [--wandb] [--autotune]

It samples like ``iolens run`` does, with PID as the root of the job's
process tree, until it reads ``stop`` (or end of file) on its standard input,
or PID is gone. Then it takes the last partial interval, writes the final
meta.json with the summary and exits 0. Once its baseline of the process
tree is taken it writes ``ready`` on its standard output. The monitored script's own
``monitor()`` object prints the summary; the sidecar prints only errors.

NOTE [signals]: the sidecar shares the script's terminal, so a Ctrl-C typed
there reaches both. The sidecar ignores SIGINT: the script decides when the
recording ends (its ``with`` block unwinds and says ``stop``), and a script
that dies closes the pipe, which ends the recording just the same.
"""

from __future__ import annotations

import argparse
import os
import select
import signal
import sys
import time
from collections.abc import Callable

from iolens.job.autotune import Tuner
from iolens.job.run import (
    TRACKERS,
    UNFINISHED,
    asks_too,
    finish_run,
    finish_tracker,
    initial_watch,
    make_tuner,
    open_tracker,
)
from iolens.recorder.sampler import Recorder
from iolens.rundir import RunDir
from iolens.sinks.base import CallbackSink, FanOut, SinkError
from iolens.sources.procfs import pid_alive
from iolens.training import overrides


class _Control:
    """Reads the stop word from standard input; remembers why the recording ended."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.ended = ""
        self._buf = b""

    def wait(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while True:
            left = max(0.0, deadline - time.monotonic())
            try:
                ready, _, _ = select.select([0], [], [], min(left, 0.5))
            except InterruptedError:
                ready = []
            if ready:
                chunk = os.read(0, 4096)
                if not chunk:
                    self.ended = "the monitored process closed its end of the pipe"
                    return True
                self._buf += chunk
                if b"stop" in self._buf:
                    self.ended = "monitor stopped"
                    return True
            if not pid_alive(self.pid):
                self.ended = f"process {self.pid} ended"
                return True
            if left <= 0:
                return False


def _ready() -> None:
    """Tell the monitored process that its baseline is taken (one line on stdout)."""
    try:
        sys.stdout.write("ready\n")
        sys.stdout.flush()
        sys.stdout.close()
    except OSError:
        pass


def _glued(argv: list[str]) -> list[str]:
    """``--command VALUE`` pairs as ``--command=VALUE``.

    argparse takes a separate value that starts with ``-`` for an option, so
    the command line of a script run as ``train.py --epochs 3`` made the
    sidecar exit with a usage error and monitor() record nothing.
    """
    out: list[str] = []
    it = iter(argv)
    for arg in it:
        out.append(f"--command={next(it, '')}" if arg == "--command" else arg)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m iolens.job.sidecar")
    ap.add_argument("--pid", type=int, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--path", action="append", default=[])
    ap.add_argument("--device", action="append", default=[])
    ap.add_argument("--no-instrument", dest="instrument", action="store_false")
    ap.add_argument("--set", dest="settings", default=None,
                    help="the DataLoader settings monitor(set=...) gave (JSON)")
    ap.add_argument("--mlflow", action="store_true",
                    help="the figures, the verdict and the report into MLflow")
    ap.add_argument("--wandb", action="store_true",
                    help="the figures, the verdict and the report into a W&B run")
    ap.add_argument("--autotune", action="store_true",
                    help="answer the job's asks for its next epoch's loader settings")
    ap.add_argument("--command", action="append", default=[],
                    help="the monitored program's command line, for meta.json")
    ns = ap.parse_args(_glued(sys.argv[1:] if argv is None else argv))
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        run_dir = RunDir(ns.out)
    except OSError as exc:
        print(f"iolens: monitor cannot record to {ns.out}: {exc.strerror or exc}",
              file=sys.stderr)
        return 1
    watch, notes = initial_watch(ns.path, ns.device)

    def say(message: str) -> None:
        print(f"iolens: monitor: {message}", file=sys.stderr)

    fan = FanOut(notes, lambda message: say(f"warning: {message}"))
    trackers = []
    for name in TRACKERS:
        if getattr(ns, name):
            try:
                trackers.append(open_tracker(name, run_dir.path))
                fan.add(f"--{name}", trackers[-1])
            except SinkError as exc:
                fan.note(f"no --{name}: {exc}")
    control = _Control(ns.pid)
    recorder: Recorder | None = None
    tuner: Tuner | None = None
    settings, loaders = overrides.from_env(ns.settings)
    given = {"set": settings or None, "set_loaders": loaders or None}
    try:
        recorder = Recorder(run_dir, ns.pid, ns.interval, watch,
                            exclude_pids=frozenset({os.getpid()}))
        recorder.notes.extend(notes)
        fan.notes = recorder.notes
        run_dir.write_meta(recorder.base_meta(ns.command, {
            "mode": "monitor", "instrumented": ns.instrument, **given,
            "notes": [*recorder.notes, UNFINISHED]}))
        wait: Callable[[float], bool] = control.wait
        if ns.autotune and ns.instrument:
            tuner = make_tuner(recorder, run_dir, ns.command, lambda m: say(f"warning: {m}"))
            wait = asks_too(wait, tuner)
            fan.add("autotune", CallbackSink(tuner.take, lambda: None))
        _ready()
        recorder.loop(wait, on_record=fan if fan.names else None)
        fan(recorder.sample())  # the last, partial interval
    except Exception as exc:  # noqa: BLE001 - NOTE [never hurt the job] in sampler.py
        print(f"iolens: monitor recording stopped: {exc!r}", file=sys.stderr)
        if recorder is not None:
            recorder.notes.append(f"recording stopped: {exc!r}")
    fan.close()
    tuned = {"autotune": tuner.to_meta()} if tuner is not None else {}
    done = finish_run(run_dir, recorder, ns.command, {
        "mode": "monitor", "instrumented": ns.instrument, **given, **tuned,
        "ended": control.ended})
    for message in done.warnings:
        say(message)
    for tracker in trackers:
        if not tracker.failed:
            finish_tracker(tracker, done, 0, say)
    return 0


if __name__ == "__main__":
    sys.exit(main())
