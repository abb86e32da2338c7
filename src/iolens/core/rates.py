"""Two snapshots -> iostat's extended device statistics (docs/metrics.md).

Every formula follows sysstat 12.6's iostat, including the order of the
floating-point operations, so that printed values match digit for digit.
"""

from __future__ import annotations

from dataclasses import dataclass

from iolens.sources.counters import COUNT_MOD, TIME_MOD, DiskCounters, DiskSnapshot, zero_counters


@dataclass(slots=True)
class DeviceRates:
    """Extended statistics of one device over one interval, in iostat's units (read-only)."""

    device: str
    """Kernel device name."""
    interval_cs: int
    """Interval length in centiseconds (from /proc/uptime)."""
    r_s: float
    """Reads completed per second (r/s)."""
    rkB_s: float
    """Kilobytes read per second (rkB/s)."""
    rrqm_s: float
    """Read requests merged per second (rrqm/s)."""
    rrqm_pct: float
    """Percent of read requests merged before reaching the device (%rrqm)."""
    r_await: float
    """Mean time of a read, queue included, in ms (r_await)."""
    rareq_sz: float
    """Mean read size in kB (rareq-sz)."""
    w_s: float
    """Writes completed per second."""
    wkB_s: float
    """Kilobytes written per second."""
    wrqm_s: float
    """Write requests merged per second."""
    wrqm_pct: float
    """Percent of write requests merged."""
    w_await: float
    """Mean time of a write in ms."""
    wareq_sz: float
    """Mean write size in kB."""
    d_s: float
    """Discards completed per second."""
    dkB_s: float
    """Kilobytes discarded per second."""
    drqm_s: float
    """Discard requests merged per second."""
    drqm_pct: float
    """Percent of discard requests merged."""
    d_await: float
    """Mean time of a discard in ms."""
    dareq_sz: float
    """Mean discard size in kB."""
    f_s: float
    """Flush requests completed per second."""
    f_await: float
    """Mean time of a flush in ms."""
    aqu_sz: float
    """Mean number of requests in flight (aqu-sz, formerly avgqu-sz)."""
    util: float
    """Percent of the interval during which the device had I/O in flight (%util), never capped."""
    tps: float
    """Transfers per second: reads + writes + discards (iostat's short report)."""
    avgrq_sz: float
    """Mean request size in sectors, reads and writes (old iostat's avgrq-sz)."""
    await_ms: float
    """Mean time of a read or write in ms (old iostat's await)."""
    svctm: float
    """io_ticks / (reads + writes) in ms. Not a service time on devices that
    serve requests in parallel (SSD, NVMe, RAID); kept for the old API only."""
    reset: bool = False
    """True when the counters went back (device re-registered) and the interval
    was computed against zeros."""

    @property
    def rMB_s(self) -> float:
        """Megabytes read per second (rMB/s with ``-m``)."""
        return self.rkB_s / 1024

    @property
    def wMB_s(self) -> float:
        """Megabytes written per second."""
        return self.wkB_s / 1024

    @property
    def dMB_s(self) -> float:
        """Megabytes discarded per second."""
        return self.dkB_s / 1024

    @property
    def avgqu_sz(self) -> float:
        """Old name of :attr:`aqu_sz`."""
        return self.aqu_sz


_ZEROS = (0.0,) * 26  # every float field of DeviceRates


MIN_INTERVAL_S = 0.05
"""The shortest sampling interval: 5 ticks of the 10 ms uptime clock that times rates (as
in iostat), so a rate is off by at most a fifth; a soak test runs 10 minutes at it."""
MAX_INTERVAL_S = 60.0
"""The longest: a record a minute still charts and diagnoses a run."""


def interval_cs(prev: DiskSnapshot, cur: DiskSnapshot) -> int:
    """Centiseconds between two snapshots; 1 when they are equal, as in iostat.

    Raises ValueError if ``cur`` is older than ``prev`` (snapshots swapped, or
    taken across a reboot).
    """
    itv = cur.uptime_cs - prev.uptime_cs
    if itv < 0:
        raise ValueError(
            f"snapshot uptimes go backwards ({prev.uptime_cs / 100:.2f} s then "
            f"{cur.uptime_cs / 100:.2f} s): swapped, or taken across a reboot"
        )
    return itv or 1


def was_reset(prev: DiskCounters, cur: DiskCounters) -> bool:
    """The device was unregistered and registered again between the two reads.

    sysstat's test: the count of all I/Os went down, and each sector counter
    was zero before or went down.
    """
    return (
        cur.reads + cur.writes + cur.discards + cur.flushes
        < prev.reads + prev.writes + prev.discards + prev.flushes
        and (not prev.sectors_read or cur.sectors_read < prev.sectors_read)
        and (not prev.sectors_written or cur.sectors_written < prev.sectors_written)
        and (not prev.sectors_discarded or cur.sectors_discarded < prev.sectors_discarded)
    )


def _pct_merged(merges: int, ios: int) -> float:
    total = merges + ios
    return float(merges) / float(total) * 100 if total else 0.0


def _per_io(amount: int, ios: int) -> float:
    return float(amount) / float(ios) if ios else 0.0


def device_rates(prev: DiskCounters | None, cur: DiskCounters, itv: int) -> DeviceRates:
    """Extended statistics of ``cur`` against ``prev`` over ``itv`` centiseconds.

    ``prev=None`` (a new device) and a detected reset compare against zeros.
    Deltas wrap like sysstat 12.6's unsigned arithmetic: counts modulo 2^64,
    times modulo 2^32, so a wrapped 32-bit time counter still yields the
    right delta.
    """
    if prev is cur:
        # The parser hands back the same record for an unchanged line: an idle
        # device, and on most machines the majority of them.
        return DeviceRates(cur.name, itv, *_ZEROS)
    reset = False
    if prev is None:
        prev = zero_counters(cur)
    elif was_reset(prev, cur):
        prev = zero_counters(cur)
        reset = True
    itv_f = float(itv)

    def s(delta: int) -> float:
        # S_VALUE: (double) delta / itv * 100, in that order.
        return float(delta) / itv_f * 100

    rd_ios = (cur.reads - prev.reads) % COUNT_MOD
    rd_merges = (cur.reads_merged - prev.reads_merged) % COUNT_MOD
    rd_sect = (cur.sectors_read - prev.sectors_read) % COUNT_MOD
    rd_ticks = (cur.read_ms - prev.read_ms) % TIME_MOD
    wr_ios = (cur.writes - prev.writes) % COUNT_MOD
    wr_merges = (cur.writes_merged - prev.writes_merged) % COUNT_MOD
    wr_sect = (cur.sectors_written - prev.sectors_written) % COUNT_MOD
    wr_ticks = (cur.write_ms - prev.write_ms) % TIME_MOD
    dc_ios = (cur.discards - prev.discards) % COUNT_MOD
    dc_merges = (cur.discards_merged - prev.discards_merged) % COUNT_MOD
    dc_sect = (cur.sectors_discarded - prev.sectors_discarded) % COUNT_MOD
    dc_ticks = (cur.discard_ms - prev.discard_ms) % TIME_MOD
    fl_ios = (cur.flushes - prev.flushes) % COUNT_MOD
    fl_ticks = (cur.flush_ms - prev.flush_ms) % TIME_MOD
    tot_ticks = (cur.io_ms - prev.io_ms) % TIME_MOD
    rq_ticks = (cur.weighted_ms - prev.weighted_ms) % TIME_MOD

    rw_ios = (rd_ios + wr_ios) % COUNT_MOD
    return DeviceRates(
        device=cur.name,
        interval_cs=itv,
        r_s=s(rd_ios),
        rkB_s=s(rd_sect) / 2,
        rrqm_s=s(rd_merges),
        rrqm_pct=_pct_merged(rd_merges, rd_ios),
        r_await=_per_io(rd_ticks, rd_ios),
        rareq_sz=_per_io(rd_sect, rd_ios) / 2,
        w_s=s(wr_ios),
        wkB_s=s(wr_sect) / 2,
        wrqm_s=s(wr_merges),
        wrqm_pct=_pct_merged(wr_merges, wr_ios),
        w_await=_per_io(wr_ticks, wr_ios),
        wareq_sz=_per_io(wr_sect, wr_ios) / 2,
        d_s=s(dc_ios),
        dkB_s=s(dc_sect) / 2,
        drqm_s=s(dc_merges),
        drqm_pct=_pct_merged(dc_merges, dc_ios),
        d_await=_per_io(dc_ticks, dc_ios),
        dareq_sz=_per_io(dc_sect, dc_ios) / 2,
        f_s=s(fl_ios),
        f_await=_per_io(fl_ticks, fl_ios),
        aqu_sz=s(rq_ticks) / 1000.0,
        util=s(tot_ticks) / 10.0,
        tps=s((rw_ios + dc_ios) % COUNT_MOD),
        avgrq_sz=_per_io((rd_sect + wr_sect) % COUNT_MOD, rw_ios),
        await_ms=_per_io((rd_ticks + wr_ticks) % TIME_MOD, rw_ios),
        svctm=_per_io(tot_ticks, rw_ios),
        reset=reset,
    )


def snapshot_rates(prev: DiskSnapshot, cur: DiskSnapshot) -> dict[str, DeviceRates]:
    """Rates of every device present in ``cur``, in its order.

    A device absent from ``prev`` is new and compared against zeros; one
    absent from ``cur`` has vanished and is left out while absent. Pass
    :meth:`DiskSnapshot.zero` as ``prev`` for iostat's since-boot report.
    """
    itv = interval_cs(prev, cur)
    before = prev.devices
    return {name: device_rates(before.get(name), rec, itv) for name, rec in cur.devices.items()}
