"""The samples of one run that the comparison draws on: every batch's step time and data
wait from its timing files (:func:`read_batches`, thinned to every k-th batch above
:data:`MAX_BATCHES`), or its per-interval sums of batches, step time, data wait, device and
job figures from records.jsonl (:func:`interval_samples`). It decides which figures a run
offers and how damaged or missing ones are left out, never how two runs differ."""

from __future__ import annotations

import math
import os
from array import array
from dataclasses import dataclass, field

from iolens.analysis.columns import DeviceColumns, StageColumns
from iolens.rundir import records as trecords
from iolens.rundir.timing import TrainingAggregator, timing_pid

MAX_BATCHES = 200_000
"""Above this many batches a run is thinned to every k-th batch."""
_CHUNK = trecords.RECORD_BYTES * 65536


@dataclass
class BatchSamples:
    """One run's batches in the order they were handed to the loop (times in ns)."""

    steps: list[int]
    waits: list[int]
    total: int
    """Batches in the timing files (before thinning)."""
    every: int = 1
    """One batch in ``every`` was kept."""
    skipped: int = 0
    """Damaged timing records left out (see TrainingAggregator.skipped)."""
    firsts: list[int] = field(default_factory=list)
    """Indices (into ``steps``) of the batches that opened an epoch."""


def read_batches(run_path: str, cap: int = MAX_BATCHES) -> BatchSamples | None:
    """Every batch's step time and data wait from ``<run>/timing/*.bin``, or None.

    Batches of several processes are merged by the time they were handed over.
    Above ``cap`` batches only every k-th batch of each process is kept.
    """
    tdir = os.path.join(run_path, "timing")
    try:
        names = sorted(n for n in os.listdir(tdir) if timing_pid(n) is not None)
        size = sum(os.path.getsize(os.path.join(tdir, n)) for n in names)
    except OSError:
        return None
    every = max(1, math.ceil(size // trecords.RECORD_BYTES / max(1, cap)))
    rows: list[tuple[int, int, int, bool]] = []
    total = skipped = 0
    for name in names:
        pid = int(name[:-4])
        agg = TrainingAggregator()
        seen = 0
        mine: list[tuple[int, int, int, bool]] = []
        try:
            with open(os.path.join(tdir, name), "rb") as fh:
                rest = b""
                while chunk := fh.read(_CHUNK):
                    data = rest + chunk
                    whole = len(data) - len(data) % trecords.RECORD_BYTES
                    rest = data[whole:]
                    recs = array("q")
                    recs.frombytes(data[:whole])
                    agg.feed(pid, recs)
                    # The aggregator's own hand-over times: it leaves damaged records out.
                    ends = agg.ends
                    opened = set(agg.firsts)
                    for i, (end, step, wait) in enumerate(zip(ends, agg.steps, agg.waits,
                                                              strict=True)):
                        if (seen + i) % every == 0:
                            mine.append((end, step, wait, i in opened))
                    seen += len(ends)
                    agg.ends.clear()
                    agg.steps.clear()
                    agg.waits.clear()
                    agg.marks.clear()
                    agg.epoch_start_waits.clear()
                    agg.epoch_start_steps.clear()
                    agg.firsts.clear()
        except OSError:
            continue  # a file that cannot be read is left out whole
        rows += mine
        total += seen
        skipped += agg.skipped
    if not rows:
        return None
    rows.sort()
    return BatchSamples([r[1] for r in rows], [r[2] for r in rows], total, every, skipped,
                        [i for i, r in enumerate(rows) if r[3]])


@dataclass
class IntervalSamples:
    """Per-interval sums of one run, in time order; each list has one entry per interval."""

    secs: list[float]
    batches: list[float]
    step_s: list[float]
    wait_s: list[float]
    timed: int
    """Intervals with timed DataLoader batches."""
    devices: dict[str, dict[str, list[float]]]
    """Per device: util x s, MB read, read count, read count x r_await, seconds present."""
    job_mb: list[float]
    job_secs: list[float]
    opened: list[int] = field(default_factory=list)
    """Indices of the intervals in which an epoch began."""


def interval_samples(c: StageColumns, devices: dict[str, DeviceColumns]) -> IntervalSamples:
    """The per-interval figures the comparison draws on, from the run's columns ``c`` and
    its devices' (NOTE [columns] in iolens/analysis/columns/__init__.py)."""
    n = c.n
    out = IntervalSamples([], [], [], [], 0, {}, [], [])
    for name, d in devices.items():
        dv = out.devices[name] = {k: [0.0] * n for k in ("util", "mb", "reads", "wait", "secs")}
        for k, i in enumerate(d.at):
            dv["util"][i] = d.util_s[k]
            dv["mb"][i] = d.rkb[k] / 1024
            dv["reads"][i] = d.r_ios[k]
            dv["wait"][i] = d.r_wait[k]
            dv["secs"][i] = d.secs[k]
    for i in range(n):
        s = c.secs[i]
        out.secs.append(s)
        timed = c.loader[i] and c.batches[i] > 0
        out.batches.append(float(c.step_count[i]) if timed else 0.0)
        out.step_s.append(c.step_s[i] if timed else 0.0)
        out.wait_s.append(c.wait_s[i] if timed else 0.0)
        out.timed += timed
        if timed and c.epochs[i] > 0:
            out.opened.append(i)
        out.job_mb.append(c.job_read_b[i] / 2**20 if c.has_job[i] else 0.0)
        out.job_secs.append(s if c.has_job[i] else 0.0)
    return out
