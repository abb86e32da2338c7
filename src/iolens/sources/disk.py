"""Snapshots of every block device's counters, from /proc/diskstats or sysfs."""

from __future__ import annotations

import os
import time

from iolens._errors import StatsUnavailableError
from iolens.sources._files import read_text
from iolens.sources.counters import DiskSnapshot
from iolens.sources.diskstats import DiskstatsReader, ParseResult, parse_diskstats
from iolens.sources.sysblock import SysBlockReader, Topology, guess_topology, read_topology
from iolens.sources.uptime import UptimeReader, parse_uptime_cs


class DiskSampler:
    """Takes :class:`DiskSnapshot` s cheaply, again and again.

    Reads ``<proc_root>/diskstats`` (one file for every device) and falls
    back to ``<sys_root>/block/*/stat`` when it cannot be read or lists no
    device. The interval clock is ``<proc_root>/uptime``, or the monotonic
    clock when that is missing. ``notes`` lists each fallback taken, in one
    sentence each.

    Raises :class:`StatsUnavailableError` from :meth:`snapshot` when neither
    source can be read.
    """

    def __init__(self, proc_root: str = "/proc", sys_root: str = "/sys") -> None:
        self.proc_root = proc_root
        self.sys_root = sys_root
        self._diskstats: DiskstatsReader | None = DiskstatsReader(proc_root)
        self._sysblock: SysBlockReader | None = None
        self._uptime: UptimeReader | None = UptimeReader(proc_root)
        self._topology: Topology | None = None
        self._topology_names: frozenset[str] = frozenset()
        self.notes: list[str] = []

    @property
    def source(self) -> str:
        """The file or folder the counters come from now."""
        if self._diskstats is not None:
            return self._diskstats.path
        return self._sysblock.path if self._sysblock is not None else ""

    def _read_counters(self) -> ParseResult:
        if self._diskstats is not None:
            try:
                return _listing(self._diskstats.read(), self._diskstats.path)
            except StatsUnavailableError as exc:
                self._diskstats.close()
                self._diskstats = None
                self._sysblock = SysBlockReader(self.sys_root)
                try:
                    result = _listing(self._sysblock.read(), self._sysblock.path)
                except StatsUnavailableError as fallback:
                    self._sysblock.close()
                    self._sysblock = None
                    raise StatsUnavailableError(
                        exc.path, f"{exc.reason}; and {fallback}") from None
                self.notes.append(f"{exc}; reading {self._sysblock.path}/*/stat instead")
                return result
        if self._sysblock is None:
            raise StatsUnavailableError(f"{self.proc_root}/diskstats", "unavailable")
        return _listing(self._sysblock.read(), self._sysblock.path)

    def _read_uptime_cs(self) -> int:
        if self._uptime is not None:
            try:
                return self._uptime.read_cs()
            except (StatsUnavailableError, ValueError) as exc:
                self._uptime.close()
                self._uptime = None
                self.notes.append(f"{exc}; timing intervals with the monotonic clock instead")
        return int(time.monotonic() * 100)

    def snapshot(self) -> DiskSnapshot:
        """Read every device's counters now."""
        uptime = self._read_uptime_cs()
        result = self._read_counters()
        return DiskSnapshot(uptime, result.devices, result.skipped_lines,
                            result.old_format_lines, self.source)

    def topology(self, snapshot: DiskSnapshot) -> Topology:
        """Disks and partitions among the snapshot's devices.

        From sysfs, re-read only when a device name appears that was not
        there before; guessed from names and numbers where sysfs is missing.
        """
        names = frozenset(snapshot.devices)
        if self._topology is None or not names <= self._topology_names:
            topo = read_topology(self.sys_root)
            if topo is None or not (names & (topo.disks | topo.parent.keys())):
                topo = guess_topology(snapshot.devices)
            self._topology = topo
            self._topology_names = names | topo.disks | frozenset(topo.parent)
        return self._topology

    def close(self) -> None:
        """Release every open file; safe to call twice."""
        for reader in (self._diskstats, self._sysblock, self._uptime):
            if reader is not None:
                reader.close()


def _listing(result: ParseResult, path: str) -> ParseResult:
    """``result``, unless it holds no line at all.

    A container may bind an empty file over /proc/diskstats or mount an empty
    /sys/block. Read as a machine without devices, that left a run without
    device figures, no fallback to sysfs, and a verdict that blamed the watch
    ("none serves the job's files?") instead of the missing statistics.
    """
    if not (result.devices or result.skipped_lines or result.old_format_lines):
        raise StatsUnavailableError(path, "it lists no block device")
    return result


def read_snapshot_dir(path: str) -> DiskSnapshot:
    """A snapshot saved as a folder holding ``diskstats`` and ``uptime`` as the kernel wrote them.

    Raises :class:`StatsUnavailableError` for a missing file and ValueError for an unusable uptime.
    """
    uptime_path = os.path.join(path, "uptime")
    diskstats_path = os.path.join(path, "diskstats")
    try:
        uptime = parse_uptime_cs(read_text(uptime_path))
    except ValueError as exc:
        raise ValueError(f"{uptime_path}: {exc}") from None
    result = parse_diskstats(read_text(diskstats_path))
    return DiskSnapshot(uptime, result.devices, result.skipped_lines, result.old_format_lines,
                        diskstats_path)
