"""The run directory: ``meta.json`` plus one JSON line per interval in ``records.jsonl``.

The format's one home, at the bottom of the house: it imports nothing of
iolens outside this package, and everything that writes or reads a run (the
training side in the job's processes, the recorder, the sinks, the analysis)
imports it. The binary timing records of ``timing/<pid>.bin`` are
:mod:`iolens.rundir.records`, the rollups beside records.jsonl
:mod:`iolens.rundir.rollup`; the record schema is SCHEMA_VERSION
(:mod:`iolens.rundir.schema`: 2 adds ``train.pipeline`` and ``storage``; 3
adds the network peers to ``storage``, keyed ``IP:PORT``, with
``connections``, ``new_connections_s``, ``rx_bytes_s`` and a local server's
``server_cpu_pct`` and ``server_read_bytes_s``, and a FUSE daemon's
``daemon_read_bytes_s``; older runs read as before).

Each line is written with a single ``write`` on an O_APPEND descriptor, so
a run killed at any moment leaves a file every complete line of which
parses. A write that fails (full disk, read-only filesystem) is counted
and the sampling goes on; the job never sees the failure.

NOTE [no writes through links]: a run directory may sit where others can
write (a shared scratch folder, an --out that exists). A file appended to
(records.jsonl, timing/<pid>.bin) is opened with O_NOFOLLOW and O_NONBLOCK
and must turn out a regular file with one link; anything else in its place
(a symlink planted towards a victim file, a dangling one, a hard link, a
FIFO) is never written through but replaced, atomically, by a new file: a
temporary file created with O_EXCL beside it, renamed over it. A file
rewritten whole (meta.json, timing/<pid>.json) is always such a new file.
Files are created with mode 0666 and directories 0777, so the user's umask
alone decides who may read them.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import stat
import time
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from iolens.rundir import rollup
from iolens.rundir.schema import SCHEMA_VERSION as SCHEMA_VERSION

RECORDS = "records.jsonl"
META = "meta.json"
STORAGE_PROBE = "storage_probe.json"
"""``iolens probe --storage PATH --run DIR`` writes its result here; the verdict reads it."""


def default_run_dir(base: str, command: list[str]) -> str:
    """``<base>/<YYYYmmdd-HHMMSS>-<program>``, made unique with a suffix, and created.

    The directory is made here with a ``mkdir`` that fails when the name is
    taken, and the next suffix is tried, so two runs started in the same
    second never share a folder (a check with ``exists`` and then a
    ``makedirs(exist_ok=True)`` would let both in). Where it cannot be made
    for another reason (no such base, no permission), the first name is
    returned uncreated and the caller's own attempt reports why.
    """
    prog = os.path.basename(command[0]) if command else "run"
    if prog.startswith("python") and len(command) > 1:
        script = next((a for a in command[1:] if not a.startswith("-")), "")
        prog = os.path.splitext(os.path.basename(script))[0] or prog
    prog = re.sub(r"[^A-Za-z0-9_.-]+", "_", prog)[:40] or "run"
    stamp = time.strftime("%Y%m%d-%H%M%S")
    first = os.path.join(base, f"{stamp}-{prog}")
    with contextlib.suppress(OSError):
        os.makedirs(base, exist_ok=True)
    for n in range(1, 10_000):
        path = first if n == 1 else f"{first}-{n}"
        try:
            os.mkdir(path)
        except FileExistsError:
            continue
        except OSError:
            return first
        return path
    return first


def _new_temp(path: str, extra_flags: int = 0) -> tuple[int, str]:
    """A new, empty file beside ``path`` that nobody else can have planted (O_EXCL)."""
    folder, name = os.path.split(path)
    for _ in range(100):
        tmp = os.path.join(folder, f".{name}.{os.urandom(4).hex()}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
                         | extra_flags, 0o666)
        except FileExistsError:
            continue
        return fd, tmp
    raise FileExistsError(errno.EEXIST, "no free temporary name", path)


def replace_with_new(path: str, extra_flags: int = 0) -> int:
    """A new, empty file put in place of whatever is at ``path``; its descriptor for writing.

    Whatever was there (a file, a symlink, a FIFO) is replaced by a rename,
    never opened: see NOTE [no writes through links].
    """
    fd, tmp = _new_temp(path, extra_flags)
    try:
        os.replace(tmp, path)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return fd


def open_append(path: str) -> int:
    """``path`` for appending, created if missing, never through a link (NOTE above)."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC
    try:
        fd = os.open(path, flags | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o666)
    except OSError as exc:
        # ELOOP: a symlink; ENXIO: a FIFO nobody reads; EISDIR and the like are real errors.
        if exc.errno not in (errno.ELOOP, errno.ENXIO, errno.EWOULDBLOCK):
            raise
        return replace_with_new(path, os.O_APPEND)
    st = os.fstat(fd)
    if stat.S_ISREG(st.st_mode) and st.st_nlink == 1:
        os.set_blocking(fd, True)
        return fd
    os.close(fd)  # a FIFO someone reads, a device, a hard link to another name
    return replace_with_new(path, os.O_APPEND)


def append_whole(fd: int, data: bytes, size: int) -> None:
    """Append ``data`` to ``fd`` (a file now ``size`` bytes long) with one write, whole or
    not at all: whatever part of a failed or short write (a disk filling up) got in is
    cut back, so that every line or record in the file stays whole and what a later
    write appends starts on a boundary. OSError says why it failed."""
    try:
        written = os.write(fd, data)
        if written != len(data):
            raise OSError(errno.ENOSPC, "No space left on device (short write)")
    except OSError:
        with contextlib.suppress(OSError):  # (a pipe cannot be cut back: nothing to do)
            os.ftruncate(fd, size)
        raise


def write_atomic(path: str, data: bytes | Iterable[bytes]) -> None:
    """Replace ``path`` with a file holding ``data`` (or its pieces, one after another): a
    new file renamed over it (NOTE above)."""
    fd, tmp = _new_temp(path)
    try:
        with os.fdopen(fd, "wb") as fh:
            if isinstance(data, bytes):
                fh.write(data)
            else:
                fh.writelines(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def rfc3339(t: float) -> str:
    """A wall-clock time as RFC 3339 with the local offset."""
    return datetime.fromtimestamp(t).astimezone().isoformat(timespec="milliseconds")


def replace_rollups(path: str, lines: dict[float, list[bytes]]) -> None:
    """Put each slot length's rollup lines (rebuilt from records.jsonl: NOTE [rollups
    rebuilt] in iolens/analysis/rebuild.py) in place of its file in the run directory
    ``path``, each file whole or not at all; OSError when one cannot be."""
    for slot_s, data in lines.items():
        write_atomic(os.path.join(path, rollup.rollups_file(slot_s)), data)  # (not joined: 170 MB)


class RunDir:
    """Creates and writes one run directory."""

    def __init__(self, path: str) -> None:
        self.path = path
        os.makedirs(path, exist_ok=True)
        self._fd: int | None = open_append(os.path.join(path, RECORDS))
        self._size = os.fstat(self._fd).st_size
        self.lines = 0
        self.lost_lines = 0
        self.write_error: str | None = None
        self._rollups: list[tuple[rollup.Rollups, int]] = []
        """Each slot length's fold and its file (NOTE [rollups] in iolens/rundir/rollup.py)."""
        self._rsize: dict[int, int] = {}
        self._parse = rollup.loads()
        if self._size == 0:  # (rollups describe a records.jsonl from its first byte)
            try:
                for slot_s in rollup.ROLLUP_LEVELS:
                    fd = replace_with_new(os.path.join(path, rollup.rollups_file(slot_s)),
                                          os.O_APPEND)
                    self._rollups.append((rollup.Rollups(slot_s), fd))
                    self._rsize[fd] = 0
            except OSError:
                self._stop_rollups()  # the report folds the records themselves

    @property
    def timing_dir(self) -> str:
        """Where the training processes append their timing records."""
        return os.path.join(self.path, "timing")

    def append(self, record: dict[str, Any]) -> bool:
        """Write one record as one line; False (and counted) when it could not be written."""
        line = (json.dumps(record, separators=(",", ":"), allow_nan=False) + "\n").encode()
        if self._fd is None:
            self.lost_lines += 1
            return False
        try:
            append_whole(self._fd, line, self._size)
        except OSError as exc:
            self.lost_lines += 1
            self.write_error = f"cannot write {RECORDS}: {exc.strerror or exc}"
            return False
        self._size += len(line)
        self.lines += 1
        if self._rollups:
            try:
                rec = self._parse(line)
                for fold, fd in self._rollups:
                    self._write_rollup(fd, fold.add(rec, line, self._size))
            except Exception:  # noqa: BLE001 - a rollup never costs a record
                self._stop_rollups()
        return True

    def _write_rollup(self, fd: int, data: bytes | None) -> None:
        """Append one rollup line (NOTE [rollups] in iolens/rundir/rollup.py); OSError when
        it cannot be, and then those written stand, and the records after them are read
        from records.jsonl."""
        if data is not None:
            append_whole(fd, data, self._rsize[fd])
            self._rsize[fd] += len(data)

    def _stop_rollups(self) -> None:
        self._rollups = []
        for fd in self._rsize:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._rsize = {}

    def write_meta(self, meta: dict[str, Any]) -> bool:
        """Replace meta.json atomically; False when it could not be written."""
        try:
            data = json.dumps(meta, indent=2, allow_nan=False) + "\n"
            write_atomic(os.path.join(self.path, META), data.encode())
            return True
        except OSError as exc:
            self.write_error = self.write_error or f"cannot write {META}: {exc.strerror or exc}"
            return False

    def close(self) -> None:
        """Close the records file (and write the last rollup); safe to call twice."""
        with contextlib.suppress(Exception):  # (it can only be missing: NOTE [rollups])
            for fold, rfd in self._rollups:
                self._write_rollup(rfd, fold.line())
        self._stop_rollups()
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
