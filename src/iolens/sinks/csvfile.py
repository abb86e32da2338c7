"""``iolens run --csv FILE``: one row per interval record, under one fixed header.

Columns (the records' own figures and units, flattened):

- ``time`` (RFC 3339), ``t`` (Unix epoch seconds), ``elapsed_s``, ``interval_s``, ``seq``;
- per device, ``<dev>.r_s``, ``.rkB_s``, ``.r_await``, ``.rareq_sz``, ``.w_s``, ``.wkB_s``,
  ``.w_await``, ``.wareq_sz``, ``.aqu_sz``, ``.util`` (the iostat -x figures);
- the job's process tree, ``job.pids``, ``job.read_bytes_s`` ... ``job.cpu_pct``, and the
  same per role: ``job.main.*``, ``job.worker.*``, ``job.other.*``;
- ``cpu.user`` ... ``cpu.steal`` (percent of all CPUs), ``mem.*_bytes``;
- ``train.batches``, ``train.epochs_started``, ``train.data_wait_share`` and the data wait's
  and step time's sum, p50, p95 and max in seconds;
- per GPU, ``gpu<i>.util_pct``, ``gpu<i>.mem_util_pct``, ``gpu<i>.mem_used_bytes``.

An empty cell is a figure the interval does not have.

NOTE [stable header]: the header is written once, with the first record:
the devices watched from the start (the current directory's, each --path's
and --device) and any in that first record, and the GPUs it has. A device
found later (the job opens files on another disk) gets no column, since a
CSV cannot grow one; meta.json notes it once (records.jsonl has its
figures), and naming its path with --path gives it a column from the start.

Each row is written with one ``write`` and cut back if the write fails, so
the file holds whole rows only. FILE gets mode 0666 less the umask when it
is made, and is never written through a link (see :func:`_open_csv`).
"""

from __future__ import annotations

import contextlib
import csv
import errno
import io
import os
import stat
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from iolens.rundir import append_whole, replace_with_new
from iolens.sinks.base import SinkError

BASE_COLUMNS = ("time", "t", "elapsed_s", "interval_s", "seq")
DEVICE_FIELDS = ("r_s", "rkB_s", "r_await", "rareq_sz", "w_s", "wkB_s", "w_await", "wareq_sz",
                 "aqu_sz", "util")
JOB_FIELDS = ("pids", "read_bytes_s", "write_bytes_s", "rchar_s", "wchar_s", "cache_hit",
              "cpu_pct")
ROLES = ("main", "worker", "other")
CPU_FIELDS = ("user", "system", "iowait", "idle", "steal")
MEM_FIELDS = ("cached_bytes", "dirty_bytes", "writeback_bytes", "available_bytes")
TRAIN_FIELDS = ("batches", "epochs_started", "data_wait_share")
DIST_FIELDS = ("sum_s", "p50_s", "p95_s", "max_s")
GPU_FIELDS = ("util_pct", "mem_util_pct", "mem_used_bytes")


def header(devices: Sequence[str], gpus: Sequence[int]) -> list[str]:
    """The columns for these devices and GPU indexes, in order."""
    cols = list(BASE_COLUMNS)
    for d in devices:
        cols += [f"{d}.{f}" for f in DEVICE_FIELDS]
    cols += [f"job.{f}" for f in JOB_FIELDS]
    for role in ROLES:
        cols += [f"job.{role}.{f}" for f in JOB_FIELDS]
    cols += [f"cpu.{f}" for f in CPU_FIELDS]
    cols += [f"mem.{f}" for f in MEM_FIELDS]
    cols += [f"train.{f}" for f in TRAIN_FIELDS]
    for part in ("data_wait", "step"):
        cols += [f"train.{part}_{f}" for f in DIST_FIELDS]
    for i in gpus:
        cols += [f"gpu{i}.{f}" for f in GPU_FIELDS]
    return cols


def _cell(value: Any) -> Any:
    if value is None or isinstance(value, dict | list):
        return ""
    return value


def row(record: Mapping[str, Any], devices: Sequence[str], gpus: Sequence[int]) -> list[Any]:
    """One record's cells, in :func:`header`'s order."""
    cells: list[Any] = [record.get(c) for c in BASE_COLUMNS]
    devs = record.get("devices") or {}
    for d in devices:
        figures = devs.get(d) or {}
        cells += [figures.get(f) for f in DEVICE_FIELDS]
    job = record.get("job") or {}
    cells += [job.get(f) for f in JOB_FIELDS]
    roles = job.get("roles") or {}
    for role in ROLES:
        figures = roles.get(role) or {}
        cells += [figures.get(f) for f in JOB_FIELDS]
    cpu = record.get("cpu") or {}
    cells += [cpu.get(f) for f in CPU_FIELDS]
    mem = record.get("mem") or {}
    cells += [mem.get(f) for f in MEM_FIELDS]
    train = record.get("train") or {}
    cells += [train.get(f) for f in TRAIN_FIELDS]
    for part in ("data_wait", "step"):
        dist = train.get(part) or {}
        cells += [dist.get(f) for f in DIST_FIELDS]
    by_index = {g.get("index"): g for g in record.get("gpu") or ()}
    for i in gpus:
        g = by_index.get(i) or {}
        cells += [g.get(f) for f in GPU_FIELDS]
    return [_cell(c) for c in cells]


def _open_csv(path: str) -> int:
    """``path`` emptied for writing, never through a link; SinkError says why not.

    NOTE [no writes through links] in iolens/rundir/__init__.py: a symlink
    to a file is refused (it may have been planted towards another file; the
    user names the file itself); a file with other hard links is replaced by
    a new one, so the other names keep their content. A stream the user names
    (a pipe, a terminal, /dev/stdout, /dev/fd/N, /dev/null), directly or
    through a link, is written as it is: no file's content is at stake. It
    stays non-blocking, so a reader that stalls costs the CSV, never the
    recorder.
    """
    with contextlib.suppress(OSError):
        st = os.stat(path)
        if stat.S_ISFIFO(st.st_mode) or stat.S_ISCHR(st.st_mode):
            try:
                return os.open(path, os.O_WRONLY | os.O_CLOEXEC | os.O_NONBLOCK)
            except OSError as exc:
                why = ("a pipe nobody reads" if exc.errno == errno.ENXIO
                       else exc.strerror or str(exc))
                raise SinkError(f"--csv {path}: {why}") from None
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
                     | os.O_NONBLOCK, 0o666)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise SinkError(f"--csv {path} is a symbolic link (to {_target(path)}); iolens "
                            "writes no file through a link: give the file's own path") from None
        if exc.errno in (errno.ENXIO, errno.EWOULDBLOCK):
            raise SinkError(f"--csv {path} is not a regular file") from None
        raise SinkError(f"--csv {path}: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise SinkError(f"--csv {path} is not a regular file")
        if st.st_nlink == 1:
            os.ftruncate(fd, 0)
            os.set_blocking(fd, True)
            return fd
    except OSError as exc:
        os.close(fd)
        raise SinkError(f"--csv {path}: {exc.strerror or exc}") from None
    except SinkError:
        os.close(fd)
        raise
    os.close(fd)
    try:
        return replace_with_new(path)
    except OSError as exc:
        raise SinkError(f"--csv {path}: {exc.strerror or exc}") from None


def _target(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return "?"


class CsvSink:
    """Writes the records of a run as CSV rows; see the module's NOTE [stable header]."""

    def __init__(self, path: str, devices: Sequence[str],
                 note: Callable[[str], None] | None = None) -> None:
        """Create (or replace) ``path`` now; SinkError when it cannot be (a usage error).

        ``devices``: those watched from the start; ``note`` is told once about each
        device found later."""
        self.path = path
        self.note = note
        self._fd: int | None = _open_csv(path)
        self._size = 0
        self._devices = list(dict.fromkeys(devices))
        self._gpus: list[int] = []
        self._started = False
        self._unlisted: set[str] = set()
        self.rows = 0

    @property
    def columns(self) -> list[str]:
        """The header (final once the first record is written)."""
        return header(self._devices, self._gpus)

    def write(self, record: Mapping[str, Any]) -> None:
        """Append one row (the header first); OSError when the file cannot take it."""
        if not self._started:
            for d in record.get("devices") or {}:
                if d not in self._devices:
                    self._devices.append(d)
            self._gpus = sorted(g["index"] for g in record.get("gpu") or ()
                                if isinstance(g.get("index"), int))
            self._append([self.columns])
            self._started = True
        for d in record.get("devices") or {}:
            if d not in self._devices and d not in self._unlisted:
                self._unlisted.add(d)
                if self.note is not None:
                    self.note(f"--csv {self.path}: device {d} was found during the run and has "
                              f"no column (records.jsonl has it; --path or --device gives it "
                              f"one from the start)")
        self._append([row(record, self._devices, self._gpus)])
        self.rows += 1

    def _append(self, rows: list[list[Any]]) -> None:
        if self._fd is None:
            raise OSError(f"{self.path} is closed")
        buf = io.StringIO()
        csv.writer(buf, lineterminator="\n").writerows(rows)
        data = buf.getvalue().encode()
        try:
            append_whole(self._fd, data, self._size)  # every line stays whole
        except OSError as exc:
            if exc.filename is None:
                raise OSError(exc.errno, exc.strerror, self.path) from None
            raise
        self._size += len(data)

    def close(self) -> None:
        """Write the header if no record came, and close; safe to call twice."""
        if self._fd is None:
            return
        try:
            if not self._started:
                self._started = True
                self._append([self.columns])
        finally:
            fd, self._fd = self._fd, None
            os.close(fd)
