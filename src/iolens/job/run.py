"""``iolens run -- CMD``: start the job, record it, hand back its exit code.

NOTE [signals]: the job runs in iolens' process group, so a Ctrl-C typed at
the terminal reaches it directly; iolens ignores that SIGINT and keeps
recording until the job has exited. A SIGINT sent to iolens alone (no
terminal, or the job in another group) and SIGTERM, SIGHUP, SIGQUIT, SIGUSR1
and SIGUSR2 are passed on to the job. The exit code is the job's own, or
128 + N when signal N ended it. Known limit: a signal sent to the whole
process group where there is no terminal (``kill -TERM -PGID``, ``kill %1``
from a shell) reaches the job directly and once more through iolens, which
cannot tell it from one sent to iolens alone; a job whose handler counts
signals may see two (tests/test_faults.py, test_a_signal_reaches_the_job_once).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import secrets
import select
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from types import FrameType
from typing import TYPE_CHECKING, Any

from iolens._errors import IolensError
from iolens.analysis.columns import RunView
from iolens.analysis.longrun import LONG_RUN_RECORDS, estimate_records
from iolens.analysis.rundata import load_run
from iolens.analysis.verdict import diagnose, verdict_lines
from iolens.job.autotune import Tuner
from iolens.live.history import Header
from iolens.live.view import LiveView, is_terminal
from iolens.recorder.sampler import Recorder
from iolens.recorder.summary import summarize, summary_lines
from iolens.recorder.totals import LiveTotals, job_rank
from iolens.rundir import (
    RECORDS,
    RunDir,
    append_whole,
    open_append,
    rfc3339,
    write_atomic,
)
from iolens.sinks.base import CallbackSink, FanOut, Sink
from iolens.sources.devmap import device_for_path
from iolens.training import autotune as tune
from iolens.training import overrides
from iolens.training.autotune import FOLDER as TUNE_FOLDER

if TYPE_CHECKING:
    from iolens.sinks.prometheus import Exporter
    from iolens.sinks.tracker import TrackerSink

UNFINISHED = ("the recording did not finish, or is still going on: iolens was stopped "
              "(killed?) before the job ended, or could not replace this meta.json at the end "
              "(a full or read-only filesystem), so the end, the exit code and the summary "
              "are missing; the records written up to then are kept")
"""A note in the meta.json written at the start only: the final one replaces it, so a
run directory whose recorder was killed says so in its report."""

_FORWARDED = (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


@dataclass
class RunOptions:
    """What ``iolens run`` was asked to do."""

    command: list[str]
    out: str
    interval: float = 1.0
    paths: list[str] = field(default_factory=list)
    devices: list[str] = field(default_factory=list)
    proc_root: str = "/proc"
    sys_root: str = "/sys"
    instrument: bool = True
    quiet: bool = False
    live: bool | None = None
    """The live view: True draws it, False never, None when stderr is a terminal that
    the job's stdout does not share (NOTE [live view] in iolens/live/view.py)."""
    prometheus: str | None = None
    """``[HOST:]PORT`` to serve Prometheus metrics on while the job runs; None for none."""
    job: str | None = None
    """The ``job`` label of the metrics; None: the run directory's name."""
    csv: str | None = None
    """A CSV file to write one row per interval into; None for none."""
    tensorboard: str | None = None
    """A TensorBoard log directory for the key figures as scalars; None for none."""
    mlflow: bool = False
    """Log the key figures, the verdict and the report into MLflow."""
    wandb: bool = False
    """... and into a W&B run."""
    linger: float = 10.0
    """Seconds to go on recording the job's processes that outlive it (NOTE [leftovers])."""
    settings: dict[str, Any] = field(default_factory=dict)
    """DataLoader settings given with ``--set`` (iolens.training.overrides)."""
    set_loaders: list[str] = field(default_factory=list)
    """The dataset class names whose loaders take them (``--set-loader``; none: all)."""
    autotune: bool = False
    """Pick num_workers and prefetch_factor between epochs (NOTE [autotune between
    epochs] in iolens/training/autotune.py)."""


@dataclass
class Outputs:
    """What a run feeds besides its run directory, opened before the job starts."""

    sinks: list[tuple[str, Sink]] = field(default_factory=list)
    """Record sinks by the name notes use for them (``--csv FILE``)."""
    totals: LiveTotals | None = None
    """The cumulative state the Prometheus endpoint serves."""
    exporter: Exporter | None = None
    trackers: list[TrackerSink] = field(default_factory=list)
    """The experiment trackers' sinks, which also take the verdict and the report at the
    end."""
    storage: list[dict[str, Any]] = field(default_factory=list)
    """What serves the dataset as found so far, kept up to date by the recorder in place:
    the live verdicts (the endpoint's and the view's) read it."""

    def close(self) -> None:
        """Stop the endpoint (the sinks are closed through the fan-out)."""
        if self.exporter is not None:
            self.exporter.close()


def open_outputs(opts: RunOptions, watch: dict[str, str],
                 note: Callable[[str], None]) -> Outputs:
    """Bind the Prometheus endpoint and open the sinks, before the job starts.

    NOTE [outputs fail before the job starts]: a port in use, a bad path or
    a missing package raises :class:`iolens.IolensError` (SinkError,
    ExporterError) with one line saying why, and nothing has started yet:
    the user fixes the command line rather than losing the endpoint or the
    file of a long run. Once the job runs, a sink that fails is dropped and
    noted (NOTE [a sink never hurts the job] in iolens/sinks/base.py).
    """
    out = Outputs()
    try:
        if opts.prometheus is not None:
            from iolens.sinks.prometheus import (  # noqa: PLC0415 - optional dependency
                ExportLabels,
                start_exporter,
            )

            rank = job_rank()
            out.totals = LiveTotals(rank=rank, interval=opts.interval, proc_root=opts.proc_root)
            job = opts.job or os.path.basename(os.path.normpath(opts.out)) or "iolens"
            out.exporter = start_exporter(
                opts.prometheus, out.totals.latest, ExportLabels(socket.gethostname(), job, rank),
                {"cpus": os.cpu_count(), "instrumented": opts.instrument,
                 "storage": out.storage})
        if opts.csv is not None:
            from iolens.sinks.csvfile import CsvSink  # noqa: PLC0415 - only when asked for

            out.sinks.append((f"--csv {opts.csv}", CsvSink(opts.csv, list(watch), note)))
        if opts.tensorboard is not None:
            from iolens.sinks.tensorboard import TensorBoardSink  # noqa: PLC0415 - imports torch

            out.sinks.append((f"--tensorboard {opts.tensorboard}",
                              TensorBoardSink(opts.tensorboard)))
        for name in TRACKERS:
            if getattr(opts, name):
                tracker = open_tracker(name, os.path.abspath(opts.out))
                out.trackers.append(tracker)
                out.sinks.append((tracker.option, tracker))
    except BaseException:
        for _, sink in out.sinks:
            with contextlib.suppress(Exception):
                sink.close()
        out.close()
        raise
    return out


def initial_watch(paths: list[str], devices: list[str], proc_root: str = "/proc",
                  sys_root: str = "/sys") -> tuple[dict[str, str], list[str]]:
    """Devices to watch from the start, each with why, and notes on paths that have none."""
    watch: dict[str, str] = {}
    notes: list[str] = []
    for label, path in [("the current directory", os.getcwd())] + [
            (f"--path {p}", p) for p in paths]:
        m = device_for_path(path, proc_root, sys_root)
        if not m.disks:
            notes.append(f"{label} ({m.path}): {m.reason}")
        for disk in m.disks:
            watch.setdefault(disk, f"serves {label} ({m.path})")
    for d in devices:
        watch.setdefault(d, "--device")
    return watch, notes


_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
"""The iolens package's folder (its bootstrap is there)."""


def child_env(run_dir: str, interval: float, instrument: bool,
              spare: str | None = None, *, settings: dict[str, Any] | None = None,
              set_loaders: Sequence[str] = (), autotune: bool = False) -> dict[str, str]:
    """The job's environment: unchanged, plus the timing bootstrap when instrumenting
    (and ``spare``, NOTE [spare timing folder] in iolens/training/_hooks.py, the
    DataLoader ``settings`` of ``--set``, and the folder of ``--autotune``)."""
    env = dict(os.environ)
    env["IOLENS_RUN_DIR"] = os.path.abspath(run_dir)
    env.pop("IOLENS_TIMING_SPARE", None)
    env.pop(overrides.ENV, None)
    env.pop(tune.ENV, None)
    if instrument and settings:
        env[overrides.ENV] = overrides.to_env(settings, set_loaders)
    if instrument and autotune:
        env[tune.ENV] = os.path.join(os.path.abspath(run_dir), TUNE_FOLDER)
    if instrument and spare is not None:
        env["IOLENS_TIMING_SPARE"] = spare
    if instrument:
        boot = os.path.join(_PACKAGE, "_bootstrap")
        old = env.get("PYTHONPATH")
        env["PYTHONPATH"] = boot + (os.pathsep + old if old else "")
        env["IOLENS_PKG_PARENT"] = os.path.dirname(os.path.dirname(boot))
        # Hand batches over a few times per interval so each record sees its own.
        env["IOLENS_FLUSH_MS"] = str(max(50, min(1000, int(interval * 250))))
    return env


def exit_code(returncode: int) -> int:
    """The shell's convention: a job killed by signal N exits 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def _say(opts: RunOptions, msg: str) -> None:
    if not opts.quiet:
        print(f"iolens: {msg}", file=sys.stderr, flush=True)


def run(opts: RunOptions) -> int:
    """Run the job under the recorder; returns the job's exit code.

    Raises :class:`iolens.IolensError` before starting anything when an
    output cannot be opened (NOTE [outputs fail before the job starts]).
    """
    watch, notes = initial_watch(opts.paths, opts.devices, opts.proc_root, opts.sys_root)
    view: LiveView | None = None
    deferred: list[str] = []

    def warn(message: str) -> None:
        if view is not None and view.active:
            deferred.append(message)  # printed once the view has left the screen
        else:
            _say(opts, f"warning: {message}")

    fan = FanOut(notes, warn)
    outputs = open_outputs(opts, watch, fan.note)
    for name, sink in outputs.sinks:
        fan.add(name, sink)
    try:
        try:
            run_dir = RunDir(opts.out)
        except OSError as exc:
            # NOTE [never hurt the job]: an unwritable --out must not stop the training.
            fallback = tempfile.mkdtemp(prefix="iolens-run-")
            _say(opts, f"cannot create {opts.out} ({exc.strerror or exc}); recording to "
                       f"{fallback}")
            run_dir = RunDir(fallback)
        for tracker in outputs.trackers:
            tracker.run_dir = os.path.abspath(run_dir.path)
        spare = _spare_timing_dir() if opts.instrument else None
        env = child_env(run_dir.path, opts.interval, opts.instrument, spare,
                        settings=opts.settings, set_loaders=opts.set_loaders,
                        autotune=opts.autotune)
        try:
            child = subprocess.Popen(opts.command, env=env)
        except OSError as exc:
            run_dir.close()
            if spare is not None:
                shutil.rmtree(spare, ignore_errors=True)
            raise FileNotFoundError(f"cannot start {opts.command[0]!r}: "
                                    f"{exc.strerror or exc}") from exc
    except BaseException:
        fan.close()
        outputs.close()
        raise
    if outputs.exporter is not None:
        _say(opts, f"Prometheus metrics at {outputs.exporter.notice('--prometheus')}")

    stopped_by: list[int] = []
    tty_group = _child_shares_terminal()

    def forward(signum: int, frame: FrameType | None) -> None:
        del frame
        stopped_by.append(signum)
        if signum == signal.SIGINT and tty_group:
            return  # the terminal already sent it to the job (NOTE [signals])
        with contextlib.suppress(OSError):
            child.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, *_FORWARDED)}
    recorder: Recorder | None = None
    tuner: Tuner | None = None
    rc: int | None = None
    outputs_meta: dict[str, Any] = {"outputs": _outputs_meta(opts, outputs)}
    try:
        try:
            recorder = Recorder(run_dir, child.pid, opts.interval, watch,
                                proc_root=opts.proc_root, sys_root=opts.sys_root,
                                totals=outputs.totals,
                                adopter=os.getpid() if _become_subreaper() else None)
            recorder.timing.spare = spare
            recorder.storage_now = outputs.storage
            # One list of notes: the recorder's, the watch's and the sinks' (meta.json).
            recorder.notes.extend(fan.notes)
            fan.notes = recorder.notes
            meta = recorder.base_meta(opts.command, {
                "instrumented": opts.instrument, **outputs_meta,
                "set": dict(opts.settings) or None,
                "set_loaders": list(opts.set_loaders) or None,
                # Where the job's timing goes should the run directory fail it: after
                # a kill of iolens, the one place that says so.
                "timing_spare": spare,
                "notes": [*recorder.notes, UNFINISHED]})
            run_dir.write_meta(meta)
            watched = ", ".join(f"{d} ({why})" for d, why in watch.items()) or "no device"
            _say(opts, f"recording to {run_dir.path} every {opts.interval:g} s; watching "
                       f"{watched}")

            job_exited = _exit_waiter(child)

            def waiter(timeout: float) -> bool:
                _reap_adopted(keep=child.pid)
                return job_exited(timeout)

            wait: Callable[[float], bool] = waiter

            if _want_live(opts):
                view = _live_view(opts, recorder, run_dir, child.pid)
                fan.add(_VIEW, CallbackSink(view.update, view.stop))
            if opts.autotune:
                tuner = make_tuner(recorder, run_dir, opts.command, warn)
                wait = asks_too(wait, tuner)
                fan.add(_TUNER, CallbackSink(tuner.take, lambda: None))
            recorder.loop(wait, on_record=fan if fan.names else None)
            fan(recorder.sample())  # the last, partial interval
            leftovers = None
            if recorder.leftovers and opts.linger > 0:
                rc = child.wait()
                say = None if view is not None and view.active else partial(_say, opts)
                leftovers = _record_leftovers(opts, recorder, fan, stopped_by, say)
            fan.close(_VIEW)  # the view leaves the screen before anything else is printed
            if leftovers is not None:
                _say(opts, leftovers)
        except Exception as exc:  # noqa: BLE001 - NOTE [never hurt the job] in sampler.py
            if view is not None:
                view.stop()
            _say(opts, f"recording stopped: {exc!r}; the job runs on")
            if recorder is not None:
                recorder.notes.append(f"recording stopped: {exc!r}")
        rc = _wait_reaping(child)
    finally:
        if view is not None:
            view.stop()
        for s, h in previous.items():
            signal.signal(s, h)
        if rc is None:  # interrupted before the job ended: do not orphan it silently
            rc = child.wait()
        fan.close()
        outputs.close()
    for message in deferred:
        _say(opts, f"warning: {message}")
    if view is not None and view.error is not None:
        _say(opts, view.error)
    code = exit_code(rc)
    if tuner is not None:
        outputs_meta["autotune"] = tuner.to_meta()
    trackers = [t for t in outputs.trackers if not t.failed]  # one that failed was dropped
    _finish(opts, run_dir, recorder, code=code, rc=rc, stopped_by=stopped_by,
            extra=outputs_meta, spare=spare, trackers=trackers)
    return code


_VIEW = "the live view"
_TUNER = "autotune"


def make_tuner(recorder: Recorder, run_dir: RunDir, command: Sequence[str],
               warn: Callable[[str], None]) -> Tuner:
    """The answers to the job's asks of ``--autotune`` (and ``monitor(autotune=True)``),
    from the model of what the recorder has seen (NOTE [autotune between epochs] in
    iolens/training/autotune.py)."""
    def meta() -> dict[str, Any]:
        return {"cpus": os.cpu_count(), "storage": recorder.storage_now,
                "loaders": recorder.loaders(), "command": list(command),
                "pace_s": recorder.pace.seconds()}

    return Tuner(run_dir.path, meta, warn)


def asks_too(wait: Callable[[float], bool], tuner: Tuner) -> Callable[[float], bool]:
    """``wait`` that also returns (False: sample now) when the job asks for its next
    epoch's settings, looking every ASK_POLL_S: an epoch waits for its answer. An ask
    still pending (its sample failed) wakes it at most every ASK_POLL_S, so that ``wait``
    (the job's end, monitor()'s stop word) is still looked at."""
    woke = [0.0]

    def waiting(timeout: float) -> bool:
        end = time.monotonic() + timeout
        while True:
            now = time.monotonic()
            if now - woke[0] >= ASK_POLL_S and tuner.asked():
                woke[0] = now
                return False
            left = end - time.monotonic()
            if left <= 0:
                return wait(0.0)
            if wait(min(left, ASK_POLL_S)):
                return True

    return waiting


ASK_POLL_S = 0.02


def _outputs_meta(opts: RunOptions, outputs: Outputs) -> dict[str, Any]:
    """Where the run's other outputs went, for meta.json."""
    return {
        "prometheus": outputs.exporter.url if outputs.exporter is not None else None,
        "csv": os.path.abspath(opts.csv) if opts.csv is not None else None,
        "tensorboard": (os.path.abspath(opts.tensorboard) if opts.tensorboard is not None
                        else None),
    }


def _exit_waiter(child: subprocess.Popen[bytes]) -> Callable[[float], bool]:
    """``wait(timeout)``: True once the job has exited, False after ``timeout`` seconds.

    Popen.wait(timeout) polls, waking up to 20 times a second; a pidfd (Linux
    5.3 and later) lets the recorder sleep until the job exits or the next
    sample is due. Where there is none, Popen's polling stands in.
    """
    try:
        pidfd: int | None = os.pidfd_open(child.pid)
    except (AttributeError, OSError):
        pidfd = None

    def wait(timeout: float) -> bool:
        if pidfd is not None:
            ready, _, _ = select.select([pidfd], [], [], timeout)
            if not ready:
                return False
            child.wait()
            with contextlib.suppress(OSError):
                os.close(pidfd)
            return True
        try:
            child.wait(timeout=timeout)
            return True
        except subprocess.TimeoutExpired:
            return False

    return wait


def _wait_reaping(child: subprocess.Popen[bytes]) -> int:
    """Wait for the job, collecting meanwhile the orphans it leaves with iolens (a
    subreaper), also when the recording has stopped early (NOTE [leftovers])."""
    while True:
        _reap_adopted(keep=child.pid)
        try:
            return child.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            continue


def _become_subreaper() -> bool:
    """Adopt the job's orphans (PR_SET_CHILD_SUBREAPER), so NOTE [leftovers] finds them.

    A grandchild whose parent exits between two samples would otherwise go
    to init unseen. False where prctl is not available.
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


_PR_SET_CHILD_SUBREAPER = 36


def _reap_adopted(keep: int | None = None) -> None:
    """Collect the adopted orphans that have exited, all but ``keep`` (the job, whose
    status Popen collects), so that a job that keeps orphaning processes does not pile
    up zombies under iolens during a long run."""
    while True:
        try:  # WNOWAIT: look first, so that the job's own status is left to Popen
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except (ChildProcessError, OSError):
            return
        if info is None or info.si_pid == keep:
            return
        try:
            os.waitpid(info.si_pid, 0)  # a zombie already: returns at once
        except ChildProcessError:
            return


def _record_leftovers(opts: RunOptions, recorder: Recorder, fan: FanOut,
                      stopped_by: list[int], say: Callable[[str], None] | None) -> str:
    """Go on recording the job's processes that outlived it, for at most ``opts.linger`` s;
    returns what happened, in words (``say`` tells the user now, unless the live view
    holds the screen).

    NOTE [leftovers] in sampler.py. The recording ends when they have all
    exited, when a signal arrives (the user wants the verdict now), or at the
    limit, so that a daemon the job started never holds ``iolens run``; the
    exit code stays the job's own.
    """
    start = time.monotonic()
    deadline = start + opts.linger
    signals = len(stopped_by)

    def running() -> list[int]:
        _reap_adopted()
        return recorder.running(recorder.leftovers)

    def wait(timeout: float) -> bool:
        end = min(time.monotonic() + timeout, deadline)
        while running() and len(stopped_by) == signals:
            if time.monotonic() >= end:
                return time.monotonic() >= deadline
            time.sleep(max(0.0, min(0.1, end - time.monotonic())))
        return True

    count = len(recorder.leftovers)
    if say is not None:
        say(f"the job has exited; recording the {count} process(es) it left running "
            f"(at most {opts.linger:g} s)")
    recorder.loop(wait, on_record=fan if fan.names else None)
    fan(recorder.sample())
    left = running()
    took = time.monotonic() - start
    if left:
        why = "a signal arrived" if len(stopped_by) > signals else f"after {opts.linger:g} s"
        msg = (f"{len(left)} process(es) the job left running (pids "
               f"{', '.join(map(str, left[:8]))}) were recorded for {took:.1f} s after it "
               f"exited; the recording stopped ({why}) while they ran on")
    else:
        msg = (f"the {count} process(es) the job left running were recorded until they "
               f"exited, {took:.1f} s after it")
    recorder.notes.append(msg)
    return msg


def _want_live(opts: RunOptions) -> bool:
    if opts.quiet or opts.live is False or not is_terminal(sys.stderr):
        return False
    if opts.live:
        return True
    try:  # auto: only when the job's stdout is not that same terminal
        out, err = os.fstat(1), os.fstat(2)
    except OSError:
        return False
    return not (os.isatty(1) and out.st_rdev == err.st_rdev)


def _live_view(opts: RunOptions, recorder: Recorder, run_dir: RunDir, pid: int) -> LiveView:
    """Start the full-screen view of the run on stderr (NOTEs in iolens/live/view.py)."""
    view = LiveView(recorder.watch, Header(
        title="iolens run", command=shlex.join(opts.command), pid=pid, run_dir=run_dir.path,
        gpu_reason=None if recorder.gpu.available else recorder.gpu.reason,
        notes=recorder.notes, footer="Ctrl-C stops the job; the verdict follows",
        storage=recorder.storage_now))
    view.start()  # never raises; on failure the run goes on without a view
    return view


def _child_shares_terminal() -> bool:
    try:
        return os.isatty(0) and os.tcgetpgrp(0) == os.getpgrp()
    except OSError:
        return False


def _finish(opts: RunOptions, run_dir: RunDir, recorder: Recorder | None, *, code: int,
            rc: int, stopped_by: list[int], extra: dict[str, Any],
            spare: str | None = None, trackers: Sequence[TrackerSink] = ()) -> None:
    done = finish_run(run_dir, recorder, opts.command, {
        "instrumented": opts.instrument,
        "set": dict(opts.settings) or None,
        "set_loaders": list(opts.set_loaders) or None,
        **extra,
        "exit_code": code,
        "signal": -rc if rc < 0 else None,
        "signals_received": [signal.Signals(s).name for s in stopped_by],
    }, spare=spare)
    for message in done.warnings:
        _say(opts, f"warning: {message}")
    _say(opts, f"run directory {done.path} ({done.records} intervals, exit code {code})")
    for line in end_lines(done.path, done.summary):
        _say(opts, line)
    for tracker in trackers:
        finish_tracker(tracker, done, code, partial(_say, opts))


TRACKERS = ("mlflow", "wandb")
"""The experiment trackers, by the name of their option (``--mlflow``)."""


def open_tracker(name: str, run_dir: str) -> TrackerSink:
    """The sink of the tracker ``name`` (one of TRACKERS), its store checked; SinkError when
    its package is missing or its store cannot be used. No tracker's package is imported
    unless asked for."""
    from iolens.sinks.tracker import MLflowSink, WandbSink  # noqa: PLC0415 - when asked for

    sink = {"mlflow": MLflowSink, "wandb": WandbSink}[name](run_dir)
    sink.check()
    return sink


def finish_tracker(tracker: TrackerSink, done: Finished, code: int,
                   say: Callable[[str], None]) -> None:
    """Hand the finished run's verdict and report to the tracker, and say where they went;
    a failure is said and noted in meta.json (NOTE [a sink never hurts the job])."""
    try:
        where = tracker.finish(done.path, done.summary, code)
        say(f"{tracker.label}: figures, verdict and report in {where}")
    except Exception as exc:  # noqa: BLE001 - NOTE [a sink never hurts the job]
        message = f"{tracker.option} could not take the verdict and the report: {exc}"
        say(f"warning: {message}")
        add_note(done.path, message)


def add_note(path: str, message: str) -> None:
    """Append ``message`` to the notes of the finished run's meta.json (best effort: a run
    directory that cannot take it keeps what it holds)."""
    meta_path = os.path.join(path, "meta.json")
    try:
        with open(meta_path, encoding="utf-8") as fh:
            meta = json.load(fh)
        meta.setdefault("notes", []).append(message)
        write_atomic(meta_path, (json.dumps(meta, indent=2, allow_nan=False) + "\n").encode())
    except (OSError, ValueError, AttributeError):
        pass


def end_lines(path: str, summary: dict[str, Any]) -> list[str]:
    """The verdict in three lines and where the full report is."""
    verdict = summary.get("verdict")
    if not isinstance(verdict, dict):
        return summary_lines(summary)
    return [*verdict_lines(verdict), f"full report: iolens report {shlex.quote(path)}"]


@dataclass
class Finished:
    """How a recording ended up on disk."""

    summary: dict[str, Any]
    path: str
    """Where the whole run is: the run directory, or the copy made when it could not
    hold it (NOTE [unsaved records])."""
    records: int
    """Intervals saved there."""
    warnings: list[str] = field(default_factory=list)
    """What went wrong while saving, in words for the user."""


def finish_run(run_dir: RunDir, recorder: Recorder | None, command: list[str],
               extra: dict[str, Any], *, spare: str | None = None) -> Finished:
    """Close the records, write the final meta.json with the summary.

    NOTE [unsaved records]: the records the run directory could not take
    when they were made are appended now if it takes them again (the reader
    orders records by time); if some still do not fit, or meta.json cannot
    be written, the whole run (every record and the final meta.json) is
    written to a new folder under the temporary directory instead, so that
    nothing recorded is lost and the report has all of it. The timing files
    the job wrote into ``spare`` (NOTE [spare timing folder] in
    iolens/training/_hooks.py) go to the run's timing folder the same way.
    """
    error = run_dir.write_error
    moved, spare = _take_spare(spare, run_dir.timing_dir)
    unsaved = recorder.unsaved if recorder is not None else []
    late = 0
    while unsaved and run_dir.append(unsaved[0]):
        unsaved.pop(0)
        late += 1
    run_dir.close()
    records, view = _finished_records(run_dir.path, unsaved)
    summary = summarize(records)
    done = Finished(summary, run_dir.path, run_dir.lines)
    if recorder is None:
        return done
    lost = len(unsaved) + recorder.unsaved_dropped
    if late:
        recorder.notes.append(f"{late} interval(s) could not be written when they were "
                              f"recorded ({error}); they were written at the end, out of order")
        done.warnings.append(f"{error}; {late} interval(s) written late, at the end")
    if moved:
        recorder.notes.append(f"{moved} timing file(s) the job could not write into "
                              f"{run_dir.timing_dir} were kept in a spare folder and added "
                              "there at the end")
    meta = recorder.base_meta(command, {
        "devices": recorder.watch,
        "storage": recorder.storage.meta(),
        "run_dir": os.path.abspath(run_dir.path),
        "end": rfc3339(time.time()),
        "duration_s": round(time.time() - recorder.start_wall, 3),
        **extra,
        "records": run_dir.lines,
        "lost_records": lost,
        "write_error": error if lost else None,
        "timing": _timing_status(run_dir.timing_dir) + _timing_status(spare),
        "notes": recorder.notes,
    })
    try:
        summary["verdict"] = diagnose(view if view is not None else records, meta).to_dict()
    except Exception as exc:  # noqa: BLE001 - the records stay; the report can retry
        recorder.notes.append(f"the verdict failed: {exc!r}")
    meta["summary"] = summary
    if not run_dir.write_meta(meta) or lost:
        why = run_dir.write_error or error
        if view is not None:  # (buckets: the copy takes every record)
            records = sorted(read_records(run_dir.path) + unsaved, key=_seq)
        copy, spare = _save_elsewhere(run_dir.path, records, meta, why,
                                      recorder.unsaved_dropped, spare=spare)
        if copy is not None:
            done.path, done.records = copy, len(records)
            done.warnings.append(f"{why}; the whole run is saved in {copy} instead")
        else:
            done.warnings.append(f"{why}; {lost} interval(s) not saved")
    if spare is not None:
        done.warnings.append(f"the job's timing records that {run_dir.timing_dir} could not "
                             f"take are in {spare} (copy them out: /dev/shm does not survive "
                             "a restart)")
    recorder.close()
    return done


def _spare_timing_dir() -> str | None:
    """Where the job puts its timing files should the run directory fail them (NOTE
    [spare timing folder] in iolens/training/_hooks.py): in memory, where a full or
    read-only disk cannot reach it; None when no such place takes writes.

    Only the name is chosen here, one nobody can guess (it is passed in the job's
    environment, which only its user can read); the job makes the folder when it first
    needs it, so a run that never needed it (the usual case) leaves nothing behind, even
    when iolens is killed.
    """
    for base in ("/dev/shm", tempfile.gettempdir()):
        if os.path.isdir(base) and os.access(base, os.W_OK | os.X_OK):
            return os.path.join(base, f"iolens-timing-{secrets.token_hex(8)}")
    return None


def _take_spare(spare: str | None, dest: str) -> tuple[int, str | None]:
    """Add the files in ``spare`` to ``dest`` and remove it: (how many files, None); with
    (0, ``spare``) when ``dest`` does not take them (the spare folder stays as it is).

    A ``<pid>.bin`` there continues the one in ``dest`` (the job moved when that
    one failed), so it is appended; a status file replaces its namesake.
    """
    if spare is None:
        return 0, None
    try:
        names = sorted(os.listdir(spare))
    except OSError:
        return 0, None
    if not names:
        shutil.rmtree(spare, ignore_errors=True)
        return 0, None
    try:
        _add_files(spare, names, dest)
    except OSError:
        return 0, spare
    shutil.rmtree(spare, ignore_errors=True)
    return len(names), None


def _add_files(src: str, names: list[str], dest: str) -> None:
    """Append each ``.bin`` file of ``src`` to its namesake in ``dest``, replace the others;
    never through a link. Each file leaves ``src`` once added, and an append that fails
    part way is cut back, so that a later attempt adds nothing twice."""
    os.makedirs(dest, exist_ok=True)
    if os.path.islink(dest):
        raise OSError(f"{dest} is a symbolic link")
    for name in names:
        source, target = os.path.join(src, name), os.path.join(dest, name)
        if not name.endswith(".bin"):
            with open(source, "rb") as fh:
                write_atomic(target, fh.read())  # a status file: a few hundred bytes
            os.unlink(source)
            continue
        fd = open_append(target)
        try:
            size = os.fstat(fd).st_size
            try:
                with open(source, "rb") as fh:
                    while chunk := fh.read(1 << 20):
                        append_whole(fd, chunk, os.fstat(fd).st_size)
            except OSError:
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, size)
                raise
        finally:
            os.close(fd)
        os.unlink(source)


def _save_elsewhere(origin: str, records: list[dict[str, Any]], meta: dict[str, Any],
                    why: str | None, dropped: int, *,
                    spare: str | None = None) -> tuple[str | None, str | None]:
    """Write every record and the final meta.json to a new temporary folder, with the
    timing files of ``spare``: (its path or None when that fails too, the spare folder
    if it is still there)."""
    try:
        path = tempfile.mkdtemp(prefix="iolens-run-")
    except OSError:
        return None, spare
    try:
        copy = RunDir(path)
    except OSError:
        shutil.rmtree(path, ignore_errors=True)
        return None, spare
    for rec in records:
        copy.append(rec)
    copy.close()
    if copy.lost_lines:  # this disk is full too: the copy would hold less than the original
        shutil.rmtree(path, ignore_errors=True)
        return None, spare
    moved, spare = _take_spare(spare, copy.timing_dir)
    note = (f"saved here because {origin} could not hold the run ({why}); the training's "
            "raw timing files written before that stay there"
            + (f", those written after it are here ({moved} file(s))" if moved else ""))
    meta = {**meta, "saved_from": origin, "records": copy.lines, "lost_records": dropped,
            "write_error": None, "notes": [*meta.get("notes", []), note]}
    copy.write_meta(meta)  # without it the records still read; the caller warns of the spare
    return path, spare


def _seq(rec: dict[str, Any]) -> int:
    seq = rec.get("seq")
    return seq if isinstance(seq, int) else 0


def _timing_status(directory: str | None) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if directory is None:
        return out
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return out
    for name in names:
        if name.endswith(".json") and not name.startswith((".", "loader-")):
            try:
                with open(os.path.join(directory, name)) as fh:
                    out.append(json.load(fh))
            except (OSError, ValueError):
                continue
    return out


def _finished_records(run_path: str, unsaved: list[dict[str, Any]]
                      ) -> tuple[list[dict[str, Any]], RunView | None]:
    """The records the end of a run sums and judges, and, for a long run, its view.

    NOTE [a long run's end]: the summary and the verdict at the end of ``iolens run``
    read the run's records. A long run's (above LONG_RUN_RECORDS intervals, 14 hours at
    1 s) are read as `iolens report` reads them, in buckets from the rollups the recorder
    wrote: a tenth of a week's records read one by one took 9.4 s and 1.1 GB here, so the
    whole week would have taken minutes and about 10 GB, after the job had ended, beside
    whatever else the machine runs. The verdict is then the report's. Records the run
    directory could not take (``unsaved``) are read one by one, with the rest."""
    if not unsaved:
        path = os.path.join(run_path, RECORDS)
        try:
            long = estimate_records(path)[0] > LONG_RUN_RECORDS
        except (OSError, ValueError):
            long = False
        if long:
            try:
                data = load_run(run_path, max_records=LONG_RUN_RECORDS)
            except IolensError:
                return [], None
            return data.records, data.view
    return sorted(read_records(run_path) + unsaved, key=_seq), None


def read_records(run_path: str) -> list[dict[str, Any]]:
    """Every complete, parseable line of a run's records (a torn last line is skipped)."""
    out = []
    try:
        with open(os.path.join(run_path, RECORDS), "rb") as fh:
            for line in fh:
                try:
                    out.append(json.loads(line))
                except ValueError:
                    continue
    except OSError:
        pass
    return out
