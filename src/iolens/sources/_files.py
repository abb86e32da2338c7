"""Cheap repeated reads of small kernel files.

A sampler reads the same few files every interval. Opening a file costs a
path walk and a file object; :class:`PreadFile` opens once and re-reads with
``os.pread`` at offset 0, which procfs (seq_file) and sysfs (kernfs) answer
with freshly generated text.
"""

from __future__ import annotations

import contextlib
import os

from iolens._errors import StatsUnavailableError

# Larger than /proc/diskstats on a machine with a few hundred devices; the
# loop in read() handles anything longer.
_CHUNK = 65536


class PreadFile:
    """A kernel text file kept open and re-read from offset 0 on each call.

    ``read()`` raises :class:`StatsUnavailableError` when the file cannot be
    opened or read. A read that fails on a descriptor that was open (the
    device behind a sysfs file vanished, for instance) closes it, so the next
    call tries a fresh open.
    """

    __slots__ = ("_fd", "path")

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = None

    def read(self) -> str:
        """Return the file's whole current text."""
        try:
            if self._fd is None:
                self._fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
            data = os.pread(self._fd, _CHUNK, 0)
            if len(data) == _CHUNK:
                parts = [data]
                offset = _CHUNK
                while True:
                    more = os.pread(self._fd, _CHUNK, offset)
                    if not more:
                        break
                    parts.append(more)
                    offset += len(more)
                data = b"".join(parts)
        except OSError as exc:
            self.close()
            raise StatsUnavailableError(self.path, exc.strerror or str(exc)) from exc
        return data.decode("ascii", "replace")

    def close(self) -> None:
        """Close the descriptor; safe to call more than once."""
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    def __del__(self) -> None:
        self.close()


def read_text(path: str) -> str:
    """Read a small file once, raising :class:`StatsUnavailableError` on failure."""
    try:
        with open(path, encoding="ascii", errors="replace") as fh:
            return fh.read()
    except OSError as exc:
        raise StatsUnavailableError(path, exc.strerror or str(exc)) from exc
