"""The model of one run (:class:`Model`) and its predictions: the throughput after a
change, calibrated on the run's measured rate, with a 90% interval from the run's own
variation (its intervals resampled in blocks) and the model's error, widened where the
change keeps more cores busy; the figures a prediction rests on, in words; and the fewest
workers that reach the next limit. The NOTEs named here and not found here are in
iolens/analysis/model/changes.py.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from iolens.analysis import resample
from iolens.analysis.columns import StageColumns
from iolens.analysis.model.changes import (
    CORES_TOGETHER_LOSS,
    Change,
    _sheds_extra_workers,
    more_workers,
    with_freed_cores,
)
from iolens.analysis.model.records import MIN_STEADY_BATCHES, _stepping, figures
from iolens.analysis.model.stages import Figures, Rate, _pause_cost, rate

CONFIDENCE = 0.90
"""A prediction's ``low``-``high`` is a 90% interval (NOTE [prediction intervals])."""
RESAMPLES = 200
SEED = 20261203
"""Seeds the resampling: the same run always gives the same interval."""
MAX_BLOCKS = 40
"""Blocks of intervals resampled, at most (longer blocks beyond): bounds the work."""
MODEL_ERROR = 0.15
"""The model's own error on the lab cases: about the largest of bench/RESULTS.md's prediction
table (each case's fix followed, three runs after it), which the interval holds beside the
run's own variation. The table of 2026-12-06 07:17: 3.8% the median over 51 runs of 17
cases, all inside their intervals; the largest, -13.4%, one run of NumPy samples kept
apart then handed over as a stacked tensor (the table of 04:23 that day, a slow one for
the machine: 4.5% and -19.3%, one run of the JPEG case from no workers to 2; the one of
2026-12-05 22:01: 4.8% and -14.4%, one run of the case that hands 16 tensors a batch
over; the one of 10:03: 15.7%, the JPEG case from no workers to 2, then predicted 10%
below the cores' own figure; the one before it: 17.9%, a throttled disk's cache). An
earlier table put one run of the JPEG case from 6 workers to 2 at 32.8% (a rerun held it
at -0.2%): the JPEG cases vary with the shared machine."""
TARGET_MARGIN = 1.15
"""Workers are sized for 15% above the next limit: the batches do not all take the mean
time, and a worker short of the rate leaves the loop waiting."""
MAX_WORKERS = 64
"""No more workers than this are advised (each is a process with its own memory)."""


@dataclass
class Prediction:
    """The throughput after one change: the figure, its interval and what then binds."""

    steps_per_s: float
    low: float
    high: float
    limit: str
    basis: list[str]
    now: float
    """The measured rate of the run it was made from."""

    @property
    def gain(self) -> float:
        return self.steps_per_s / self.now if self.now > 0 else 1.0

    def to_dict(self) -> dict[str, Any]:
        return {"steps_per_s": round(self.steps_per_s, 3), "low": round(self.low, 3),
                "high": round(self.high, 3), "limit": self.limit, "basis": self.basis,
                "now_steps_per_s": round(self.now, 3)}

    def text(self) -> str:
        """The figure in words, with the assumption it rests on where it rests on one (its
        basis's "if ...", up to a colon or a bracket: "if the model step took half as
        long")."""
        given = next((b.split(":")[0].split(" (")[0] for b in self.basis
                      if b.startswith("if ")), None)
        return (f"predicted {self.steps_per_s:.3g} steps/s"
                + (f" {given}" if given else "")
                + f" ({self.low:.3g}-{self.high:.3g}, then {self.limit}-bound), "
                f"now {self.now:.3g}")


"""NOTE [prediction intervals]: a prediction's interval holds two errors. The run's own
variation: the run's intervals (less its first and last, the start-up and the shutdown)
are cut into contiguous blocks of about sqrt(n), each folded into one entry of the
columns (NOTE [blocks from the columns]), and the blocks are resampled
(RESAMPLES times, fixed seed); each resample gives the stage costs again, and the
prediction is made from each (its measured rate times what the change does to its model's
rate), so the 5th and 95th percentiles of those predictions are how far the run's
variation moves the figure. Blocks, not intervals, because neighbouring intervals are
alike (a cache warming, a slow stretch of the disk). Each resample keeps the whole run's
epoch starts: how many epochs a run has is its own, not a resample's, and a block that
held a start of seconds would swing the spread by it. And the model's own error: how far
its predictions missed in the lab cases (MODEL_ERROR, or this run's own misfit if larger),
added to each side in quadrature. The basis says both."""


def _blocks(columns: StageColumns) -> StageColumns:
    """The run's intervals (less its first and last) in contiguous blocks, each folded into
    one entry (NOTE [blocks from the columns] in iolens/analysis/columns/stage.py)."""
    pool = _stepping(columns, range(columns.n))
    return columns.folded(pool[a:z] for a, z in resample.block_bounds(len(pool), MAX_BLOCKS))


class Model:
    """The model of one run, with resamples of it for the interval of its predictions."""

    def __init__(self, run: Sequence[dict[str, Any]] | StageColumns, cpus: int | None,
                 storage_sps: float | None = None, workers: int | None = None) -> None:
        self.cpus = cpus
        self.columns = run if isinstance(run, StageColumns) else StageColumns.of(run)
        """The timed intervals' figures (``run``: their records, or their columns, read
        once: NOTE [columns] in iolens/analysis/columns/__init__.py)."""
        self.workers = workers
        """The run's num_workers where the caller read it from more than the timed
        intervals (NOTE [the workers a run declared] in
        iolens/analysis/model/records.py), else as they declare it."""
        self.whole = figures(self.columns, cpus, storage_sps, workers)
        self.unavailable: str | None = None
        """Why the model predicts nothing though it has figures (too few batches)."""
        self.draws: list[Figures] = []
        whole = self.whole
        if whole is None:
            return
        steady = self.steady_batches()
        if steady < MIN_STEADY_BATCHES:
            self.unavailable = (
                f"the run timed {steady} steady batches (not opening an epoch); a prediction "
                f"needs {MIN_STEADY_BATCHES}: {MIN_STEADY_BATCHES - steady} more, a longer run")
            return
        blocks = _blocks(self.columns)
        rng = random.Random(SEED)
        for _ in range(RESAMPLES if blocks.n >= 2 else 0):
            picks = rng.choices(range(blocks.n), k=blocks.n)
            # Each resample keeps the run's storage ceiling: a saturated device's rate in
            # a resample is its ceiling there.
            d = figures(blocks, cpus, storage_sps, whole.workers, picks)
            if d is None:
                continue
            # its steps without its starts and pauses, with the whole run's
            paced = 1 / d.steps_per_s - d.epoch_start_s - _pause_cost(d)
            self.draws.append(dataclasses.replace(
                d, epoch_start_s=whole.epoch_start_s, first_start_s=whole.first_start_s,
                pause_s=whole.pause_s, pause_each_s=whole.pause_each_s,
                steps_per_s=1 / (max(paced, 1e-9) + whole.epoch_start_s
                                 + _pause_cost(whole))))

    def with_storage(self, storage_sps: float) -> Model:
        """This model where the storage serves at most ``storage_sps`` samples a second:
        its figures and resamples with that ceiling (the same as a model built anew with
        it, without reading the run again)."""
        whole = self.whole
        if whole is None or dataclasses.replace(whole, storage_sps=storage_sps) != figures(
                self.columns, self.cpus, storage_sps, self.workers):
            return Model(self.columns, self.cpus, storage_sps, self.workers)
        out = copy.copy(self)
        out.whole = dataclasses.replace(whole, storage_sps=storage_sps)
        out.draws = [dataclasses.replace(d, storage_sps=storage_sps) for d in self.draws]
        return out

    def steady_batches(self) -> int:
        """Batches timed that did not open an epoch or hold a pause."""
        c = self.columns
        n = starts = 0.0
        for i in range(c.n):
            n += c.batches[i]
            starts += c.start_count[i]
            starts += c.pauses[i]
        return max(0, int(n - starts))

    @property
    def now(self) -> Rate | None:
        return rate(self.whole) if self.whole is not None else None

    @property
    def fit(self) -> float | None:
        """How far the model's rate for the run as it was is from the measured one
        (relative), or None without a model."""
        if self.whole is None or self.whole.steps_per_s <= 0:
            return None
        return abs(rate(self.whole).steps_per_s / self.whole.steps_per_s - 1)

    def predict(self, change: Change, workers: int | None = None,
                basis: Sequence[str] = ()) -> Prediction | None:
        """The rate after ``change`` (and ``workers``), or None without a model."""
        if self.whole is None or self.unavailable is not None:
            return None
        after = rate(with_freed_cores(self.whole, change(self.whole), workers), workers)
        # Calibrated on the run itself: the measured rate times what the change does to
        # the model's rate (the model's own error on the run as it was cancels).
        point = self.whole.steps_per_s * _ratio(after, rate(self.whole))
        if not math.isfinite(point) or point <= 0:
            return None
        # NOTE [prediction intervals]
        spread = sorted(x / point for d in self.draws
                        if math.isfinite(x := d.steps_per_s * _ratio(
                            rate(with_freed_cores(d, change(d), workers), workers), rate(d))))
        tail = (1 - CONFIDENCE) / 2
        down = max(0.0, 1 - resample.quantile(spread, tail)) if spread else 0.0
        up = max(0.0, resample.quantile(spread, 1 - tail) - 1) if spread else 0.0
        err = max(MODEL_ERROR, self.fit or 0.0)
        lo, hi = math.hypot(down, err), math.hypot(up, err)
        how = (f"{CONFIDENCE * 100:.0f}% interval: the run's own variation -{down * 100:.0f}%/"
               f"+{up * 100:.0f}% (its intervals resampled in blocks, {len(spread)} times) "
               f"and the model's error of {err * 100:.0f}% "
               + ("on the lab cases" if err == MODEL_ERROR else "on this run as it was"))
        shared = self._cores_shared(change(self.whole), point)
        if _sheds_extra_workers(self.whole, change(self.whole).workers):
            half = CORES_TOGETHER_LOSS / 2
            lo, hi = math.hypot(lo, half), math.hypot(hi, half)
            how += (f"; the workers beyond the cores cost CPU of their own: with fewer, a "
                    f"sample's CPU counted {half * 100:.0f}% lower (0-"
                    f"{CORES_TOGETHER_LOSS * 100:.0f}% seen in the lab), and the interval "
                    f"wider by {half * 100:.0f}% either way")
        low, high = point * max(0.0, 1 - lo), point * (1 + hi)
        if shared is not None:
            low = point * max(0.0, 1 - math.hypot(lo, CORES_TOGETHER_LOSS))
            how += "; " + shared
        kept = [_pauses_text(self.whole)] if self.whole.pause_s else []
        return Prediction(point, low, high, after.limit,
                          [*basis, *kept, _limits_text(after), how], self.whole.steps_per_s)

    def _cores_shared(self, after: Figures, point: float) -> str | None:
        """Where the change keeps more cores busy than the run did, and most of the job's
        cores: the words for it (NOTE [workers share the cores]), else None."""
        f = self.whole
        cores = after.cores
        if f is None or cores is None:
            return None
        now = f.steps_per_s * (f.main_cpu_s + f.loader_cpu_s)
        then = point * (after.main_cpu_s + after.loader_cpu_s)
        if then < now + 0.5 or then < 0.75 * cores:
            return None
        return (f"the loop and the workers would keep {then:.1f} of the job's {cores:.1f} "
                f"cores busy ({now:.1f} now): the workers' CPU comes from the step's cores, "
                f"and cores busy together did 0-{CORES_TOGETHER_LOSS * 100:.0f}% less each "
                "in the lab, which the interval spans")

    def workers_to_next_limit(self) -> int | None:
        """The fewest workers whose rate clears the next limit by TARGET_MARGIN (not a
        doubling), or None when more workers do not lift the rate (workers do not bind)."""
        f = self.whole
        if f is None:
            return None
        now = rate(f)
        if now.limit != "workers":
            return None
        per_batch = f.batch * f.fetch_s + f.collate_s
        others = {k: v for k, v in rate(more_workers(max(1, f.workers))(f)).limits.items()
                  if k != "workers"}
        nxt = min(others, key=lambda k: others[k]) if others else None
        ceiling = others[nxt] if nxt is not None else math.inf
        if not math.isfinite(ceiling) or per_batch <= 0:
            return min(MAX_WORKERS, max(f.workers + 1, 2 * f.workers))
        # Workers beyond the cores only queue for them: no margin where the CPU binds next.
        margin = 1.0 if nxt == "cpu" else TARGET_MARGIN
        want = ceiling * per_batch * margin
        if not math.isfinite(want) or want > MAX_WORKERS:
            return MAX_WORKERS
        need = math.ceil(want - 1e-9)
        return max(f.workers + 1, min(MAX_WORKERS, max(1, need)))


def _pauses_text(f: Figures) -> str:
    return (f"the loop's pauses between steps (a checkpoint, a validation pass) "
            f"{f.pause_s * 1000:.3g} ms a step on average, which no change to the input "
            "pipeline removes")


def _ratio(after: Rate, before: Rate) -> float:
    return after.steps_per_s / before.steps_per_s if before.steps_per_s > 0 else 1.0


def _limits_text(r: Rate) -> str:
    parts = [f"{k} {v:.3g}" for k, v in sorted(r.limits.items(), key=lambda kv: kv[1])]
    return "steps/s each stage allows: " + ", ".join(parts)


def basis_of(f: Figures) -> list[str]:
    """The figures a prediction rests on, in words."""
    out = [f"step {f.compute_s * 1000:.2f} ms without its data wait"
           + (f", hand-over {f.handover_s * 1000:.2f} ms per batch" if f.handover_s else ""),
           f"fetch {f.fetch_s * 1000:.3g} ms per sample ({f.fetch_cpu_s * 1000:.3g} ms on CPU),"
           f" {f.batch:.0f} samples per batch, collate {f.collate_s * 1000:.2f} ms",
           (f"{f.workers} workers" if f.workers else "no workers (num_workers=0)")
           + (f", {f.cores:.1f} cores for the job" if f.cores is not None else "")]
    if f.storage_sps is not None:
        out.append(f"the storage serves at most {f.storage_sps:.0f} samples/s in this pattern")
    if f.pause_s:
        out.append(_pauses_text(f))
    return out
