"""The run directory: ``meta.json`` plus one JSON line per interval in ``records.jsonl``.

Each line is written with a single ``write`` on an O_APPEND descriptor, so
a run killed at any moment leaves a file every complete line of which
parses. A write that fails (full disk, read-only filesystem) is counted
and the sampling goes on; the job never sees the failure.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from datetime import datetime
from typing import Any

SCHEMA_VERSION = 1
RECORDS = "records.jsonl"
META = "meta.json"


def default_run_dir(base: str, command: list[str]) -> str:
    """``<base>/<YYYYmmdd-HHMMSS>-<program>``, made unique with a suffix if needed."""
    prog = os.path.basename(command[0]) if command else "run"
    if prog.startswith("python") and len(command) > 1:
        script = next((a for a in command[1:] if not a.startswith("-")), "")
        prog = os.path.splitext(os.path.basename(script))[0] or prog
    prog = re.sub(r"[^A-Za-z0-9_.-]+", "_", prog)[:40] or "run"
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = os.path.join(base, f"{stamp}-{prog}")
    n = 1
    while os.path.exists(path):
        n += 1
        path = os.path.join(base, f"{stamp}-{prog}-{n}")
    return path


def rfc3339(t: float) -> str:
    """A wall-clock time as RFC 3339 with the local offset."""
    return datetime.fromtimestamp(t).astimezone().isoformat(timespec="milliseconds")


class RunDir:
    """Creates and writes one run directory."""

    def __init__(self, path: str) -> None:
        self.path = path
        os.makedirs(path, exist_ok=True)
        self._fd: int | None = os.open(
            os.path.join(path, RECORDS),
            os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
        self._size = os.fstat(self._fd).st_size
        self.lines = 0
        self.lost_lines = 0
        self.write_error: str | None = None

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
            written = os.write(self._fd, line)
            if written != len(line):
                raise OSError(28, "No space left on device (short write)")
        except OSError as exc:
            # Cut back whatever part of the line reached the file, so that every
            # line in it stays whole and parseable.
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, self._size)
            self.lost_lines += 1
            self.write_error = f"cannot write {RECORDS}: {exc.strerror or exc}"
            return False
        self._size += written
        self.lines += 1
        return True

    def write_meta(self, meta: dict[str, Any]) -> bool:
        """Replace meta.json atomically; False when it could not be written."""
        tmp = os.path.join(self.path, f".{META}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
            with os.fdopen(fd, "w") as fh:
                json.dump(meta, fh, indent=2, allow_nan=False)
                fh.write("\n")
            os.replace(tmp, os.path.join(self.path, META))
            return True
        except OSError as exc:
            self.write_error = self.write_error or f"cannot write {META}: {exc.strerror or exc}"
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            return False

    def close(self) -> None:
        """Close the records file; safe to call twice."""
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
