"""Two runs side by side: :func:`compare_runs` reads each run's best samples, judges
throughput, step time, data wait and data-wait share (every batch, per-interval figures,
or each run its own when they differ), then each device's and the job's figures over the
intervals, and returns a :class:`Comparison` with both runs' distributions, verdicts and
warnings. It decides which samples and statistics are compared, whether a run is too
short to tell, and whether a run finished cleanly (:func:`unfinished`)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from iolens._errors import IolensError
from iolens.analysis.columns import StageColumns
from iolens.analysis.compare.blocks import (
    RESAMPLES,
    SEED,
    Interval,
    Median,
    RatioOfSums,
    Statistic,
    Strata,
    bootstrap,
    strata,
)
from iolens.analysis.compare.metrics import TRAINING_METRICS, MetricResult, MetricSpec, _round
from iolens.analysis.compare.samples import (
    MAX_BATCHES,
    BatchSamples,
    IntervalSamples,
    interval_samples,
    read_batches,
)
from iolens.analysis.proof import prove
from iolens.analysis.rundata import RunData
from iolens.analysis.verdict import Verdict, diagnose
from iolens.rundir.timing import distribution

MIN_SAMPLES = 20
"""Fewer batches (or intervals) than this in either run: too short to tell."""

BATCHES = "every batch"
INTERVALS = "per-interval figures"
MIXED = "mixed"
"""The comparison's source when one run has every batch and the other per-interval figures."""


@dataclass
class RunSide:
    """What the comparison read from one run."""

    path: str
    source: str
    """Where this run's step and data-wait figures came from: BATCHES or INTERVALS."""
    batches: int
    """Timed batches (timing files or interval records)."""
    intervals: int
    every: int
    exit_code: Any
    notes: list[str]
    verdict: dict[str, Any]
    distributions: dict[str, Any]
    settings: dict[str, Any] | None = None
    """The DataLoader settings the run was given with ``iolens run --set``."""
    set_loaders: list[str] | None = None


@dataclass
class Comparison:
    """Two runs side by side."""

    base: RunSide
    new: RunSide
    source: str
    """Where step and data-wait samples came from: BATCHES or INTERVALS (both runs), or
    MIXED (each run's own: see ``base.source`` and ``new.source``)."""
    metrics: list[MetricResult]
    warnings: list[str] = field(default_factory=list)
    resamples: int = RESAMPLES
    seed: int = SEED
    proof: dict[str, Any] | None = None
    """BEFORE's prediction for the change NEW made, against what NEW measured
    (iolens.analysis.proof)."""

    @property
    def class_changed(self) -> bool:
        return bool(self.base.verdict.get("class") != self.new.verdict.get("class"))


def _dist_exact(b: BatchSamples) -> dict[str, Any]:
    def shaped(values: list[int]) -> dict[str, Any]:
        d = distribution(values)
        n = d["count"]
        return {"count": n, "mean_s": _round(d["sum_s"] / n) if n else None,
                "p50_s": _round(d["p50_s"]), "p95_s": _round(d["p95_s"]),
                "max_s": _round(d["max_s"])}
    step_sum = sum(b.steps)
    return {"source": BATCHES, "step": shaped(b.steps), "data_wait": shaped(b.waits),
            "steps_per_s": _round(len(b.steps) / step_sum * 1e9, 3) if step_sum else None}


def _weighted_pct(pairs: list[tuple[float, float]], q: float) -> float | None:
    pairs = sorted(p for p in pairs if p[1] > 0)
    total = sum(w for _, w in pairs)
    acc = 0.0
    for v, w in pairs:
        acc += w
        if acc >= q * total:
            return v
    return None


def _dist_intervals(c: StageColumns) -> dict[str, Any]:
    timed = [i for i in range(c.n) if c.loader[i] and c.batches[i] > 0]
    out: dict[str, Any] = {"source": INTERVALS}
    for part, count, total_s, p50, p95, most in (
            ("step", c.step_count, c.step_s, c.step_p50_s, c.step_p95_s, c.step_max_s),
            ("data_wait", c.wait_count, c.wait_s, c.wait_p50_s, c.wait_p95_s, c.wait_max_s)):
        n = sum(float(count[i]) for i in timed)
        total = sum(total_s[i] for i in timed)
        out[part] = {
            "count": int(n), "mean_s": _round(total / n) if n else None,
            "p50_s": _round(_weighted_pct([(p50[i], float(count[i])) for i in timed], 0.5)),
            "p95_s": _round(_weighted_pct([(p95[i], float(count[i])) for i in timed], 0.95)),
            "max_s": _round(max((most[i] for i in timed), default=0.0)) if timed else None,
        }
    step_sum = sum(c.step_s[i] for i in timed)
    out["steps_per_s"] = _round(out["step"]["count"] / step_sum, 3) if step_sum else None
    return out


def _side(run: RunData, batches: BatchSamples | None, iv: IntervalSamples,
          verdict: Verdict) -> RunSide:
    meta = run.meta
    notes = list(run.notes)
    for st in meta.get("timing") or []:
        if isinstance(st, dict) and st.get("dropped"):
            notes.append(f"process {st.get('pid')} dropped {st['dropped']} timing record(s)")
    if batches is not None and batches.skipped:
        notes.append(f"{batches.skipped} damaged timing record(s) were skipped")
    if batches is not None:  # a run's best figures, whatever the other run has
        source, count, every, dist = BATCHES, batches.total, batches.every, _dist_exact(batches)
    else:
        source, count, every = INTERVALS, int(sum(iv.batches)), 1
        dist = _dist_intervals(run.columns)
    dist["same_kind"], dist["note"] = True, None
    given = meta.get("set")
    return RunSide(os.path.abspath(run.path), source, count, len(run.records), every,
                   meta.get("exit_code"), notes, verdict.to_dict(), dist,
                   dict(given) if isinstance(given, dict) and given else None,
                   [str(n) for n in meta.get("set_loaders") or []] or None)


def _judge(res: MetricResult, ci: Interval | None, short: str | None) -> None:
    s = res.spec
    b, n = res.base, res.new
    if b is None or n is None:
        res.why_unknown = "the figure is missing in " + (
            "both runs" if b is None and n is None else "BASE" if b is None else "NEW")
        return
    if s.points:
        res.change = (n - b) * 100
    elif b > 0:
        res.change = (n / b - 1) * 100
    elif n == 0:  # zero in both runs (sums of figures that are never negative): no change
        res.change, res.ci_low, res.ci_high, res.real = 0.0, 0.0, 0.0, False
        return
    else:
        res.why_unknown = "BASE is zero"
        return
    if short:
        res.why_unknown = short
        return
    if ci is None:
        res.why_unknown = "too few resamples give a value"
        return
    if s.points:
        res.ci_low, res.ci_high = ci.low * 100, ci.high * 100
        res.real = ci.low > 0 or ci.high < 0
    else:
        res.ci_low, res.ci_high = (ci.low - 1) * 100, (ci.high - 1) * 100
        res.real = ci.low > 1 or ci.high < 1


def _too_short(nb: int, nn: int, what: str | tuple[str, str]) -> str | None:
    """Why the runs are too short to tell, or None; ``what`` names the samples (per run)."""
    if min(nb, nn) >= MIN_SAMPLES:
        return None
    if isinstance(what, str):
        return f"too few {what} ({nb} in BASE, {nn} in NEW; {MIN_SAMPLES} needed in each)"
    return (f"too few samples ({nb} {what[0]} in BASE, {nn} {what[1]} in NEW; {MIN_SAMPLES} "
            "needed in each)")


def _compare_set(specs: list[MetricSpec], stats: list[tuple[Statistic, Statistic]],
                 counts: tuple[int, int], *, source: str, what: str | tuple[str, str],
                 results: list[MetricResult], seed: str, resamples: int,
                 blocks: tuple[Strata, Strata]) -> None:
    """Judge metrics whose statistics share one block structure per run (``blocks``)."""
    nb, nn = counts
    short = _too_short(nb, nn, what)
    todo = []
    for spec, (sb, sn) in zip(specs, stats, strict=True):
        res = MetricResult(spec, source, sb.value(), sn.value(), (nb, nn))
        results.append(res)
        todo.append((res, sb, sn))
    cis: list[Interval | None] = [None] * len(todo)
    if not short and todo:
        cis = bootstrap([t[1] for t in todo], [t[2] for t in todo], blocks[0].sizes,
                        blocks[1].sizes,
                        ratio=[not t[0].spec.points for t in todo], seed=seed,
                        resamples=resamples)
    for (res, _, _), ci in zip(todo, cis, strict=True):
        _judge(res, ci, short)
        if res.spec.points:  # shares are judged as fractions, shown in percent
            res.base = None if res.base is None else res.base * 100
            res.new = None if res.new is None else res.new * 100


def _batch_strata(b: BatchSamples) -> Strata:
    return strata(len(b.steps), b.firsts)


def _interval_strata(iv: IntervalSamples) -> Strata:
    return strata(len(iv.secs), iv.opened)


def _batch_stats(b: BatchSamples, *, median: bool = True) -> list[Statistic]:
    """The training statistics of every batch; the step time as a median, or (``median``
    false, against a run of per-interval figures) as the mean."""
    st = _batch_strata(b)
    bounds = st.bounds
    steps, waits = st.arrange(b.steps), st.arrange(b.waits)
    ones = [1.0] * len(steps)
    step: Statistic = (_Scaled(Median(steps, bounds), 1e-9) if median          # median, s
                       else RatioOfSums([s / 1e9 for s in steps], ones, bounds))  # mean, s
    return [
        RatioOfSums([1e9] * len(steps), steps, bounds),         # steps per second
        step,
        RatioOfSums([w / 1e9 for w in waits], ones, bounds),     # mean data wait, s
        RatioOfSums(waits, steps, bounds),                       # data-wait share
    ]


def _interval_train_stats(iv: IntervalSamples) -> list[Statistic]:
    st = _interval_strata(iv)
    bounds = st.bounds
    batches, step_s, wait_s = st.arrange(iv.batches), st.arrange(iv.step_s), st.arrange(iv.wait_s)
    return [
        RatioOfSums(batches, step_s, bounds),
        RatioOfSums(step_s, batches, bounds),
        RatioOfSums(wait_s, batches, bounds),
        RatioOfSums(wait_s, step_s, bounds),
    ]


class _Scaled(Statistic):
    def __init__(self, inner: Statistic, factor: float) -> None:
        self.inner, self.factor = inner, factor

    def value(self) -> float | None:
        v = self.inner.value()
        return None if v is None else v * self.factor

    def resampled(self, picks: Sequence[int]) -> float | None:
        v = self.inner.resampled(picks)
        return None if v is None else v * self.factor


def _device_specs(name: str) -> list[MetricSpec]:
    return [
        MetricSpec(f"device:{name}:util", f"{name} %util", "%", "time-weighted mean", None,
                   "higher", "lower", device=name),
        MetricSpec(f"device:{name}:r_await", f"{name} r_await", "ms", "read-weighted mean",
                   "lower", "longer", "shorter", device=name),
        MetricSpec(f"device:{name}:read_MBps", f"{name} read MB/s", "MB/s",
                   "time-weighted mean", None, "higher", "lower", device=name),
    ]


def _device_stats(iv: IntervalSamples, name: str) -> list[Statistic]:
    st = _interval_strata(iv)
    d = {k: st.arrange(v) for k, v in iv.devices[name].items()}
    bounds = st.bounds
    return [RatioOfSums(d["util"], d["secs"], bounds), RatioOfSums(d["wait"], d["reads"], bounds),
            RatioOfSums(d["mb"], d["secs"], bounds)]


JOB_READ = MetricSpec("job-read", "job read MB/s", "MB/s", "time-weighted mean", None,
                      "higher", "lower")


def compare_batches(base: BatchSamples, new: BatchSamples, *, resamples: int = RESAMPLES,
                    seed: int = SEED) -> list[MetricResult]:
    """Throughput, step time, data wait and data-wait share of two runs' batches."""
    results: list[MetricResult] = []
    specs = list(TRAINING_METRICS.values())
    _compare_set(specs, list(zip(_batch_stats(base), _batch_stats(new), strict=True)),
                 (len(base.steps), len(new.steps)), source=BATCHES, what="batches",
                 results=results, seed=f"{seed}:batches", resamples=resamples,
                 blocks=(_batch_strata(base), _batch_strata(new)))
    return results


def compare_runs(base: RunData, new: RunData, *, resamples: int = RESAMPLES,
                 seed: int = SEED, cap: int = MAX_BATCHES) -> Comparison:
    """Compare NEW against BASE. Raises IolensError when a run holds nothing to compare."""
    sides = []
    for label, run in (("BASE", base), ("NEW", new)):
        batches = read_batches(run.path, cap)
        if not run.records and batches is None:
            raise IolensError(f"{label} {run.path}: the run is empty (no interval records and "
                              "no timed batches)")
        sides.append((batches, interval_samples(run.columns, run.devices)))
    (bb, ib), (bn, inn) = sides
    warnings: list[str] = []
    if _same_dir(base.path, new.path):
        warnings.append("BASE and NEW are the same run directory: each figure is compared "
                        "with itself, so nothing can have changed (NEW is the run after "
                        "the change)")
    # Each run's best figures, independently: every batch where it has them.
    kinds = (BATCHES if bb is not None else INTERVALS, BATCHES if bn is not None else INTERVALS)
    source = kinds[0] if kinds[0] == kinds[1] else MIXED
    results: list[MetricResult] = []
    for label, b in (("BASE", bb), ("NEW", bn)):
        if b is not None and b.every > 1:
            warnings.append(f"{label} has {b.total} batches: one in every {b.every} was used")
    if source == BATCHES:
        assert bb is not None and bn is not None
        results += compare_batches(bb, bn, resamples=resamples, seed=seed)
    else:
        specs = [MetricSpec(s.id, s.label, s.unit, "mean" if s.id == "step-time"
                            else s.statistic, s.better, s.up, s.down, s.points)
                 for s in TRAINING_METRICS.values()]
        stats_b = _batch_stats(bb, median=False) if bb is not None else _interval_train_stats(ib)
        stats_n = _batch_stats(bn, median=False) if bn is not None else _interval_train_stats(inn)
        counts = (len(bb.steps) if bb is not None else ib.timed,
                  len(bn.steps) if bn is not None else inn.timed)
        what: str | tuple[str, str] = "timed intervals"
        if source == MIXED:
            what = ("batches" if bb is not None else "timed intervals",
                    "batches" if bn is not None else "timed intervals")
            which, other = ("BASE", "NEW") if bb is None else ("NEW", "BASE")
            if (ib if bb is None else inn).timed:
                warnings.append(
                    f"{which} has no per-batch timing files: its step time and data wait come "
                    f"from its per-interval figures, {other}'s from every batch; step time is "
                    f"compared as a mean (not a median), and {which}'s p50 and p95 are "
                    f"approximate, not the same kind of figure as {other}'s")
        _compare_set(specs, list(zip(stats_b, stats_n, strict=True)), counts, source=source,
                     what=what, results=results,
                     seed=f"{seed}:train-{'intervals' if source == INTERVALS else 'mixed'}",
                     resamples=resamples,
                     blocks=(_batch_strata(bb) if bb is not None else _interval_strata(ib),
                             _batch_strata(bn) if bn is not None else _interval_strata(inn)))
    for label, b, iv in (("BASE", bb, ib), ("NEW", bn, inn)):
        if b is None and not iv.timed:
            warnings.append(f"{label} has no timed DataLoader batches (no timing/ files and no "
                            "per-interval step figures): its step time, data wait and "
                            "throughput cannot be compared; record it under `iolens run` to "
                            "get them")
    # device and job figures, over the intervals
    ispecs: list[MetricSpec] = []
    istats: list[tuple[Statistic, Statistic]] = []
    for name in (n for n in ib.devices if n in inn.devices):
        ispecs += _device_specs(name)
        istats += list(zip(_device_stats(ib, name), _device_stats(inn, name), strict=True))
    if any(ib.job_secs) and any(inn.job_secs):
        ispecs.append(JOB_READ)
        sb, sn = _interval_strata(ib), _interval_strata(inn)
        istats.append((RatioOfSums(sb.arrange(ib.job_mb), sb.arrange(ib.job_secs), sb.bounds),
                       RatioOfSums(sn.arrange(inn.job_mb), sn.arrange(inn.job_secs),
                                   sn.bounds)))
    if ispecs:
        _compare_set(ispecs, istats, (len(ib.secs), len(inn.secs)), source=INTERVALS,
                     what="intervals", results=results, seed=f"{seed}:intervals",
                     resamples=resamples, blocks=(_interval_strata(ib), _interval_strata(inn)))
    for label, run in (("BASE", base), ("NEW", new)):
        code = run.meta.get("exit_code")
        if isinstance(code, int) and code != 0:
            warnings.append(f"{label}'s job exited with code {code}")
    vb, vn = (diagnose(run.view, run.meta) for run in (base, new))
    side_b, side_n = _side(base, bb, ib, vb), _side(new, bn, inn, vn)
    if source == MIXED and (ib if bb is None else inn).timed:  # both runs have figures
        _mark_mixed(side_b, side_n)
    thr = next((m.to_dict() for m in results if m.spec.id == "throughput"), None)
    proof = prove(vb, vn, base.columns, new.columns, thr)
    return Comparison(side_b, side_n, source, results, warnings, resamples, seed, proof)


def _same_dir(a: str, b: str) -> bool:
    """Whether the paths ``a`` and ``b`` name one directory (through links, or however
    spelt)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


UNFINISHED_MARK = "the recording did not finish"
"""The start of the note a run's first meta.json carries until the final one replaces it
(iolens.job.run.UNFINISHED)."""


def unfinished(run: RunData) -> str | None:
    """Why ``run`` did not finish cleanly, or None when it did: its job exited non-zero,
    its recording was cut short (iolens stopped before the job), or it timed no batch and
    marked no step. A gate must not pass such a run as "no regression"."""
    meta = run.meta
    code = meta.get("exit_code")
    if isinstance(code, int) and not isinstance(code, bool) and code != 0:
        return f"its job exited with code {code}"
    notes = meta.get("notes") or []
    if isinstance(notes, list) and any(isinstance(n, str) and n.startswith(UNFINISHED_MARK)
                                       for n in notes):
        return "its recording did not finish (iolens was stopped before the job ended)"
    c = run.columns
    timed = sum(c.batches)
    marks = sum(c.step_count[i] for i in range(c.n) if c.marks[i])
    if not timed and not marks:
        return "it timed no batch and marked no step"
    return None


def _mark_mixed(base: RunSide, new: RunSide) -> None:
    """Say, next to both runs' distributions, that their p50 and p95 are not of one kind."""
    exact, approx = ("BASE", "NEW") if base.source == BATCHES else ("NEW", "BASE")
    note = (f"{exact}'s p50 and p95 are over every batch, {approx}'s approximate from its "
            f"per-interval figures ({approx} has no per-batch timing): not the same kind of "
            "figure, do not compare them")
    for side in (base, new):
        side.distributions["same_kind"], side.distributions["note"] = False, note
