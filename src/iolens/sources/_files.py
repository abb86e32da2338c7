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

# procfs (seq_file) may return as little as one page per call, whatever the
# size asked for, so read() loops until a read returns nothing.
_CHUNK = 65536
# No kernel statistics file comes near this; a larger one is not what we
# think it is (a fixture linked to /dev/zero, say) and would never end.
MAX_BYTES = 16 << 20
# seq_file stops short of the size asked only when its page-sized buffer is
# full, and its records (a diskstats line) are far shorter than half a page;
# so a first read under 2 KiB is the whole file and needs no second call.
_SURELY_WHOLE = 2048


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
            if len(data) >= _SURELY_WHOLE:
                parts = [data]
                offset = len(data)
                while True:
                    more = os.pread(self._fd, _CHUNK, offset)
                    if not more:
                        break
                    parts.append(more)
                    offset += len(more)
                    if offset > MAX_BYTES:
                        raise OSError(0, f"larger than {MAX_BYTES >> 20} MiB")
                if len(parts) > 1:
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
        with open(path, "rb") as fh:
            data = fh.read(MAX_BYTES + 1)
    except OSError as exc:
        raise StatsUnavailableError(path, exc.strerror or str(exc)) from exc
    if len(data) > MAX_BYTES:
        raise StatsUnavailableError(path, f"larger than {MAX_BYTES >> 20} MiB")
    return data.decode("ascii", "replace")


def as_bytes(text: str | bytes) -> bytes:
    """Kernel text as bytes: a str back to the bytes it was decoded from (names need not be
    UTF-8; surrogateescape round-trips them), a lone surrogate as UTF-8."""
    if isinstance(text, bytes):
        return text
    try:
        return os.fsencode(text)
    except UnicodeEncodeError:  # a lone surrogate that surrogateescape does not map
        return text.encode("utf-8", "surrogatepass")
