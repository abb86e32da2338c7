"""/sys/block: which devices are whole disks, their partitions, and their stat files."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from iolens._errors import StatsUnavailableError
from iolens.sources._files import PreadFile, read_text
from iolens.sources.counters import DiskCounters
from iolens.sources.diskstats import ParseResult, parse_stat_file


def kernel_name(sysfs_name: str) -> str:
    """Device name as /proc/diskstats prints it: sysfs writes ``/`` as ``!`` (``cciss!c0d0``)."""
    return sysfs_name.replace("!", "/")


def sysfs_name(kernel: str) -> str:
    """The /sys/block entry name of a kernel device name."""
    return kernel.replace("/", "!")


@dataclass(frozen=True, slots=True)
class Topology:
    """Which device names are whole disks, and the disk each partition belongs to."""

    disks: frozenset[str]
    """Whole-disk names (kernel spelling)."""
    parent: dict[str, str] = field(default_factory=dict)
    """Partition name -> disk name."""

    def is_partition(self, name: str) -> bool:
        """True if ``name`` is a partition (known from sysfs or guessed from its name)."""
        return name in self.parent

    def disk_of(self, name: str) -> str:
        """The whole disk holding ``name`` (itself when it is a disk)."""
        return self.parent.get(name, name)


def read_topology(sys_root: str = "/sys") -> Topology | None:
    """Disks and partitions as sysfs lists them; ``None`` when <sys_root>/block is not readable."""
    block = os.path.join(sys_root, "block")
    try:
        entries = os.listdir(block)
    except OSError:
        return None
    disks: set[str] = set()
    parent: dict[str, str] = {}
    for entry in entries:
        disk = kernel_name(entry)
        disks.add(disk)
        try:
            children = os.listdir(os.path.join(block, entry))
        except OSError:
            continue
        for child in children:
            # A partition is a subdirectory holding a file named `partition`.
            if os.path.exists(os.path.join(block, entry, child, "partition")):
                parent[kernel_name(child)] = disk
    return Topology(frozenset(disks), parent)


# The kernel names a partition after its disk: a disk name ending in a digit
# gets "p" before the number (nvme0n1p1, mmcblk0p1, loop1p1), others do not (sda1).
_DIGIT_SUFFIX = re.compile(r"^\d+$")
_P_DIGIT_SUFFIX = re.compile(r"^p\d+$")


def _partition_suffix_ok(disk: str, suffix: str) -> bool:
    pattern = _P_DIGIT_SUFFIX if disk[-1:].isdigit() else _DIGIT_SUFFIX
    return bool(pattern.match(suffix))


def guess_topology(devices: dict[str, DiskCounters]) -> Topology:
    """Classify names without sysfs (replayed snapshots, a /proc without /sys).

    A device is taken as a partition of another when both share a major
    number, the other has the lower minor, and the name is the other's name
    plus a number, after a ``p`` where the disk's name ends in a digit
    (sda1, nvme0n1p2, mmcblk0p1; but loop10 is no partition of loop1).
    """
    parent: dict[str, str] = {}
    by_major: dict[int, list[DiskCounters]] = {}
    for rec in devices.values():
        by_major.setdefault(rec.major, []).append(rec)
    for rec in devices.values():
        best = ""
        for other in by_major.get(rec.major, ()):
            if (
                other.minor < rec.minor
                and rec.name.startswith(other.name)
                and len(other.name) > len(best)
                and _partition_suffix_ok(other.name, rec.name[len(other.name):])
            ):
                best = other.name
        if best:
            parent[rec.name] = best
    # A device guessed to be a partition of a partition is not a disk either,
    # but its whole disk is the top of the chain.
    for name, direct in list(parent.items()):
        top = direct
        while top in parent:
            top = parent[top]
        parent[name] = top
    disks = frozenset(n for n in devices if n not in parent)
    return Topology(disks, parent)


class SysBlockReader:
    """Reads every device's counters from ``<sys_root>/block/*/stat`` and partition stat files.

    The fallback when /proc/diskstats cannot be read. The listing is scanned
    on each read so that new and vanished devices are seen; stat files stay
    open between reads.
    """

    def __init__(self, sys_root: str = "/sys") -> None:
        self.sys_root = sys_root
        self.path = os.path.join(sys_root, "block")
        self._files: dict[str, PreadFile] = {}
        self._devnums: dict[str, tuple[int, int]] = {}

    def _devnum(self, directory: str) -> tuple[int, int]:
        cached = self._devnums.get(directory)
        if cached is not None:
            return cached
        try:
            major_s, _, minor_s = read_text(os.path.join(directory, "dev")).strip().partition(":")
            devnum = (int(major_s), int(minor_s))
        except (StatsUnavailableError, ValueError):
            devnum = (0, 0)
        self._devnums[directory] = devnum
        return devnum

    def _stat_dirs(self) -> list[tuple[str, str]]:
        try:
            entries = sorted(os.listdir(self.path))
        except OSError as exc:
            raise StatsUnavailableError(self.path, exc.strerror or str(exc)) from exc
        out: list[tuple[str, str]] = []
        for entry in entries:
            directory = os.path.join(self.path, entry)
            out.append((kernel_name(entry), directory))
            try:
                children = sorted(os.listdir(directory))
            except OSError:
                continue
            for child in children:
                sub = os.path.join(directory, child)
                if os.path.exists(os.path.join(sub, "partition")):
                    out.append((kernel_name(child), sub))
        return out

    def read(self) -> ParseResult:
        """Counters of every disk and partition under <sys_root>/block."""
        result = ParseResult({})
        seen: set[str] = set()
        for name, directory in self._stat_dirs():
            seen.add(directory)
            f = self._files.get(directory)
            if f is None:
                f = self._files[directory] = PreadFile(os.path.join(directory, "stat"))
            try:
                text = f.read()
            except StatsUnavailableError:
                continue  # vanished between listing and reading
            major, minor = self._devnum(directory)
            rec = parse_stat_file(name, text, major, minor)
            if rec is None:
                result.skipped_lines += 1
                continue
            result.devices[name] = rec
        for directory in set(self._files) - seen:
            self._files.pop(directory).close()
            self._devnums.pop(directory, None)
        return result

    def close(self) -> None:
        """Close every open stat file."""
        for f in self._files.values():
            f.close()
        self._files.clear()
