"""Typed records of the kernel's block-device counters."""

from __future__ import annotations

from dataclasses import dataclass, field

# Count fields are `unsigned long` in the kernel and in sysstat; time fields
# are printed by the kernel as 32-bit unsigned ints on every architecture.
COUNT_MOD = 1 << 64
TIME_MOD = 1 << 32


# Records are plain (not frozen) slotted dataclasses: a frozen one costs five
# times as much to build, and a sampler builds many. Treat them as read-only.


@dataclass(slots=True)
class DiskCounters:
    """One device's cumulative counters, as in /proc/diskstats or /sys/block/*/stat.

    Fields the running kernel does not report (discards before 4.18, flushes
    before 5.5) are 0; ``fields`` says how many were present. Read-only by
    convention: parsers share one record between snapshots while its line
    is unchanged.
    """

    major: int
    """Device major number (0 when read from a sysfs stat file without ``dev``)."""
    minor: int
    """Device minor number."""
    name: str
    """Kernel name, e.g. ``sda``, ``nvme0n1p1``, ``dm-0``."""
    reads: int
    """Reads completed."""
    reads_merged: int
    """Adjacent reads merged into one before reaching the device."""
    sectors_read: int
    """512-byte sectors read."""
    read_ms: int
    """Milliseconds spent by all reads, from issue to completion (32-bit)."""
    writes: int
    """Writes completed."""
    writes_merged: int
    """Adjacent writes merged."""
    sectors_written: int
    """512-byte sectors written."""
    write_ms: int
    """Milliseconds spent by all writes (32-bit)."""
    in_flight: int
    """I/Os in flight now: a gauge, never used for rates."""
    io_ms: int
    """Milliseconds during which the device had I/O in flight (io_ticks, 32-bit)."""
    weighted_ms: int
    """Milliseconds weighted by the number of I/Os in flight (time_in_queue, 32-bit)."""
    discards: int = 0
    """Discards completed (kernel 4.18+)."""
    discards_merged: int = 0
    """Discards merged (4.18+)."""
    sectors_discarded: int = 0
    """Sectors discarded (4.18+)."""
    discard_ms: int = 0
    """Milliseconds spent by discards (4.18+, 32-bit)."""
    flushes: int = 0
    """Flush requests completed (5.5+)."""
    flush_ms: int = 0
    """Milliseconds spent by flushes (5.5+, 32-bit)."""
    fields: int = field(default=17, compare=False)
    """How many counter fields the source line held: 11, 15 or 17."""

    @property
    def has_io(self) -> bool:
        """True if the device did any read, write, discard or flush since boot."""
        return bool(self.reads or self.writes or self.discards or self.flushes)


def zero_counters(template: DiskCounters) -> DiskCounters:
    """All-zero counters for the same device: the 'previous' of a new or reset device."""
    return DiskCounters(template.major, template.minor, template.name, 0, 0, 0, 0, 0, 0, 0, 0,
                        0, 0, 0, fields=template.fields)


@dataclass(slots=True)
class DiskSnapshot:
    """Every device's counters read at one moment, with the interval clock."""

    uptime_cs: int
    """/proc/uptime in centiseconds (seconds * 100 plus the two digits after the dot)."""
    devices: dict[str, DiskCounters]
    """Counters by device name, in the order the kernel listed them."""
    skipped_lines: int = 0
    """Malformed lines that were skipped while reading."""
    old_format_lines: int = 0
    """Pre-2.6.25 partition lines (4 counters, no extended statistics) left out."""
    source: str = ""
    """Where the counters came from, e.g. ``/proc/diskstats``."""

    @classmethod
    def zero(cls) -> DiskSnapshot:
        """The reference of iostat's first report: no counters, uptime 0."""
        return cls(0, {})
