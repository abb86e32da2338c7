"""/proc/diskstats and /sys/block/<dev>/stat: parsers and readers."""

from __future__ import annotations

import os
from dataclasses import dataclass

from iolens.sources._files import PreadFile
from iolens.sources.counters import COUNT_MOD, TIME_MOD, DiskCounters

# Counter positions (0-based, after major, minor and name) that hold times.
_TIME_FIELDS = frozenset({3, 7, 9, 10, 14, 16})
# Token counts of a diskstats line: 14 (2.6.25-4.17), 18 (4.18+, discards),
# 20 (5.5+, flushes). Newer kernels may append more; those are ignored.
_MIN_EXTENDED_TOKENS = 14
# Partition lines of kernels before 2.6.25: major minor name + 4 counters.
_OLD_PARTITION_TOKENS = 7


@dataclass(slots=True)
class ParseResult:
    """Parsed devices and the count of lines left out, by reason.

    Every line that is not blank is a device, a skipped line or an old-format line.
    """

    devices: dict[str, DiskCounters]
    skipped_lines: int = 0
    """Lines that cannot be read, and repeats of a device name already read."""
    old_format_lines: int = 0
    """Pre-2.6.25 partition lines (7 tokens, no extended statistics)."""


def counters_from_values(major: int, minor: int, name: str, values: list[int]) -> DiskCounters:
    """Build counters from the 11, 15 or 17 (or more) values after the name.

    Values are reduced the way sysstat stores them: counts modulo 2^64, times
    modulo 2^32.
    """
    n = min(len(values), 17)
    vals = values[:17]
    if max(vals) >= TIME_MOD:  # rare: only counts past 2^32 (or bad input) need reducing
        vals = [v % (TIME_MOD if i in _TIME_FIELDS else COUNT_MOD) for i, v in enumerate(vals)]
    if n < 17:
        vals = vals + [0] * (17 - n)
    (rd_ios, rd_merges, rd_sect, rd_ms, wr_ios, wr_merges, wr_sect, wr_ms, in_flight, io_ms,
     weighted_ms, dc_ios, dc_merges, dc_sect, dc_ms, fl_ios, fl_ms) = vals
    return DiskCounters(major, minor, name, rd_ios, rd_merges, rd_sect, rd_ms, wr_ios, wr_merges,
                        wr_sect, wr_ms, in_flight, io_ms, weighted_ms, dc_ios, dc_merges, dc_sect,
                        dc_ms, fl_ios, fl_ms, fields=n)


def parse_diskstats_line(line: str) -> DiskCounters | str | None:
    """Parse one line: counters, ``None`` for a blank line, or a reason string if it is unusable.

    The reason is ``"old"`` for a 7-token partition line of numbers (no extended
    stats) and ``"malformed"`` for anything else that cannot be read.
    """
    tokens = line.split()
    if not tokens:
        return None
    n = len(tokens)
    if n != _OLD_PARTITION_TOKENS and n < _MIN_EXTENDED_TOKENS:
        return "malformed"
    # Plain ASCII digits only, checked at once: int() would also take "-1", "+1", "1_0"
    # and other scripts' digits ("١٢"), none of which the kernel prints.
    numbers = tokens[3:20]
    joined = "".join((tokens[0], tokens[1], *numbers))
    if not (joined.isascii() and joined.isdigit()):
        return "malformed"
    if n == _OLD_PARTITION_TOKENS:
        return "old"
    return counters_from_values(int(tokens[0]), int(tokens[1]), tokens[2],
                                list(map(int, numbers)))


class DiskstatsParser:
    """Parses /proc/diskstats text, reusing the record of any line seen unchanged.

    Idle devices print the same line every interval; skipping their
    conversion keeps a sample of many devices cheap.
    """

    __slots__ = ("_cache",)

    def __init__(self) -> None:
        self._cache: dict[str, DiskCounters] = {}

    def parse(self, text: str) -> ParseResult:
        """Parse the whole file's text."""
        cache = self._cache
        new_cache: dict[str, DiskCounters] = {}
        devices: dict[str, DiskCounters] = {}
        result = ParseResult(devices)
        for line in text.splitlines():
            rec = cache.get(line)
            if rec is None:
                parsed = parse_diskstats_line(line)
                if parsed is None:
                    continue
                if isinstance(parsed, str):
                    if parsed == "old":
                        result.old_format_lines += 1
                    else:
                        result.skipped_lines += 1
                    continue
                rec = parsed
            new_cache[line] = rec
            if rec.name in devices:
                # A second line for one name: not something a kernel prints, so it
                # is counted as skipped (the first stands) rather than silently lost.
                result.skipped_lines += 1
                continue
            devices[rec.name] = rec
        self._cache = new_cache
        return result


def parse_diskstats(text: str) -> ParseResult:
    """Parse /proc/diskstats text once (no cache)."""
    return DiskstatsParser().parse(text)


def parse_stat_file(name: str, text: str, major: int = 0, minor: int = 0) -> DiskCounters | None:
    """Parse a /sys/block/<dev>/stat file (11, 15 or 17 values, no name).

    Returns ``None`` when the text does not hold at least 11 non-negative integers.
    """
    tokens = text.split()[:17]
    if len(tokens) < 11:
        return None
    joined = "".join(tokens)  # plain ASCII digits only, as in parse_diskstats_line
    if not (joined.isascii() and joined.isdigit()):
        return None
    return counters_from_values(major, minor, name, [int(t) for t in tokens])


class DiskstatsReader:
    """Reads ``<proc_root>/diskstats``, keeping the file open between reads."""

    def __init__(self, proc_root: str = "/proc") -> None:
        self.path = os.path.join(proc_root, "diskstats")
        self._file = PreadFile(self.path)
        self._parser = DiskstatsParser()

    def read(self) -> ParseResult:
        """Read and parse the current counters; raises StatsUnavailableError."""
        return self._parser.parse(self._file.read())

    def close(self) -> None:
        """Release the file descriptor."""
        self._file.close()
