"""/proc/uptime: the interval clock iostat uses."""

from __future__ import annotations

import os

from iolens.sources._files import PreadFile


def _digits(text: str) -> bool:
    return text.isascii() and text.isdigit()


def parse_uptime_cs(text: str) -> int:
    """Uptime in centiseconds, read as sysstat does (``%lu.%lu``: seconds*100 + fraction digits).

    Raises ValueError on text that holds no uptime.
    """
    first = text.split(maxsplit=1)[0] if text.strip() else ""
    sec, dot, frac = first.partition(".")
    # ASCII digits only: isdigit() also takes "²" (which int() refuses) and int() takes
    # other scripts' digits ("١٢"); the kernel prints neither.
    if not _digits(sec) or (dot and not _digits(frac)):
        raise ValueError(f"not an uptime: {text[:40]!r}")
    return int(sec) * 100 + (int(frac) if frac else 0)


class UptimeReader:
    """Reads ``<proc_root>/uptime`` in centiseconds, keeping the file open."""

    def __init__(self, proc_root: str = "/proc") -> None:
        self.path = os.path.join(proc_root, "uptime")
        self._file = PreadFile(self.path)

    def read_cs(self) -> int:
        """Current uptime in centiseconds; raises StatsUnavailableError or ValueError."""
        return parse_uptime_cs(self._file.read())

    def close(self) -> None:
        """Release the file descriptor."""
        self._file.close()
