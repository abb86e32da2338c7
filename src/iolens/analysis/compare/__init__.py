"""Comparing two recorded runs: is NEW slower than BASE, beyond the run's own noise?

Pure and dependency-free (the standard library only). :func:`compare_runs`
takes two loaded runs and returns a :class:`Comparison`; :func:`parse_fail_on`
and :func:`evaluate_gate` turn ``--fail-on`` bounds into a pass or fail.

Samples
    Each run's step time and data wait come from the best figures *that run*
    has, independently of the other: every batch in ``timing/*.bin`` when it
    has them (read through :class:`~iolens.rundir.timing.
    TrainingAggregator`, so a batch's step and wait mean exactly what they mean
    in ``iolens report``), merged across processes in the order the batches
    were handed over. Above :data:`MAX_BATCHES` batches, every k-th batch is
    kept (deterministic thinning) so the comparison stays fast. A run without
    them is read from its per-interval figures in records.jsonl (count, sum of
    step time, sum of data wait per interval). When the two runs' sources
    differ (:data:`MIXED`), the compared statistics stay of one kind (step time
    as a mean, which both sources give exactly), and the side's p50 and p95,
    which are exact over every batch but approximate from the intervals, carry
    a note saying they are not the same kind of figure. Device and job figures
    always come from the interval records.

Statistics
    - throughput: batches / total step time (steps per second);
    - step time: the median of every batch's step time (when a run has only
      per-interval figures: the mean, total step time / batches, in both runs,
      as the intervals carry no batches);
    - data wait: the mean per batch, because with prefetching workers most
      batches wait almost nothing and the cost sits in bursts a median misses;
    - data-wait share: total data wait / total step time, compared as a
      difference in percentage points;
    - per device present in both runs: %util and MB/s read (time-weighted over
      the intervals) and r_await (weighted by reads); the job's read MB/s.

Is a difference real?
    Each run's samples are cut into contiguous blocks and a percentile
    bootstrap confidence interval (95%, 2000 resamples, fixed seeds, so the
    same two runs always give the same answer) is drawn for NEW/BASE (or for
    NEW - BASE for the share), resampling blocks of each run independently.
    Blocks, not single batches, because neighbouring batches are not
    independent: a slow stretch of the disk, a page cache that warms up, a
    worker queue that drains and refills all make consecutive batches alike.
    Resampling single batches would treat a 30 s slow patch as hundreds of
    independent pieces of evidence and call nearly any difference "real" in a
    long run; resampling whole blocks keeps such stretches together, so the
    interval is as wide as the run's slow drifts make it. Blocks hold about
    sqrt(n) samples (n batches or intervals), at least 5 and at most
    :data:`MAX_BLOCKS` blocks per run. The batches that opened an epoch are resampled
    apart from the steady ones, so that each resample holds as many as the run had (NOTE
    [epoch starts apart]). A difference is *real* when its interval
    excludes no change. A rank test (Mann-Whitney U) is not used: it assumes
    independent batches and would be overconfident for the same reason.

    Two single runs cannot show how much a third run would differ (the
    machine's state between runs); the ``--fail-on`` threshold is the margin for
    that: a bound is crossed only when the regression is larger than the
    threshold *and* real. Runs with fewer than :data:`MIN_SAMPLES` samples are
    too short to tell: their bounds are reported as such, and count as passed
    unless the gate is strict.

Its modules, each imports only those below it:

- ``gate``: the ``--fail-on`` bounds, the gate's results and exit code; the JSON object.
- ``comparison``: two runs compared, metric by metric; whether a run finished cleanly.
- ``metrics``: what a metric is, and one metric's result over both runs.
- ``blocks``: the block bootstrap: blocks, strata, statistics, intervals.
- ``samples``: one run's samples: every batch, or its per-interval figures.
"""

from __future__ import annotations

from iolens.analysis.compare.blocks import (
    CONFIDENCE,
    MAX_BLOCKS,
    MIN_BLOCKS,
    RESAMPLES,
    SEED,
    Interval,
    Median,
    RatioOfSums,
    Statistic,
    Strata,
    block_bounds,
    bootstrap,
    strata,
)
from iolens.analysis.compare.comparison import (
    BATCHES,
    INTERVALS,
    JOB_READ,
    MIN_SAMPLES,
    MIXED,
    UNFINISHED_MARK,
    Comparison,
    RunSide,
    compare_batches,
    compare_runs,
    unfinished,
)
from iolens.analysis.compare.gate import (
    COMPARE_SCHEMA,
    GATE_METRICS,
    RUN_NOISE,
    Bound,
    GateResult,
    evaluate_gate,
    gate_exit,
    parse_fail_on,
    regressed,
    to_dict,
    unjudged,
)
from iolens.analysis.compare.metrics import TRAINING_METRICS, MetricResult, MetricSpec
from iolens.analysis.compare.samples import (
    MAX_BATCHES,
    BatchSamples,
    IntervalSamples,
    interval_samples,
    read_batches,
)

__all__ = [
    "BATCHES",
    "COMPARE_SCHEMA",
    "CONFIDENCE",
    "GATE_METRICS",
    "INTERVALS",
    "JOB_READ",
    "MAX_BATCHES",
    "MAX_BLOCKS",
    "MIN_BLOCKS",
    "MIN_SAMPLES",
    "MIXED",
    "RESAMPLES",
    "RUN_NOISE",
    "SEED",
    "TRAINING_METRICS",
    "UNFINISHED_MARK",
    "BatchSamples",
    "Bound",
    "Comparison",
    "GateResult",
    "Interval",
    "IntervalSamples",
    "Median",
    "MetricResult",
    "MetricSpec",
    "RatioOfSums",
    "RunSide",
    "Statistic",
    "Strata",
    "block_bounds",
    "bootstrap",
    "compare_batches",
    "compare_runs",
    "evaluate_gate",
    "gate_exit",
    "interval_samples",
    "parse_fail_on",
    "read_batches",
    "regressed",
    "strata",
    "to_dict",
    "unfinished",
    "unjudged",
]
