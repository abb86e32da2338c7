"""The Python API for those who prefer code to ``iolens run``.

    with iolens.monitor(out="runs/today", interval=1.0, paths=["/data"]):
        train()                               # DataLoaders are timed as under `iolens run`

    loader = iolens.instrument(loader)        # time one loader (any iterable) explicitly
    iolens.step()                             # mark a step in a loop without a DataLoader

    logger = iolens.log_disk_usage("io.log")  # the seed script's log lines, from a thread
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import json
import os
import select
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from types import TracebackType
from typing import IO, Any, Generic, TypeVar

from iolens._errors import IolensError, StatsUnavailableError, UnknownDeviceError
from iolens.core.rates import MAX_INTERVAL_S, MIN_INTERVAL_S, device_rates, interval_cs
from iolens.rundir import META, RECORDS, default_run_dir
from iolens.sources.devmap import device_for_path
from iolens.sources.disk import DiskSampler
from iolens.training import _hooks

T = TypeVar("T")

_STOP_GRACE_S = 10.0
_READY_TIMEOUT_S = 10.0


class Monitor:
    """A recording of this process (and its children) by a sidecar process.

    Use it as a context manager, or call :meth:`start` and :meth:`stop`. The
    sidecar writes the same run directory as ``iolens run``; ``iolens
    report`` reads either. Under ``iolens run`` (which already records this
    process) a monitor records nothing of its own and says so.
    """

    def __init__(self, out: str | os.PathLike[str] | None = None, interval: float = 1.0,
                 paths: Sequence[str | os.PathLike[str]] = (), devices: Sequence[str] = (), *,
                 instrument: bool = True, quiet: bool = False, mlflow: bool = False,
                 wandb: bool = False, settings: Mapping[str, Any] | None = None,
                 set_loaders: Sequence[str] = (), autotune: bool = False) -> None:
        if not MIN_INTERVAL_S <= interval <= MAX_INTERVAL_S:
            raise ValueError(f"interval must be between {MIN_INTERVAL_S:g} and "
                             f"{MAX_INTERVAL_S:g} seconds, not {interval!r}")
        self.interval = float(interval)
        self.paths = [os.fspath(p) for p in paths]
        self.devices = list(devices)
        self.instrument = instrument
        self.quiet = quiet
        self.mlflow = mlflow
        self.wandb = wandb
        from iolens.training import overrides  # noqa: PLC0415

        try:
            self.settings = overrides.parse(f"{k}={overrides.text(v)}"
                                            for k, v in dict(settings or {}).items())
        except overrides.SetError as exc:
            raise ValueError(f"monitor(set=...): {str(exc).removeprefix('--set ')}") from None
        """The DataLoader settings given (iolens.training.overrides), checked."""
        if self.settings and not instrument:
            raise ValueError("set= works through the DataLoader's instrumentation: not with "
                             "instrument=False")
        if autotune and not instrument:
            raise ValueError("autotune=True works through the DataLoader's instrumentation: "
                             "not with instrument=False")
        self.autotune = bool(autotune)
        self.set_loaders = ([set_loaders] if isinstance(set_loaders, str)
                            else [str(n) for n in set_loaders])
        self._out = os.fspath(out) if out is not None else None
        self.run_dir: str | None = None
        """Where the run is recorded; set by :meth:`start`."""
        self.summary: dict[str, Any] | None = None
        """The run's summary, once stopped."""
        self.active = False
        self._proc: subprocess.Popen[bytes] | None = None
        self._fork_hook_fd: int | None = None

    # -- lifetime ---------------------------------------------------------------

    def start(self) -> Monitor:
        """Start the sidecar and the DataLoader timing; returns self."""
        if self.active:
            return self
        outer = os.environ.get("IOLENS_RUN_DIR")
        current = _hooks.writer()
        if outer or current is not None:
            # Under iolens run (even with --no-instrument) or inside another monitor():
            # one recording per process.
            where = outer or (os.path.dirname(current.directory) if current else "")
            self.run_dir = where
            by = "iolens run" if outer else "another monitor()"
            self._say(f"this process is already recorded by {by} into {where}; "
                      "monitor() adds nothing")
            return self
        argv = sys.argv if sys.argv and sys.argv[0] else [sys.executable]
        path = self._out or default_run_dir("iolens-runs", [sys.executable, *argv[:1]])
        if _holds_run(path):
            # Never mixed into the run already there (its verdict would span both), nor
            # refused: an exception here would stop the training. A fresh folder beside.
            taken = path
            path = _beside(path)
            self._say(f"{taken} already holds a run; recording to {path} instead")
        try:
            os.makedirs(path, exist_ok=True)
        except OSError as exc:
            # NOTE [never hurt the job]: an unwritable out must not stop the training.
            fallback = tempfile.mkdtemp(prefix="iolens-run-")
            self._say(f"cannot create {path} ({exc.strerror or exc}); recording to {fallback}")
            path = fallback
        self.run_dir = os.path.abspath(path)
        cmd = [sys.executable, "-m", "iolens.job.sidecar", "--pid", str(os.getpid()),
               "--out", self.run_dir, "--interval", str(self.interval)]
        for p in self.paths:
            cmd += ["--path", p]
        for d in self.devices:
            cmd += ["--device", d]
        if not self.instrument:
            cmd.append("--no-instrument")
        if self.mlflow:
            cmd.append("--mlflow")
        if self.wandb:
            cmd.append("--wandb")
        if self.autotune:
            cmd.append("--autotune")
        if self.settings:
            from iolens.training import overrides  # noqa: PLC0415

            cmd += ["--set", overrides.to_env(self.settings, self.set_loaders)]
        for a in [sys.executable, *argv]:
            cmd += ["--command", a]
        env = dict(os.environ)
        pkg_parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env["PYTHONPATH"] = pkg_parent + (os.pathsep + env["PYTHONPATH"]
                                          if env.get("PYTHONPATH") else "")
        env.pop("IOLENS_RUN_DIR", None)
        # The job's own W&B service (its wandb.init() set this): the sidecar's client
        # starts one of its own, which ends with the sidecar, not with the job's run.
        env.pop("WANDB_SERVICE", None)
        try:
            self._proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                          env=env, close_fds=True)
        except OSError as exc:
            self._say(f"cannot start the monitor ({exc.strerror or exc}); not recording")
            return self
        _forget_in_children(self._proc)
        if not _wait_ready(self._proc, _READY_TIMEOUT_S):
            code = self._proc.poll()
            if code is not None:
                self._say(f"the monitor failed to start (exit code {code}); not recording")
                self._proc = None
                return self
            self._say("the monitor is slow to start; recording begins when it is ready")
        if self.instrument:
            flush_ms = max(50, min(1000, int(self.interval * 250)))
            _hooks.start(os.path.join(self.run_dir, "timing"), flush_ms * 1_000_000)
            _hooks.set_errors_raise = True
            _hooks.use_settings(self.settings, self.set_loaders)
            if self.autotune:
                from iolens.training.autotune import FOLDER  # noqa: PLC0415

                _hooks.use_autotune(os.path.join(self.run_dir, FOLDER), self.quiet)
            _hooks.install_import_hook()
        # NOTE [never hurt the job]: iolens' own import leaves some 30,000 new objects
        # waiting for the garbage collector's oldest generation. Left there, the job's
        # first forked DataLoader workers each ran that full collection themselves (0.1 s
        # of CPU and 12,000 copy-on-write page faults a worker, measured with torch 2.13),
        # where a worker forked without iolens ran none. One collection here, once.
        gc.collect()
        self.active = True
        atexit.register(self._stop_at_exit)
        self._say(f"recording to {self.run_dir} every {self.interval:g} s")
        return self

    def stop(self) -> dict[str, Any] | None:
        """End the recording, print the summary; returns it (None when nothing was recorded)."""
        if not self.active:
            return self.summary
        self.active = False
        with contextlib.suppress(Exception):
            atexit.unregister(self._stop_at_exit)
        if self.instrument:
            _hooks.use_settings({}, [])
            if self.autotune:
                _hooks.use_autotune(None)
            _hooks.stop()
        proc = self._proc
        if proc is not None:
            with contextlib.suppress(OSError, ValueError):
                if proc.stdin is not None:
                    proc.stdin.write(b"stop\n")
                    proc.stdin.close()
            try:
                proc.wait(timeout=_STOP_GRACE_S + 3 * self.interval)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                self._say("the monitor did not finish in time and was stopped; "
                          "its records are kept")
        self.summary = self._read_summary()
        if self.summary is not None and self.run_dir is not None:
            from iolens.job.run import end_lines  # noqa: PLC0415 - at the end only

            self._say(f"run directory {self.run_dir}")
            for line in end_lines(self.run_dir, self.summary):
                self._say(line)
        return self.summary

    def _stop_at_exit(self) -> None:
        with contextlib.suppress(Exception):
            self.stop()

    def __enter__(self) -> Monitor:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    # -- helpers -----------------------------------------------------------------

    def _read_summary(self) -> dict[str, Any] | None:
        if self.run_dir is None:
            return None
        try:
            with open(os.path.join(self.run_dir, META)) as fh:
                summary = json.load(fh).get("summary")
        except (OSError, ValueError, AttributeError):
            return None
        return summary if isinstance(summary, dict) else None

    def _say(self, msg: str) -> None:
        if not self.quiet:
            print(f"iolens: {msg}", file=sys.stderr, flush=True)


def _wait_ready(proc: subprocess.Popen[bytes], timeout: float) -> bool:
    """Wait for the sidecar's ``ready`` line, so the recording covers what follows start()."""
    out = proc.stdout
    if out is None:
        return False
    try:
        ready, _, _ = select.select([out], [], [], timeout)
        line = out.readline() if ready else b""
    except (OSError, ValueError):
        line = b""
    finally:
        with contextlib.suppress(OSError):
            out.close()
    return line.strip() == b"ready"


def _holds_run(path: str) -> bool:
    """Whether ``path`` holds a run already (its records; a symlink there is none)."""
    held = os.path.join(path, RECORDS)
    return os.path.isfile(held) and not os.path.islink(held)


def _beside(path: str) -> str:
    """The first of ``PATH-2``, ``PATH-3`` ... that holds no run, made now (a mkdir that
    fails when the name is taken, so two processes never share one)."""
    base = path.rstrip(os.sep) or path
    for n in range(2, 10_000):
        candidate = f"{base}-{n}"
        try:
            os.mkdir(candidate)
        except FileExistsError:
            if not _holds_run(candidate) and not os.listdir(candidate):
                return candidate
            continue
        except OSError:
            return candidate  # (the caller's makedirs reports why it cannot be made)
        return candidate
    return tempfile.mkdtemp(prefix="iolens-run-")


def _forget_in_children(proc: subprocess.Popen[bytes]) -> None:
    """Close the pipe to the sidecar in forked children (DataLoader workers).

    A worker holding a copy of the pipe would keep the sidecar from seeing
    the end of file that tells it this process died.
    """
    stdin = proc.stdin
    if stdin is None:
        return
    fd = stdin.fileno()

    def close_in_child() -> None:
        with contextlib.suppress(OSError):
            if proc.stdin is not None and not proc.stdin.closed and proc.stdin.fileno() == fd:
                os.close(fd)

    os.register_at_fork(after_in_child=close_in_child)


def monitor(out: str | os.PathLike[str] | None = None, interval: float = 1.0,
            paths: Sequence[str | os.PathLike[str]] = (), devices: Sequence[str] = (), *,
            instrument: bool = True, quiet: bool = False, mlflow: bool = False,
            wandb: bool = False, set: Mapping[str, Any] | None = None,
            set_loaders: Sequence[str] = (), autotune: bool = False) -> Monitor:
    """Record this process as ``iolens run`` would: ``with iolens.monitor(): train()``.

    ``out`` is the run directory (default ``iolens-runs/<time>-<script>``; one that
    holds a run already is left as it is, and the recording goes to ``OUT-2``, the
    first such folder free, which the first line names),
    ``interval`` the sampling period in seconds (0.05 to 60), ``paths`` the
    paths whose devices to watch besides the current directory's and those
    the job opens, ``devices`` device names to watch as well. With
    ``instrument`` (the default) every torch DataLoader is timed. With ``mlflow``
    the figures, the verdict and the report also go into MLflow, as with ``iolens run
    --mlflow`` (the script's active MLflow run, or a new one); with ``wandb``, into a W&B
    run of iolens' own, as with ``--wandb``. ``set`` gives DataLoader settings that the
    loaders made while it records take instead of their own, as ``iolens run --set``
    (``{"num_workers": 4}``; ``set_loaders``: only the loaders of these dataset classes);
    a setting iolens cannot set, or a value out of range, raises ValueError. With
    ``autotune`` iolens picks num_workers and prefetch_factor between epochs, as with
    ``iolens run --autotune`` (map-style datasets; the data and its order unchanged).
    """
    return Monitor(out, interval, paths, devices, instrument=instrument, quiet=quiet,
                   mlflow=mlflow, wandb=wandb, settings=set, set_loaders=set_loaders,
                   autotune=autotune)


class InstrumentedLoader(Generic[T]):
    """An iterable that times each ``next()`` of the loader it wraps.

    Everything else (``len()``, attributes such as ``dataset`` or
    ``batch_size``) is the wrapped loader's.
    """

    def __init__(self, loader: Iterable[T]) -> None:
        self.loader = loader

    def __iter__(self) -> Iterator[T]:
        it = iter(self.loader)
        if getattr(it, "_iolens_tag", None) is not None:
            return it  # a torch DataLoader already timed by the zero-code patch
        return _hooks.TimedIterator(self.loader, it)

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        if name == "loader":  # not yet set (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.loader, name)

    def __repr__(self) -> str:
        return f"iolens.instrument({self.loader!r})"


def instrument(loader: Iterable[T]) -> InstrumentedLoader[T]:
    """Time the batches of one loader (a torch DataLoader or any iterable).

    The figures go to the recording in progress (``iolens run`` or
    ``iolens.monitor()``); with none, the loader is passed through untimed.
    """
    if isinstance(loader, InstrumentedLoader):
        return loader
    return InstrumentedLoader(loader)


def step() -> None:
    """Mark the end of a training step, for loops that do not use a DataLoader.

    The time between marks is the step time in the records. Costs well under
    a microsecond; does nothing when no recording is in progress.
    """
    _hooks.step()


class DiskLogger:
    """A daemon thread that appends one line per device per interval to a file:

        [2026-11-30 21:40:02] Read: 12.50 MB/s, Write: 0.00 MB/s, Await: 1.20 ms, Util: 45.6%

    With several devices each line names its device after the time.
    """

    def __init__(self, file: str | os.PathLike[str] | IO[str], devices: Sequence[str],
                 interval: float, *, proc_root: str = "/proc") -> None:
        self.devices = list(devices)
        self.interval = interval
        self.error: str | None = None
        """Why the thread stopped early, if it did."""
        self.lines = 0
        self._sampler = DiskSampler(proc_root=proc_root)
        first = self._sampler.snapshot()
        missing = [d for d in self.devices if d not in first.devices]
        if missing:
            self._sampler.close()
            raise UnknownDeviceError(missing[0], first.devices)
        self._prev = first
        if isinstance(file, (str, os.PathLike)):
            self._fh: IO[str] = open(file, "a", encoding="utf-8")  # noqa: SIM115 - thread owns it
            self._owns = True
        else:
            self._fh, self._owns = file, False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="iolens-disk-logger", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.wait(self.interval):
                self._log_once()
        except Exception as exc:  # noqa: BLE001 - a logging thread must never take the job down
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            self._sampler.close()
            if self._owns:
                with contextlib.suppress(OSError):
                    self._fh.close()

    def _log_once(self) -> None:
        try:
            cur = self._sampler.snapshot()
        except StatsUnavailableError as exc:
            self.error = str(exc)
            self._stop.set()
            return
        try:
            cs = interval_cs(self._prev, cur)
        except ValueError:
            cs = 0
        stamp = datetime.now().strftime("%Y-%m-%d %H:%M:%S")
        out = []
        for dev in self.devices:
            label = f" {dev}:" if len(self.devices) > 1 else ""
            c, p = cur.devices.get(dev), self._prev.devices.get(dev)
            if c is None:
                out.append(f"[{stamp}]{label} device {dev} is gone\n")
                continue
            r = device_rates(p if p is not None else c, c, cs)
            out.append(f"[{stamp}]{label} Read: {r.rMB_s:.2f} MB/s, Write: {r.wMB_s:.2f} MB/s, "
                       f"Await: {r.await_ms:.2f} ms, Util: {r.util:.1f}%\n")
        self._prev = cur
        self._fh.write("".join(out))
        self._fh.flush()
        self.lines += len(out)

    def stop(self) -> None:
        """Stop the thread and close the file; safe to call twice."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.interval + 5)

    def __enter__(self) -> DiskLogger:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def log_disk_usage(file: str | os.PathLike[str] | IO[str] = "disk_usage.log",
                   devices: Sequence[str] | str | None = None, interval: float = 2.0, *,
                   path: str | os.PathLike[str] = ".", proc_root: str = "/proc") -> DiskLogger:
    """Start a daemon thread writing the seed script's log lines to ``file``.

    ``devices`` defaults to the disks serving ``path`` (the current
    directory). Returns the :class:`DiskLogger`; call ``stop()`` or use it as
    a context manager. Raises :class:`UnknownDeviceError` for a device that
    does not exist and :class:`IolensError` when ``path`` maps to no disk.
    """
    if not interval > 0:
        raise ValueError(f"interval must be a positive number of seconds, not {interval!r}")
    if isinstance(devices, str):
        devices = [devices]
    if not devices:
        mapping = device_for_path(os.fspath(path), proc_root)
        if not mapping.disks:
            raise IolensError(f"no disk serves {mapping.path}: {mapping.reason}; "
                              "name the device with devices=[...]")
        devices = mapping.disks
    return DiskLogger(file, devices, interval, proc_root=proc_root)
