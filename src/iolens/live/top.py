"""``iolens top``: the live view of a process tree, or of the whole machine, until Ctrl-C.

Which devices it watches:

- with ``--pid``: the devices serving the process's working directory, and
  any device the process tree is found to have files open on (rescanned
  every few intervals), as ``iolens run`` does for its job;
- without ``--pid``: every whole disk that did I/O since boot, iostat's own
  default list, taken once at the start;
- in both cases also the devices serving each ``--path`` and each
  ``--device``; given any of these without ``--pid``, only those.

On a terminal the view is full screen (the alternate screen, restored on
exit); otherwise, or with ``--once``, each interval prints a plain-text
snapshot (no colour, no control codes), so the command can be piped and
scripted.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import FrameType
from typing import Any, TextIO

from iolens._errors import StatsUnavailableError
from iolens.core.devselect import select_devices
from iolens.live.history import Header, History
from iolens.live.view import LiveView, is_terminal
from iolens.recorder.sampler import Recorder
from iolens.sources.counters import DiskSnapshot
from iolens.sources.devmap import device_for_path
from iolens.sources.disk import DiskSampler
from iolens.sources.procfs import ProcessTable

_PLAIN_WIDTH = 120
"""Columns of a plain snapshot when neither COLUMNS nor the terminal says."""


@dataclass
class TopOptions:
    """What ``iolens top`` was asked to do."""

    pid: int | None = None
    interval: float = 1.0
    paths: list[str] = field(default_factory=list)
    devices: list[str] = field(default_factory=list)
    proc_root: str = "/proc"
    sys_root: str = "/sys"
    count: int | None = None
    """Stop after this many refreshes; None runs until Ctrl-C (or the process ends)."""
    once: bool = False
    """One plain snapshot after one interval, even on a terminal."""


class _Signalled(BaseException):
    """Raised by the SIGTERM/SIGHUP handler so the terminal is restored on the way out.

    A BaseException, so the recorder's NOTE [never hurt the job] handler does
    not swallow it.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def process_exists(pid: int, proc_root: str = "/proc") -> bool:
    """True if ``pid`` is a live (not zombie) process under ``proc_root``."""
    st = ProcessTable(proc_root).read_stat(pid)
    return st is not None and st.state not in ("Z", "X")


def command_line(pid: int, proc_root: str = "/proc") -> str:
    """The process's command line (its name in brackets when it has none, as ps shows)."""
    try:
        with open(os.path.join(proc_root, str(pid), "cmdline"), "rb") as fh:
            raw = fh.read(4096)
    except OSError:
        raw = b""
    args = [a.decode(errors="replace") for a in raw.split(b"\0") if a]
    if args:
        return " ".join(args)
    st = ProcessTable(proc_root).read_stat(pid)
    return f"[{st.comm}]" if st is not None else ""


def top_watch(opts: TopOptions) -> tuple[dict[str, str], list[str]]:
    """Devices to watch (device -> why) and notes; ValueError for a usage error.

    See the module's docstring for the choice.
    """
    watch: dict[str, str] = {}
    notes: list[str] = []
    if opts.pid is not None:
        try:
            cwd = os.readlink(os.path.join(opts.proc_root, str(opts.pid), "cwd"))
        except OSError as exc:
            notes.append(f"cannot read the working directory of process {opts.pid} "
                         f"({exc.strerror or exc})")
        else:
            m = device_for_path(cwd, opts.proc_root, opts.sys_root)
            if not m.disks:
                notes.append(f"process {opts.pid}'s directory {cwd}: {m.reason}")
            for disk in m.disks:
                watch.setdefault(disk, f"serves process {opts.pid}'s directory ({cwd})")
    for path in opts.paths:
        try:
            m = device_for_path(path, opts.proc_root, opts.sys_root)
        except (OSError, ValueError) as exc:
            raise ValueError(f"--path {path!r}: {getattr(exc, 'strerror', None) or exc}") from exc
        if not m.disks:
            raise ValueError(f"--path {path}: {m.reason}")
        for disk in m.disks:
            watch.setdefault(disk, f"serves --path {path} ({m.path})")
    for d in opts.devices:
        watch.setdefault(d, "--device")
    if opts.pid is None and not opts.paths and not opts.devices:
        sampler = DiskSampler(opts.proc_root, opts.sys_root)
        try:
            snap = sampler.snapshot()
            for name in select_devices(snap, DiskSnapshot.zero(), sampler.topology(snap)):
                watch[name] = "did I/O since boot"
        except StatsUnavailableError as exc:
            notes.append(f"{exc}: no device statistics on this system")
        finally:
            sampler.close()
    return watch, notes


def top(opts: TopOptions, watch: dict[str, str], notes: list[str], *,
        out: TextIO | None = None) -> int:
    """Refresh the view every interval until Ctrl-C, ``count`` refreshes or the process's end.

    Returns the exit code: 0, 1 if the view failed, 141 if the output was
    closed, 128 + N after signal N (SIGTERM, SIGHUP).
    """
    stream = out if out is not None else sys.stdout
    full_screen = is_terminal(stream) and not opts.once
    count = 1 if opts.once else opts.count
    recorder = Recorder(None, opts.pid, opts.interval, watch, proc_root=opts.proc_root,
                        sys_root=opts.sys_root, discover=opts.pid is not None)
    recorder.notes.extend(notes)
    header = Header(
        title="iolens top",
        pid=opts.pid,
        command=command_line(opts.pid, opts.proc_root) if opts.pid is not None else None,
        gpu_reason=None if recorder.gpu.available else recorder.gpu.reason,
        notes=recorder.notes,
        footer="Ctrl-C to quit" if full_screen else None,
    )
    view = LiveView(recorder.watch, header, file=stream) if full_screen else None
    history = History()
    shown = 0
    ended = closed = False

    def on_record(rec: dict[str, Any]) -> None:
        nonlocal shown, closed
        if view is not None:
            view.update(rec)
        else:
            history.add(rec)
            try:
                _print_snapshot(stream, history, recorder.watch, header)
            except BrokenPipeError:  # the recorder's loop would swallow it and go on
                closed = True
        shown += 1

    def wait(timeout: float) -> bool:
        nonlocal ended
        if closed or (count is not None and shown >= count):
            return True
        if view is not None and view.error is not None:
            return True
        if opts.pid is not None and not process_exists(opts.pid, opts.proc_root):
            ended = True
            return True
        time.sleep(timeout)
        return False

    code = 0
    try:
        with _signals_raise():
            try:
                if view is not None and not view.start():
                    print(f"iolens top: cannot draw the live view: {view.error}",
                          file=sys.stderr)
                    return 1
                recorder.loop(wait, on_record=on_record)
            except KeyboardInterrupt:
                pass  # Ctrl-C is how the view is meant to end
            finally:
                if view is not None:
                    view.stop()
    except _Signalled as sig:
        code = 128 + sig.signum
    except BrokenPipeError:
        closed = True
    finally:
        recorder.close()
    if closed:
        # The reader went away (`| head`): stop quietly, without a traceback at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())
        code = 141
    if view is not None and view.error is not None:
        print(f"iolens top: {view.error}", file=sys.stderr)
        code = code or 1
    if ended:
        print(f"iolens top: process {opts.pid} has exited", file=sys.stderr)
    return code


def _print_snapshot(stream: TextIO, history: History, watch: dict[str, str],
                    header: Header) -> None:
    from iolens.live.render import render_text  # noqa: PLC0415 - rich only when drawing

    width = shutil.get_terminal_size((_PLAIN_WIDTH, 24)).columns
    encoding = getattr(stream, "encoding", None) or "utf-8"
    stream.write(render_text(history, watch, header, width=width, encoding=encoding) + "\n")
    stream.flush()


@contextmanager
def _signals_raise() -> Iterator[None]:
    """SIGTERM and SIGHUP unwind like Ctrl-C (restoring the terminal) instead of killing."""

    def handler(signum: int, frame: FrameType | None) -> None:
        del frame
        raise _Signalled(signum)

    previous: dict[int, Any] = {}
    try:
        for s in (signal.SIGTERM, signal.SIGHUP):
            previous[s] = signal.signal(s, handler)
    except ValueError:  # not the main thread: leave the signals alone
        pass
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)
