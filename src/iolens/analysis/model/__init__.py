"""A model of the input pipeline from one run: what bounds it now, and what a change gives.

The DS-Analyzer idea (Mohan et al., VLDB 2021) without its extra runs: the run's own
stage timing (iolens.analysis.pipeline) gives the cost of each stage, and the
throughput is the lowest of the rates the stages can sustain. In batches (steps) per
second, with ``b`` samples per batch and ``N`` workers:

- ``compute``: the loop alone, 1 / (c + h): the step less its data wait (c), plus the
  hand-over of each batch (h: the queue, unpickling, pin_memory), which the loop does
  itself between two steps. Named ``handover`` where h is a quarter of it or more.
- ``workers``: N / (b * f + k), each worker making one batch at a time: the fetch of a
  sample (f, wall time: on CPU and blocked) and the collate (k). With num_workers=0
  the loop fetches too, in series with its step: 1 / (c + b * f + k).
- ``cpu``: the cores the job may use (the machine's, less what other processes use)
  over the CPU a step costs: the training process's own and the workers' per batch.
- ``storage``: what serves the dataset, in samples per second over ``b``, where it is
  known to bind (a saturated device serves no more in the same pattern; a probe of
  the storage gives its ceilings in requests and in bytes).

The epochs' first batches (workers started anew) add their wait to each step on
average. A change (more workers, a cache, a pack, cheaper transforms or hand-over,
persistent workers) changes some stage costs; the throughput after it is the model
evaluated again. The interval comes from the spread of the same prediction over
parts of the run, widened by how far the model's rate for the run as it was is from
the measured one.

Its modules, each imports only those below it:

- ``predict``: the model of one run (:class:`Model`), its predictions and their intervals,
  and the workers that reach the next limit.
- ``records``: the stage costs read out of a run's interval records (:func:`figures`).
- ``changes``: what each change to the input pipeline does to the stage costs.
- ``stages``: the stage costs (:class:`Figures`) and the rate they sustain (:func:`rate`).
"""

from __future__ import annotations

from iolens.analysis.model.changes import (
    CORES_TOGETHER_LOSS,
    HANDOVER_PRIOR_S,
    WORKER_BATCH_CPU_PRIOR_S,
    Change,
    cached,
    cheaper_compute,
    cheaper_fetch,
    cheaper_handover,
    more_workers,
    no_epoch_starts,
    storage_at,
    with_freed_cores,
)
from iolens.analysis.model.predict import (
    CONFIDENCE,
    MAX_BLOCKS,
    MAX_WORKERS,
    MODEL_ERROR,
    RESAMPLES,
    SEED,
    TARGET_MARGIN,
    Model,
    Prediction,
    basis_of,
)
from iolens.analysis.model.records import (
    CPU_SKIP_FROM,
    FIGURE_MAX,
    MIN_STEADY_BATCHES,
    declared_workers,
    figures,
)
from iolens.analysis.model.stages import (
    HANDOVER_NAMED,
    LIMITS,
    PREFETCH_BATCHES,
    Figures,
    Rate,
    rate,
)

__all__ = [
    "CONFIDENCE",
    "CORES_TOGETHER_LOSS",
    "CPU_SKIP_FROM",
    "FIGURE_MAX",
    "HANDOVER_NAMED",
    "HANDOVER_PRIOR_S",
    "LIMITS",
    "MAX_BLOCKS",
    "MAX_WORKERS",
    "MIN_STEADY_BATCHES",
    "MODEL_ERROR",
    "PREFETCH_BATCHES",
    "RESAMPLES",
    "SEED",
    "TARGET_MARGIN",
    "WORKER_BATCH_CPU_PRIOR_S",
    "Change",
    "Figures",
    "Model",
    "Prediction",
    "Rate",
    "basis_of",
    "cached",
    "cheaper_compute",
    "cheaper_fetch",
    "cheaper_handover",
    "declared_workers",
    "figures",
    "more_workers",
    "no_epoch_starts",
    "rate",
    "storage_at",
    "with_freed_cores",
]
