"""The sampler loop: one record per interval of the disks, the job's processes, CPU, memory, GPU
and the training loop's own timing.

It runs outside the training process (``iolens run``'s own process, or the
sidecar that ``iolens.monitor()`` starts), so it never competes with the
training for the GIL.
"""

from __future__ import annotations

import contextlib
import math
import os
import platform
import socket
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from iolens._errors import StatsUnavailableError
from iolens._version import __version__
from iolens.core.rates import DeviceRates, snapshot_rates
from iolens.recorder.pace import PaceClock
from iolens.recorder.storage import StorageWatch
from iolens.recorder.totals import LiveTotals
from iolens.rundir import SCHEMA_VERSION, RunDir, rfc3339
from iolens.rundir.timing import TimingReader, TrainingAggregator
from iolens.sources.counters import DiskSnapshot
from iolens.sources.devmap import device_for_path
from iolens.sources.disk import DiskSampler
from iolens.sources.gpu import GpuReader
from iolens.sources.procfs import (
    CLK_TCK,
    CpuTimes,
    ProcessTable,
    ProcIO,
    SystemReader,
    cpu_percentages,
    read_wait,
)
from iolens.sources.procmaps import data_file, read_mapped_files

# Zombie and dead processes have exited; only their parent has yet to reap them.
_GONE_STATES = frozenset("ZXx")
# Records kept in memory while the run directory cannot take them: ~1-2 KB each,
# so at most some 20 MB, about 3 hours at the default interval.
_UNSAVED_MAX = 10_000
# How often (in samples) the job's open files are scanned for new devices: every 5
# samples, and no more than once a second (at a 0.05 s interval, every 20).
_DISCOVER_EVERY = 5
_DISCOVER_MIN_S = 1.0
_MAPS_EVERY = 10
"""A process's memory maps are read again every this many discovery passes."""
_EARLY_S = 10.0
"""The start of a run, and of each process, when discovery runs at every sample (NOTE
[finding the dataset])."""
WAITING_S = 30.0
"""No batch for this long after the last (or the epoch's start) is worth saying: six of
torch's 5-second checks that the workers live (NOTE [no batch for a while])."""
_HELD_MAX = 65536
"""(process, file) pairs remembered at most: past it, files are no longer counted."""
_DEVICE_FIELDS = ("r_s", "rkB_s", "rrqm_s", "r_await", "rareq_sz", "w_s", "wkB_s", "wrqm_s",
                  "w_await", "wareq_sz", "d_s", "f_s", "aqu_sz", "util")

_OPENS, _WRITES = "the job reads or writes ", "the job writes files in "
_FROM_FILES = (_OPENS, _WRITES)
"""Why a device is watched when found from one of the job's files alone. The dataset's
folders, found a moment later from the same files, say more and replace these: the fd
scan can see a worker's data file before the timing hook reports the open."""


def device_record(r: DeviceRates) -> dict[str, float]:
    """The figures of one device kept in each interval record."""
    return {f: round(getattr(r, f), 4) for f in _DEVICE_FIELDS}


@dataclass
class _ProcState:
    io: ProcIO
    cpu_ticks: int
    role: str
    ppid: int = 0
    children_ticks: int = 0
    run_delay_ns: int | None = None


@dataclass
class RoleTotals:
    """I/O and CPU of one role (main, worker, other) over an interval."""

    pids: int = 0
    io: ProcIO = field(default_factory=ProcIO)
    cpu_ticks: int = 0
    io_readable: bool = True
    run_delay_ns: int = 0
    """Run-queue wait of the role's processes (their main threads) over the interval."""
    blocked: int = 0
    """The role's processes found in uninterruptible sleep (state D) at the sample: one
    sample a process an interval, as ``pids`` counts them (NOTE [blocked by role])."""

    def record(self, seconds: float) -> dict[str, Any]:
        io = self.io
        out: dict[str, Any] = {
            "pids": self.pids,
            "cpu_pct": round(self.cpu_ticks / CLK_TCK / seconds * 100, 2) if seconds else 0.0,
            "run_delay_pct": round(self.run_delay_ns / 1e7 / seconds, 2) if seconds else 0.0,
            "blocked": self.blocked,
            "read_bytes_s": round(io.read_bytes / seconds, 1) if seconds else 0.0,
            "write_bytes_s": round(io.write_bytes / seconds, 1) if seconds else 0.0,
            "rchar_s": round(io.rchar / seconds, 1) if seconds else 0.0,
            "wchar_s": round(io.wchar / seconds, 1) if seconds else 0.0,
            "cache_hit": cache_hit(io),
        }
        if not self.io_readable:
            out["io_readable"] = False
        return out


def _reaped_children(before: dict[int, _ProcState],
                     now: dict[int, Any]) -> dict[int, _ProcState]:
    """Per living parent, the last-seen totals of its children that have since vanished.

    NOTE [reaped children]: when a process reaps a child, the kernel adds the
    child's CPU to the parent's cutime/cstime and the child's I/O to the
    parent's own /proc/<pid>/io. Without a correction, a DataLoader worker's
    reads would count twice (as a worker while it lived, then again in the
    main process that reaped it at the end of the epoch). The part a child
    did between our last look and its exit stays in the parent's I/O (it
    cannot be told apart there); its CPU is known exactly from cutime. A
    child reaped by someone else (its parent gone, or SIGCHLD ignored) leaves
    nothing in the parent, which the clamp to zero absorbs.
    """
    out: dict[int, _ProcState] = {}
    for pid, st in before.items():
        if pid in now or st.ppid not in now:
            continue
        acc = out.get(st.ppid)
        if acc is None:
            out[st.ppid] = _ProcState(st.io, st.cpu_ticks, st.role)
        else:
            acc.io = acc.io + st.io
            acc.cpu_ticks += st.cpu_ticks
    return out


def _clamp(io: ProcIO) -> ProcIO:
    return ProcIO(max(0, io.rchar), max(0, io.wchar), max(0, io.read_bytes),
                  max(0, io.write_bytes), max(0, io.cancelled_write_bytes))


def cache_hit(io: ProcIO) -> float | None:
    """Share of the bytes read through syscalls that did not reach the block layer.

    ``None`` when nothing was read. rchar also counts pipes and sockets, so
    for the main process (which receives batches from its workers through
    pipes) this overstates the cache's part; the workers' figure is the one
    to trust.
    """
    if io.rchar <= 0:
        return None
    return round(max(0.0, min(1.0, 1 - io.read_bytes / io.rchar)), 4)


class Recorder:
    """Samples everything the run directory records, one interval at a time."""

    def __init__(self, run: RunDir | None, root_pid: int | None, interval: float,
                 watch: dict[str, str], *, proc_root: str = "/proc", sys_root: str = "/sys",
                 discover: bool = True, exclude_pids: frozenset[int] = frozenset(),
                 totals: LiveTotals | None = None, adopter: int | None = None) -> None:
        """``run`` None samples without writing (``iolens top``); ``root_pid`` None
        watches the devices and the machine but no process tree; ``exclude_pids``
        are left out of the tree (the sidecar, itself a child of the job); ``totals``
        keeps cumulative counters for the Prometheus exporter and gets the latest
        state after every sample; ``adopter`` is a subreaper whose children count as
        the job's once its root is gone (NOTE [leftovers])."""
        self.adopter = adopter
        self.totals = totals
        self.exclude_pids = set(exclude_pids)
        """Left out of the job's tree with everything below them: the sidecar, and the
        recorder's own children (NOTE [the recorder's own children])."""
        self.run = run
        self.root_pid = root_pid
        self.interval = interval
        self.watch = dict(watch)
        """Device name -> why it is watched."""
        self.discover = discover
        self.proc_root = proc_root
        self.sys_root = sys_root
        self.disks = DiskSampler(proc_root, sys_root)
        self.system = SystemReader(proc_root)
        self.procs = ProcessTable(proc_root)
        self.gpu = GpuReader()
        self.timing = TimingReader(run.timing_dir if run is not None else None)
        self.storage = StorageWatch(proc_root, sys_root)
        """What serves the dataset (NOTE [dataset folders] in iolens/recorder/storage.py)."""
        self.storage_now: list[dict[str, Any]] = []
        """``self.storage.meta()`` as of the last mount found, updated in place (the live
        verdicts hold this list)."""
        self._maps_seen: dict[int, int] = {}
        self._born: dict[int, float] = {}
        """When each process was first seen (its maps are read often while it is young)."""
        self._sockets: set[int] = set()
        """The processes the last scan of open files saw holding a socket."""
        self._server_pids: dict[int, str] = {}
        """Local servers of the dataset's peers -> the peer's name."""
        self._server_devs: set[int] = set()
        self._sizes: list[tuple[str, int]] = []
        """(folder, size) of data files seen, for the storage once its folders are mapped."""
        self._sized: set[str] = set()
        """Mapped files whose size is known."""
        self._held: set[tuple[int, str]] = set()
        """(pid, file) of the data files seen open, counted once each."""
        self._held_in: dict[tuple[int, str], int] = {}
        """(pid, folder) -> data files seen open there: the opens a scan reports."""
        self._written: set[str] = set()
        self._maps_pass = 0
        self.train = totals.aggregator() if totals is not None else TrainingAggregator()
        # One list: the disk sampler's fallbacks (/sys/block, the monotonic clock)
        # belong in meta.json with the recorder's own notes.
        self.notes: list[str] = self.disks.notes
        self.unsaved: list[dict[str, Any]] = []
        """Records the run directory could not take, in order (NOTE [unsaved records])."""
        self.unsaved_dropped = 0
        """Unsaved records dropped from memory past ``_UNSAVED_MAX``."""
        self.pace = PaceClock()
        """The machine's pace for Python's own work (NOTE [the machine's pace])."""
        self.seq = 0
        self.start_wall = time.time()
        self.start_mono = time.monotonic()
        self._last_mono = self.start_mono
        self._disk_prev: DiskSnapshot | None = None
        self._cpu_prev: CpuTimes | None = self.system.cpu()
        self._procs: dict[int, _ProcState] = {}
        self._unnamed: set[int] = set()
        """Forks of the training process held back for one sample (NOTE [a fork not yet
        named])."""
        self._dev_cache: dict[int, str | None] = {}
        self._disk_error: str | None = None
        try:
            self._disk_prev = self.disks.snapshot()
        except StatsUnavailableError as exc:
            self._disk_error = f"{exc}: no device statistics on this system"
            self.notes.append(self._disk_error)
        if root_pid is not None:
            # The baseline of the process tree: a process that was running before
            # the recording (iolens.monitor()) counts only what it does from now.
            try:
                self._job(1.0)
            except Exception as exc:  # noqa: BLE001 - NOTE [never hurt the job] in loop()
                self.notes.append(f"could not read the job's processes: {exc!r}")
        if totals is not None:
            totals.publish(None, self._disk_prev, list(self.watch), self._cpu_prev)

    # -- pieces of a record ---------------------------------------------------

    def _devices(self) -> dict[str, Any]:
        if self._disk_prev is None:
            return {}
        try:
            cur = self.disks.snapshot()
        except StatsUnavailableError as exc:
            if self._disk_error is None:
                self._disk_error = str(exc)
                self.notes.append(f"device statistics stopped: {exc}")
            return {}
        try:
            rates = snapshot_rates(self._disk_prev, cur)
        except ValueError:
            rates = {}
        self._disk_prev = cur
        out: dict[str, Any] = {}
        for name in self.watch:
            r = rates.get(name)
            if r is not None:
                out[name] = device_record(r)
        return out

    def _tree(self) -> dict[int, Any]:
        """The job's processes: the tree under the root, or what is left of it once the
        root is gone.

        NOTE [leftovers]: a job's processes may outlive it (a grandchild that
        detached, the training a wrapper script started in the background, a
        server it spawned). Once the root has exited they are re-parented
        elsewhere, so they are followed as roots of their own, from the last
        sample's pids and the adopter's children: what they do until they exit
        stays in the records.
        """
        assert self.root_pid is not None
        skip = self._excluded()
        samples = self.procs.sample(self.root_pid, skip)
        if samples:
            return samples
        roots = set(self._procs)
        if self.adopter is not None:
            # Orphans re-parented to the adopter (``iolens run`` is a subreaper), even
            # those that started and lost their parent between two samples.
            roots.update(st.pid for st in self.procs.descendants(self.adopter, skip))
            roots.discard(self.adopter)
        for pid in roots:
            if pid not in samples and pid not in skip:
                samples.update(self.procs.sample(pid, skip))
        return {p: s for p, s in samples.items() if s.stat.state not in _GONE_STATES}

    def _excluded(self) -> set[int]:
        """NOTE [the recorder's own children]: a tracker's client may start a process of
        its own (W&B's service) from the recorder's thread that feeds it. It is a child
        of the recorder, and so of the job where the recorder is the job's sidecar, and
        of the subreaper whose children count as the job's leftovers: it would be taken
        for the job's, its CPU counted and its life waited for. The job's own processes
        are started by the recorder's main thread, and orphans are re-parented to the
        subreaper's main thread, so a child that another thread of the recorder started
        is the recorder's: it joins ``exclude_pids`` (with its subtree) for good."""
        if self.proc_root == "/proc":
            self.exclude_pids.update(self.procs.thread_children(os.getpid()))
        return self.exclude_pids

    @property
    def leftovers(self) -> list[int]:
        """The job's processes seen alive in the last sample, other than its root."""
        return [p for p in self._procs if p != self.root_pid]

    def running(self, pids: list[int]) -> list[int]:
        """Those of ``pids`` that have not exited (a zombie has, though not yet reaped)."""
        out = []
        for pid in pids:
            st = self.procs.read_stat(pid)
            if st is not None and st.state not in _GONE_STATES:
                out.append(pid)
        return out

    def _job(self, seconds: float) -> dict[str, Any]:
        if self.root_pid is None:
            return {}
        samples = self._tree()
        workers = set(self.train.worker_pids)
        mains = self.timing.pids
        totals = {"main": RoleTotals(), "worker": RoleTotals(), "other": RoleTotals()}
        states: dict[str, int] = {}
        seen: dict[int, _ProcState] = {}
        reaped = _reaped_children(self._procs, samples)
        unnamed = self._unnamed
        unnamed.intersection_update(samples)
        for pid, smp in samples.items():
            if pid in self.exclude_pids:
                continue
            st = smp.stat
            if (pid not in self._procs and pid not in unnamed and pid not in workers
                    and st.comm != "pt_data_worker" and pid not in mains
                    and self._a_fresh_fork(st, samples, mains)):
                unnamed.add(pid)
                continue
            if pid in workers or st.comm == "pt_data_worker":
                role = "worker"
            elif pid in mains or (pid == self.root_pid and not mains):
                role = "main"
            else:
                role = "other"
            ticks = st.utime_ticks + st.stime_ticks
            prev = self._procs.get(pid)
            # An unreadable /proc/<pid>/io this time (the process is exiting, or its
            # permissions changed) adds nothing, and the next delta starts from the last
            # figures read, not from zero.
            io = smp.io if smp.io is not None else prev.io if prev is not None else ProcIO()
            t = totals[role]
            t.pids += 1
            if smp.io is None:
                t.io_readable = False
            if prev is None:
                t.io = t.io + io
                t.cpu_ticks += ticks
                t.run_delay_ns += smp.run_delay_ns or 0
            else:
                # Counters never go back for one process; a pid taken by a new process
                # between two samples starts again from zero: clamped, never negative.
                delta = _clamp(io - prev.io)
                gone = reaped.get(pid)
                if gone is not None:
                    # NOTE [reaped children]: what the children counted before they
                    # vanished is in their own role already; the CPU they used after
                    # our last look goes to the role they had.
                    delta = _clamp(delta - gone.io)
                    late = st.children_ticks - prev.children_ticks - gone.cpu_ticks
                    if late > 0:
                        totals[gone.role].cpu_ticks += late
                t.io = t.io + delta
                t.cpu_ticks += max(0, ticks - prev.cpu_ticks)
                if smp.run_delay_ns is not None and prev.run_delay_ns is not None:
                    t.run_delay_ns += max(0, smp.run_delay_ns - prev.run_delay_ns)
            seen[pid] = _ProcState(io, ticks, role, st.ppid, st.children_ticks,
                                   smp.run_delay_ns)
            states[st.state] = states.get(st.state, 0) + 1
            if st.state == "D":
                t.blocked += 1
        self._procs = seen
        if self.totals is not None:
            self.totals.add_roles({k: (v.pids, v.io, v.cpu_ticks) for k, v in totals.items()})
        job = RoleTotals()
        for t in totals.values():
            job.pids += t.pids
            job.io = job.io + t.io
            job.cpu_ticks += t.cpu_ticks
            job.run_delay_ns += t.run_delay_ns
            job.io_readable &= t.io_readable
        rec = job.record(seconds)
        del rec["blocked"]  # (the job's are states["D"]: kept by role only)
        rec["states"] = states
        rec["roles"] = {k: v.record(seconds) for k, v in totals.items() if v.pids}
        if not self.discover:
            return rec
        net = self.storage.net
        if self._discovery_due():
            mine = [p for p in samples if p not in self.exclude_pids]
            self._sockets.clear()
            self._scan_fds(mine)
            self._discover_mapped(mine)
            # (only the processes the scan saw holding a socket: the tables are read for them)
            side = [p for p in self._fetch_side(samples, workers) or mine if p in self._sockets]
            for peer in net.scan(side) if side or net.peers else ():
                self.storage_now[:] = self.storage.meta()
                if peer.server_pid is not None:
                    self._server_pids[peer.server_pid] = peer.name
            if self._server_pids:
                self._scan_servers()
            fetch = self.train.fetchers
            if len(fetch) > 4096:  # workers of past epochs
                fetch.intersection_update(samples)
        elif net.peers:  # every sample: the bytes of short connections
            net.scan(self._fetch_side(samples, workers) or list(samples))
        return rec

    def _a_fresh_fork(self, st: Any, samples: dict[int, Any], mains: set[int]) -> bool:
        """NOTE [a fork not yet named]: a DataLoader worker is told by the pid the
        job's timing reports and by the name PyTorch gives it (``pt_data_worker``),
        both set a moment after the fork. Until then it is a copy of the training
        process, under its name. A sample that falls in that moment (the start of
        each epoch's workers, more often on a loaded machine) would count a worker
        as some other process of the job. A child of the training process that bears
        its parent's name is left out of the sample that first sees it: the next
        sample counts it from its start, as what it then is (a worker, or another
        process of the job), so nothing it did is lost."""
        parent = samples.get(st.ppid)
        if parent is None or st.comm != parent.stat.comm:
            return False
        return st.ppid in mains or (st.ppid == self.root_pid and not mains)

    def _fetch_side(self, samples: dict[int, Any], workers: set[int]) -> list[int]:
        """The processes that fetch batches (DataLoader workers, or the training process
        with num_workers=0) and their children (a ``pipe:curl`` of WebDataset)."""
        side = {p for p in samples if p in workers or p in self.train.fetchers}
        if not side:
            return []
        grew = True
        while grew:
            grew = False
            for pid, smp in samples.items():
                if pid not in side and smp.stat.ppid in side and pid not in self.exclude_pids:
                    side.add(pid)
                    grew = True
        return sorted(side)

    def _scan_servers(self) -> None:
        """Watch the devices of the files the local servers of the dataset's peers hold
        open (NOTE [network storage] in iolens/recorder/network.py)."""
        for pid, name in list(self._server_pids.items()):
            fd_dir = os.path.join(self.proc_root, str(pid), "fd")
            if not os.path.isdir(fd_dir):
                del self._server_pids[pid]
                continue
            for fd in _listdir(fd_dir):
                link = os.path.join(fd_dir, fd)
                try:
                    target = os.readlink(link)
                    st_dev = os.stat(link).st_dev
                except OSError:
                    continue
                if not data_file(target) or st_dev in self._server_devs:
                    continue
                self._server_devs.add(st_dev)
                try:
                    mapping = device_for_path(target, self.proc_root, self.sys_root)
                except (OSError, ValueError):
                    continue
                for disk in mapping.disks:
                    self.watch[disk] = (f"serves the dataset through {name}: its server "
                                        f"reads {target}")

    def _discovery_due(self) -> bool:
        """NOTE [finding the dataset]: the job's open files and memory maps are scanned at
        every sample in the run's first _EARLY_S seconds (a short run, or a dataset the
        main process maps at start, is found while it is there), then every
        _DISCOVER_EVERY samples and no more than once a second."""
        if time.monotonic() - self.start_mono < _EARLY_S:
            self._maps_pass += 1
            return True
        every = max(_DISCOVER_EVERY, math.ceil(_DISCOVER_MIN_S / self.interval))
        if self.seq % every:
            return False
        self._maps_pass += 1
        return True

    def _discover_mapped(self, pids: list[int]) -> None:
        """Folders of the data files the job's processes map into memory (numpy.memmap,
        LMDB, Arrow): opened once and closed, they show in no fd list. Each process's maps
        are read when it is first seen, then 1, 2, 4 and 8 passes later while it is young
        (its first _EARLY_S seconds, when libraries map their data), then every
        _MAPS_EVERY passes (the maps are long: every library)."""
        exclude = self._not_data()
        now = time.monotonic()
        for pid in pids:
            first = self._maps_seen.get(pid)
            if first is None:
                self._maps_seen[pid] = first = self._maps_pass
                self._born[pid] = now
            else:
                age = self._maps_pass - first
                young = now - self._born.get(pid, now) < _EARLY_S
                if (age & (age - 1)) if young else age % _MAPS_EVERY:
                    continue  # (young: read at ages 1, 2, 4, 8 ... passes)
            for path in read_mapped_files(pid, self.proc_root, exclude):
                folder = os.path.dirname(path) or "/"
                self.timing.paths.append((pid, folder, 0))
                if path not in self._sized and len(self._sized) < _HELD_MAX:
                    self._sized.add(path)
                    with contextlib.suppress(OSError):
                        self._sizes.append((folder, os.stat(path).st_size))
        if len(self._maps_seen) > 4096:  # pids that are gone
            live = set(pids)
            self._maps_seen = {p: n for p, n in self._maps_seen.items() if p in live}
            self._born = {p: t for p, t in self._born.items() if p in live}
        if self.timing.paths:
            self._map_folders()

    def _not_data(self) -> tuple[str, ...]:
        """Folders whose files are iolens' own, never the dataset: the run directory and
        the timing folders."""
        run = self.run.path if self.run is not None else None
        return tuple(os.path.join(d, "") for d in (self.timing.directory, self.timing.spare,
                                                    run) if d)

    def _scan_fds(self, pids: list[int]) -> None:
        """The files the job's processes hold open: the devices they are on are watched,
        and the data files among them (read, or read and written: LMDB and HDF5 open their
        files in C, where no audit hook sees it) name the dataset's storage (NOTE [dataset
        folders]). A file only written (a checkpoint, a log) watches its device.

        NOTE [fd reuse]: the link is read before and after the stat, and the fd
        is skipped this time round unless both reads agree. A stat and a single
        read race with the job closing fd N and opening another file under the
        same number (torch's /dev/shm buffers do this all the time), which once
        cached the dataset's device as "no device" for the rest of a run. The
        stat goes through the fd, so it sees the job's file even in another
        mount namespace. The link's own mode is the descriptor's access mode
        (r-x: read only, -wx: write only, rwx: both).
        """
        exclude = self._not_data()
        for pid in pids:
            fd_dir = os.path.join(self.proc_root, str(pid), "fd")
            for fd in _listdir(fd_dir):
                link = os.path.join(fd_dir, fd)
                try:
                    target = os.readlink(link)
                    if not target.startswith("/"):
                        if target.startswith("socket:"):
                            self._sockets.add(pid)
                        continue
                    if target.startswith(("/proc/", "/sys/")):
                        continue
                    key = (pid, target)
                    known = key in self._held
                    if target.startswith("/dev/") and not target.startswith("/dev/shm/"):
                        continue
                    st = os.stat(link)
                    if not stat.S_ISREG(st.st_mode):
                        continue
                    mode = 0 if known else os.lstat(link).st_mode
                    if os.readlink(link) != target:
                        continue
                except OSError:
                    continue
                if not known and len(self._held) < _HELD_MAX and data_file(target, exclude):
                    self._held.add(key)
                    folder = os.path.dirname(target) or "/"
                    if mode & stat.S_IRUSR:
                        n = self._held_in[(pid, folder)] = self._held_in.get((pid, folder), 0) + 1
                        self.timing.paths.append((pid, folder, n))
                        self._sizes.append((folder, st.st_size))
                    elif mode & stat.S_IWUSR:
                        self.timing.paths.append((pid, folder, -1))
                if st.st_dev in self._dev_cache:
                    continue
                name: str | None = None
                try:
                    mapping = device_for_path(target, self.proc_root, self.sys_root)
                    for disk in mapping.disks:
                        if disk not in self.watch:
                            self.watch[disk] = _OPENS + target
                        name = disk
                except (OSError, ValueError):
                    pass
                self._dev_cache[st.st_dev] = name
        if self.timing.paths:
            self._map_folders()

    def _map_folders(self) -> None:
        """Watch the devices that serve the folders the input pipeline opened files in."""
        folders, self.timing.paths = self.timing.paths, []
        if not self.discover:
            return
        for _, folder, _ in [f for f in folders if f[2] < 0]:
            self._watch_written(folder)
            self.storage.note_written(folder)
        folders = [f for f in folders if f[2] >= 0]
        found = self.storage.add_all(folders)
        for folder, size in self._sizes:
            self.storage.note_size(folder, size)
        self._sizes.clear()
        if found or folders:
            self.storage_now[:] = self.storage.meta()  # (the most opened mount comes first)
        for served in found:
            for disk in served.disks:
                if disk not in self.watch or self.watch[disk].startswith(_FROM_FILES):
                    self.watch[disk] = (f"serves the dataset: the input pipeline read files "
                                        f"in {served.folders[0]}")

    def _watch_written(self, folder: str) -> None:
        """Watch the devices of a folder the job writes files in (checkpoints, logs) from
        the first file it opened there."""
        if folder in self._written:
            return
        self._written.add(folder)
        try:
            mapping = device_for_path(folder, self.proc_root, self.sys_root)
        except (OSError, ValueError):
            return
        for disk in mapping.disks:
            if disk not in self.watch:
                self.watch[disk] = _WRITES + folder

    def _waiting(self, train: dict[str, Any], now: float) -> None:
        """NOTE [no batch for a while]: once the loop has begun an epoch, a stretch of
        WAITING_S (or ten times the longest step, if more) with no batch is recorded in
        the interval as ``waiting_s``, with where the training process and the DataLoader
        workers wait (state, the kernel's wait channel, the syscall): a job that hangs at
        its DataLoader (workers that never start, a store that never answers) says so,
        live and in the verdict, rather than nothing at all. The training side's clock is
        the same monotonic clock as this one."""
        agg = self.train
        if not agg.last_data_ns or self.root_pid is None:
            return
        gap = now - agg.last_data_ns / 1e9
        if gap < max(WAITING_S, 10 * agg.longest_step_ns / 1e9):
            return
        train["waiting_s"] = round(gap, 1)
        who = [(p, "main") for p in sorted(self.timing.pids) if p in self._procs]
        who += [(p, "worker") for p in sorted(agg.worker_pids) if p in self._procs]
        waits = []
        for pid, role in who[:16]:
            st = self.procs.read_stat(pid)
            if st is None:
                continue
            waits.append({"pid": pid, "role": role, "state": st.state,
                          **read_wait(pid, self.proc_root)})
        train["waiting"] = waits

    def _cpu(self) -> dict[str, float]:
        cur = self.system.cpu()
        prev, self._cpu_prev = self._cpu_prev, cur
        if cur is None or prev is None:
            return {}
        return {k: round(v, 2) for k, v in cpu_percentages(prev, cur).items()}

    def _mem(self) -> dict[str, int]:
        m = self.system.memory()
        keys = {"Cached": "cached_bytes", "Dirty": "dirty_bytes", "Writeback": "writeback_bytes",
                "MemAvailable": "available_bytes"}
        return {new: m[old] for old, new in keys.items() if old in m}

    # -- the loop ---------------------------------------------------------------

    def sample(self) -> dict[str, Any]:
        """Take one interval's record and write it; returns the record."""
        now_mono = time.monotonic()
        seconds = max(now_mono - self._last_mono, 1e-9)
        self._last_mono = now_mono
        self.timing.poll(self.train)
        if self.timing.urls:
            for url in self.timing.urls:
                self.storage.net.note_url(url)
            self.timing.urls.clear()
        if self.timing.paths:
            self._map_folders()
        rec: dict[str, Any] = {
            "schema": SCHEMA_VERSION,
            "seq": self.seq,
            "t": round(time.time(), 3),
            "time": rfc3339(time.time()),
            "elapsed_s": round(now_mono - self.start_mono, 3),
            "interval_s": round(seconds, 4),
            "devices": self._devices(),
            "job": self._job(seconds),
            "cpu": self._cpu(),
            "mem": self._mem(),
            "train": self.train.take(),
        }
        self._waiting(rec["train"], now_mono)
        if self.storage.served or self.storage.net.peers:
            try:
                served = self.storage.sample(seconds)
            except Exception as exc:  # noqa: BLE001 - NOTE [never hurt the job] in loop()
                served = {}
                if not any(n.startswith("storage figures") for n in self.notes):
                    self.notes.append(f"storage figures not read: {exc!r}")
            if served:
                rec["storage"] = served
        if self.gpu.available:
            gpus = self.gpu.sample()
            for g in gpus:  # which of each GPU's processes belong to the job
                mine = [p for p in g.get("pids", ()) if p in self._procs]
                if mine:
                    g["job_pids"] = mine
            rec["gpu"] = gpus
        self.seq += 1
        if self.run is not None and not self.run.append(rec):
            # NOTE [unsaved records]: a record the run directory could not take (a
            # full or read-only filesystem) is kept here; finish_run() writes it late,
            # or the whole run elsewhere. Bounded, so a long run on a dead disk
            # cannot eat the job's memory: past the bound the oldest are dropped.
            self.unsaved.append(rec)
            if len(self.unsaved) > _UNSAVED_MAX:
                del self.unsaved[0]
                self.unsaved_dropped += 1
        if self.run is not None:  # (for meta.json: after the record, not to delay it)
            self.pace.tick(now_mono)
        if self.totals is not None:
            try:
                self.totals.publish(rec, self._disk_prev if self._disk_error is None else None,
                                    list(self.watch), self._cpu_prev)
            except Exception as exc:  # noqa: BLE001 - the record stands; only scrapes lag
                if not any(n.startswith("exporter state") for n in self.notes):
                    self.notes.append(f"exporter state not updated: {exc!r}")
        return rec

    def loop(self, wait: Callable[[float], bool],
             on_record: Callable[[dict[str, Any]], None] | None = None) -> None:
        """Sample every interval until ``wait(timeout)`` returns True (the job ended).

        ``on_record`` sees each record once it is written (the live view).

        NOTE [never hurt the job]: an exception while sampling is recorded
        and sampling goes on; the loop itself never ends the job.
        """
        next_tick = time.monotonic() + self.interval
        failures = 0
        while True:
            if wait(max(0.0, next_tick - time.monotonic())):
                return
            try:
                rec = self.sample()
                if on_record is not None:
                    on_record(rec)
            except Exception as exc:  # noqa: BLE001 - see NOTE above
                failures += 1
                if failures <= 3:
                    self.notes.append(f"sampling failed: {exc!r}")
            next_tick += self.interval
            if next_tick < time.monotonic():  # fell behind: skip the missed ticks
                next_tick = time.monotonic() + self.interval

    def base_meta(self, command: list[str], extra: dict[str, Any]) -> dict[str, Any]:
        """The metadata written at the start of a run."""
        u = os.uname()
        return {
            "schema": SCHEMA_VERSION,
            "iolens_version": _version(),
            "command": command,
            "cwd": os.getcwd(),
            "host": socket.gethostname(),
            "kernel": f"{u.sysname} {u.release}",
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "pace_s": None if (pace := self.pace.seconds()) is None else round(pace, 7),
            "interval_s": self.interval,
            "root_pid": self.root_pid,
            "start": rfc3339(self.start_wall),
            "start_t": round(self.start_wall, 3),
            "devices": dict(self.watch),
            "loaders": self.loaders(),
            "disk_source": self.disks.source if self._disk_error is None else None,
            "gpu": {"available": self.gpu.available, "reason": self.gpu.reason,
                    "names": self.gpu.names},
            **extra,
        }

    def loaders(self) -> list[dict[str, Any]]:
        """The settings of the loaders the job iterated (NOTE [loader settings] in
        iolens/training/_hooks.py), in the order of their process and tag."""
        return sorted(self.timing.loaders.values(),
                      key=lambda d: (int(d.get("pid") or 0), int(d.get("tag") or 0)))

    def close(self) -> None:
        """Release files and NVML."""
        self.disks.close()
        self.system.close()
        self.gpu.close()


def _version() -> str:
    return __version__


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []
