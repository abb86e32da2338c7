"""Which devices a report shows, and in which order, as iostat decides."""

from __future__ import annotations

from collections.abc import Sequence

from iolens.sources.counters import DiskCounters, DiskSnapshot
from iolens.sources.sysblock import Topology, sysfs_name


def _ios(rec: DiskCounters | None) -> tuple[int, int, int, int]:
    if rec is None:
        return (0, 0, 0, 0)
    return (rec.reads, rec.writes, rec.discards, rec.flushes)


def select_devices(
    cur: DiskSnapshot,
    prev: DiskSnapshot,
    topology: Topology,
    *,
    names: Sequence[str] = (),
    partitions: bool = False,
    omit_idle: bool = False,
) -> list[str]:
    """Device names to report, in iostat's order.

    - No names: every whole disk that did any I/O since boot, sorted by name;
      ``ALL`` among the names keeps the unused ones too.
    - Names: exactly those devices (partitions included), sorted; a named
      device absent from ``cur`` (vanished) is skipped while absent. Callers
      check names once, up front (:class:`UnknownDeviceError`).
    - ``partitions`` adds the partitions of the disks shown. Without names,
      iostat then lists every device in /proc/diskstats order.
    - ``omit_idle`` (``-z``) drops devices with no I/O completed in the interval.
    """
    show_unused = "ALL" in names
    explicit = [n for n in names if n != "ALL" and n in cur.devices]

    chosen: list[str]
    if partitions and not explicit:
        chosen = [n for n, rec in cur.devices.items() if show_unused or rec.has_io]
    else:
        picked: dict[str, None] = {}
        if explicit or (names and not show_unused):
            picked.update(dict.fromkeys(explicit))
            if show_unused:
                picked.update(dict.fromkeys(n for n in cur.devices if not topology.is_partition(n)))
        else:
            picked.update(dict.fromkeys(
                n for n, rec in cur.devices.items()
                if not topology.is_partition(n) and (show_unused or rec.has_io)
            ))
        if partitions:
            disks = set(picked)
            picked.update(dict.fromkeys(
                n for n in cur.devices if topology.is_partition(n) and topology.disk_of(n) in disks
            ))
        # iostat keeps its list sorted by the sysfs spelling of the names.
        chosen = sorted(picked, key=sysfs_name)
    if omit_idle:
        before = prev.devices
        chosen = [n for n in chosen if _ios(cur.devices[n]) != _ios(before.get(n))]
    return chosen
