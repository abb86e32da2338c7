"""Cumulative totals of a recording, kept for the Prometheus exporter.

The records of a run hold per-interval figures; Prometheus wants raw
counters that only grow, for the whole life of the exporter. The sampler
loop owns one :class:`LiveTotals` and feeds it once per sample (and every
batch timing as it is read); after each sample it publishes an immutable
:class:`ExportState`.

NOTE [scrapes never block sampling]: a scrape reads the latest published
state, a reference swapped under a lock held only for that swap, and builds
its answer from it in the HTTP server's thread. The sampler never waits for
a scrape (it only swaps the reference), and a scrape never waits for a
sample (it gets the last one).

Totals survive the job's processes: what a process did is added to its
role's total at each sample and stays there when the process ends, so the
counters never go down while the exporter lives.
"""

from __future__ import annotations

import itertools
import math
import os
import threading
from array import array
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from iolens.rundir.timing import TrainingAggregator
from iolens.sources.counters import DiskCounters, DiskSnapshot
from iolens.sources.procfs import CLK_TCK, CpuTimes, ProcIO

BUCKETS_S: tuple[float, ...] = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                                2.5, 5.0, 10.0, 30.0, 60.0)
"""Upper bounds of the data-wait and step-time histograms, in seconds.

From 1 ms (a batch already prefetched) through the 10-100 ms of a loop that
waits on a slow disk, to a minute (a worker start, an epoch boundary on a
cold network filesystem); a data wait past a minute lands in +Inf.
"""

ROLES = ("main", "worker", "other")
VERDICT_WINDOW_S = 60.0
"""The live verdict is drawn from the records of about the last minute."""


@dataclass(frozen=True, slots=True)
class HistogramState:
    """A cumulative histogram at one moment."""

    bounds: tuple[float, ...]
    """Upper bounds in seconds, without +Inf."""
    cumulative: tuple[int, ...]
    """Observations <= each bound, then the total count (the +Inf bucket)."""
    sum_s: float
    """Sum of every observation in seconds."""

    @property
    def count(self) -> int:
        """Observations in all."""
        return self.cumulative[-1]


class Histogram:
    """Counts durations given in nanoseconds into fixed buckets; owned by one thread."""

    def __init__(self, bounds: Sequence[float] = BUCKETS_S) -> None:
        self.bounds = tuple(bounds)
        self._bounds_ns = [round(b * 1e9) for b in self.bounds]
        self._counts = [0] * (len(self.bounds) + 1)
        self._sum_ns = 0

    def observe_ns(self, values: Sequence[int]) -> None:
        """Add observations (nanoseconds); a value equal to a bound counts in that bucket."""
        bounds, counts = self._bounds_ns, self._counts
        for v in values:
            counts[bisect_left(bounds, v)] += 1
        self._sum_ns += sum(values)

    def state(self) -> HistogramState:
        """An immutable copy with cumulative counts, as Prometheus wants them."""
        return HistogramState(self.bounds, tuple(itertools.accumulate(self._counts)),
                              self._sum_ns / 1e9)


@dataclass(frozen=True, slots=True)
class RoleState:
    """What the job's processes of one role did since the recording began."""

    pids: int
    """Processes of this role now."""
    io: ProcIO
    """Bytes read and written, cumulative (processes that ended included)."""
    cpu_s: float
    """CPU seconds, user plus system, cumulative."""


@dataclass(frozen=True, slots=True)
class RankState:
    """The training loop's timing of one rank since the recording began."""

    rank: str
    data_wait: HistogramState
    """How long each ``next()`` on a DataLoader took."""
    step: HistogramState
    """Time between consecutive batches (or step marks)."""
    epochs: int
    """Epochs started."""


@dataclass(frozen=True, slots=True)
class PipelineState:
    """The input pipeline's stages as the DataLoader workers timed them, summed since the
    recording began (NOTE [stage timing] in iolens/training/_hooks.py)."""

    batches: int = 0
    """Batches whose fetch was timed."""
    samples: int = 0
    fetch_s: float = 0.0
    """Wall seconds fetching samples (reading and decoding them)."""
    fetch_cpu_s: float = 0.0
    """The part of ``fetch_s`` on the fetching thread's CPU clock."""
    collate_s: float = 0.0
    idle_s: float = 0.0
    """Seconds the workers waited for indices (the loader ahead of the loop)."""
    files: int = 0
    """Files opened while fetching."""
    handovers: int = 0
    """Batches whose hand-over to the loop was timed."""
    handover_s: float = 0.0
    """Seconds from a worker handing a batch over to the loop having it."""


_PIPELINE_SECONDS = ("fetch_s", "fetch_cpu_s", "collate_s", "idle_s")
_PIPELINE_COUNTS = ("batches", "samples", "files")
"""The keys of a record's ``train.pipeline`` summed into :class:`PipelineState`'s fields of
the same names."""


@dataclass(frozen=True, slots=True)
class ExportState:
    """Everything a scrape reports, as of the latest sample. Never changed once published."""

    samples: int
    """Samples taken so far (0: only the baseline)."""
    time: float
    """Wall-clock time of the sample, epoch seconds."""
    devices: tuple[DiskCounters, ...]
    """Raw counters of the watched devices."""
    roles: Mapping[str, RoleState]
    """The job's process tree by role; empty when no process is watched."""
    cpu: CpuTimes | None
    """The machine's CPU times (clock ticks), cumulative."""
    mem: Mapping[str, int]
    """Page cache, Dirty, Writeback and available memory in bytes (the records' keys)."""
    gpus: tuple[Mapping[str, Any], ...]
    """The latest record's GPU entries (NVML)."""
    ranks: tuple[RankState, ...]
    """Training timing per rank; empty when no training loop is followed."""
    recent: tuple[dict[str, Any], ...]
    """The records of about the last minute, oldest first, for the live verdict."""
    training: bool
    """True when a training loop's timing is followed (``iolens run``)."""
    pipeline: PipelineState = field(default_factory=PipelineState)
    """The input pipeline's stage totals (all zero until a worker's stages are timed)."""
    fuse_waiting: Mapping[str, float] = field(default_factory=dict)
    """FUSE mount that serves the dataset -> requests waiting on its connection, as of the
    latest record; only mounts whose connection could be read."""


@dataclass
class ObservedAggregator(TrainingAggregator):
    """A :class:`TrainingAggregator` that also hands each process's new timings to ``observer``.

    ``observer(pid, data_waits_ns, steps_ns, epochs_started)`` sees the figures
    of one feed; steps are the DataLoader's when the feed had batches, else
    the step marks (as the interval figures choose).
    """

    observer: Callable[[int, list[int], list[int], int], None] | None = None

    def feed(self, pid: int, recs: array[int]) -> None:
        w, s, m, e = len(self.waits), len(self.steps), len(self.marks), self.epochs
        super().feed(pid, recs)
        if self.observer is not None:
            steps = self.steps[s:] or self.marks[m:]
            self.observer(pid, self.waits[w:], steps, self.epochs - e)


@dataclass
class _RoleTotals:
    pids: int = 0
    io: ProcIO = field(default_factory=ProcIO)
    ticks: int = 0


class _RankTotals:
    def __init__(self, rank: str) -> None:
        self.rank = rank
        self.data_wait = Histogram()
        self.step = Histogram()
        self.epochs = 0

    def state(self) -> RankState:
        return RankState(self.rank, self.data_wait.state(), self.step.state(), self.epochs)


class LiveTotals:
    """The cumulative state of a recording, fed by the sampler loop, read by scrapes.

    Every method but :meth:`latest` belongs to the sampler's thread.
    """

    def __init__(self, *, rank: str = "0", interval: float = 1.0, proc_root: str = "/proc",
                 training: bool = True) -> None:
        """``rank``: the rank of timings from a process whose RANK is unknown; ``training``:
        whether training metrics are reported (a loop's timing is followed)."""
        self.default_rank = rank
        self.proc_root = proc_root
        self.training = training
        self._roles = {r: _RoleTotals() for r in ROLES}
        self._job = False
        self._ranks: dict[str, _RankTotals] = {rank: _RankTotals(rank)} if training else {}
        self._rank_of: dict[int, str] = {}
        keep = max(5, min(600, round(VERDICT_WINDOW_S / max(interval, 0.01))))
        self._recent: deque[dict[str, Any]] = deque(maxlen=keep)
        self._samples = 0
        self._pipeline = PipelineState()
        self._lock = threading.Lock()
        self._latest: ExportState | None = None

    # -- fed by the sampler ---------------------------------------------------------

    def aggregator(self) -> ObservedAggregator:
        """The recorder's aggregator, reporting each process's timings here."""
        return ObservedAggregator(observer=self.observe)

    def add_roles(self, totals: Mapping[str, tuple[int, ProcIO, int]]) -> None:
        """One sample of the job: per role, (processes now, I/O since the last sample, CPU
        ticks since the last sample)."""
        self._job = True
        for role, (pids, io, ticks) in totals.items():
            acc = self._roles.setdefault(role, _RoleTotals())
            acc.pids = pids
            # A counter must never go down: a part that came out negative (a pid reused
            # between two samples) adds nothing rather than taking from the total.
            acc.io = acc.io + ProcIO(max(0, io.rchar), max(0, io.wchar), max(0, io.read_bytes),
                                     max(0, io.write_bytes), max(0, io.cancelled_write_bytes))
            acc.ticks += max(0, ticks)

    def observe(self, pid: int, waits_ns: list[int], steps_ns: list[int], epochs: int) -> None:
        """Timings of process ``pid`` just read; counted under the rank of that process."""
        if not self.training or not (waits_ns or steps_ns or epochs):
            return
        rank = self._rank_of.get(pid)
        if rank is None:
            rank = self._rank_of[pid] = _env_rank(self.proc_root, pid) or self.default_rank
        totals = self._ranks.get(rank)
        if totals is None:
            totals = self._ranks[rank] = _RankTotals(rank)
        totals.data_wait.observe_ns(waits_ns)
        totals.step.observe_ns(steps_ns)
        totals.epochs += epochs

    def publish(self, record: dict[str, Any] | None, disk: DiskSnapshot | None,
                watch: Sequence[str], cpu: CpuTimes | None) -> None:
        """Make the state after a sample (``record`` None: the baseline) what scrapes see."""
        if record is not None:
            self._samples += 1
            self._recent.append(record)
            self._add_pipeline(record)
        devices: tuple[DiskCounters, ...] = ()
        if disk is not None:
            devices = tuple(disk.devices[d] for d in watch if d in disk.devices)
        roles = {r: RoleState(v.pids, v.io, v.ticks / CLK_TCK)
                 for r, v in self._roles.items()} if self._job else {}
        rec = record or {}
        state = ExportState(
            samples=self._samples,
            time=float(rec.get("t") or 0.0),
            devices=devices,
            roles=roles,
            cpu=cpu,
            mem=dict(rec.get("mem") or {}),
            gpus=tuple(g for g in rec.get("gpu") or () if "error" not in g),
            ranks=tuple(sorted((t.state() for t in self._ranks.values()),
                               key=lambda s: _rank_key(s.rank))),
            recent=tuple(self._recent),
            training=self.training,
            pipeline=self._pipeline,
            fuse_waiting=_fuse_waiting(rec),
        )
        with self._lock:
            self._latest = state

    def _add_pipeline(self, record: dict[str, Any]) -> None:
        """Add one record's ``train.pipeline`` sums to the totals. Only finite, positive
        figures count: a counter must never go down, whatever a record holds."""
        train = record.get("train")
        p = train.get("pipeline") if isinstance(train, dict) else None
        if not isinstance(p, dict):
            return
        cur = self._pipeline
        add: dict[str, Any] = {}
        for key in _PIPELINE_SECONDS:
            add[key] = getattr(cur, key) + _amount(p.get(key))
        for key in _PIPELINE_COUNTS:
            add[key] = getattr(cur, key) + int(_amount(p.get(key)))
        hand = p.get("handover")
        hand = hand if isinstance(hand, dict) else {}
        add["handovers"] = cur.handovers + int(_amount(hand.get("count")))
        add["handover_s"] = cur.handover_s + _amount(hand.get("sum_s"))
        self._pipeline = PipelineState(**add)

    # -- read by scrapes -----------------------------------------------------------------

    def latest(self) -> ExportState | None:
        """The state of the latest sample, or None before the first; safe from any thread."""
        with self._lock:
            return self._latest


def _amount(value: Any) -> float:
    """``value`` when it is a finite number above zero, else 0."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0.0
    f = float(value)
    return f if math.isfinite(f) and f > 0 else 0.0


def _fuse_waiting(record: dict[str, Any]) -> dict[str, float]:
    """The FUSE requests waiting per mount in ``record``'s ``storage``."""
    storage = record.get("storage")
    out: dict[str, float] = {}
    if not isinstance(storage, dict):
        return out
    for mount, fig in storage.items():
        waiting = fig.get("waiting") if isinstance(fig, dict) else None
        if (isinstance(waiting, int | float) and not isinstance(waiting, bool)
                and math.isfinite(waiting)):
            out[str(mount)] = float(waiting)
    return out


def job_rank(env: Mapping[str, str] | None = None) -> str:
    """The rank of a job from its environment: RANK when it is a whole number, else "0"."""
    value = (env if env is not None else os.environ).get("RANK", "").strip()
    return value if value.isdigit() else "0"


def _env_rank(proc_root: str, pid: int) -> str | None:
    """RANK from /proc/<pid>/environ (torchrun sets it in each rank's process), or None."""
    try:
        with open(os.path.join(proc_root, str(pid), "environ"), "rb") as fh:
            data = fh.read(1 << 20)
    except OSError:
        return None
    for item in data.split(b"\0"):
        if item.startswith(b"RANK="):
            value = item[5:].decode(errors="replace").strip()
            return value if value.isdigit() else None
    return None


def _rank_key(rank: str) -> tuple[int, str]:
    return (int(rank), rank) if rank.isdigit() else (1 << 30, rank)
