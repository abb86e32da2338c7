"""The stage costs of a run (:class:`Figures`) and the steps per second they sustain
(:func:`rate`): each stage's limit as the package's docstring says, the lowest of them the
one that binds, and what the epochs' first batches and the loop's pauses add to each step.
The NOTEs named here and not found here are in iolens/analysis/model/changes.py.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

LIMITS = ("compute", "handover", "workers", "cpu", "storage")
HANDOVER_NAMED = 0.25
"""The loop's limit is named ``handover`` when the hand-over is this share of the loop's
time per step or more: a cheaper hand-over is then what lifts it."""


@dataclass(frozen=True)
class Figures:
    """The stage costs of a run, all in seconds (CPU seconds where said)."""

    steps_per_s: float
    """Measured: batches over the loop's step time."""
    compute_s: float
    """Per step: the step time less the data wait."""
    handover_s: float
    """Per step: the loop's part of next() once the batch was ready."""
    batch: float
    """Samples per batch."""
    workers: int
    fetch_s: float
    """Per sample, wall time of the fetch (dataset[i])."""
    fetch_cpu_s: float
    """Per sample, the part of the fetch on the CPU."""
    collate_s: float
    """Per batch."""
    epoch_start_s: float
    """Per step on average: the wait of the epochs' first batches beyond a step's."""
    cores: float | None
    """Cores the job may use: the machine's less other processes' use (None: unknown)."""
    main_cpu_s: float
    """CPU seconds of the training process per step, less the fetch it does itself."""
    loader_cpu_s: float
    """CPU seconds per batch of making it (the workers', or the loop's own fetch)."""
    storage_sps: float | None = None
    """Samples per second the storage serves at most in this reading pattern (None: not
    known to bind)."""
    first_start_s: float = 0.0
    """The part of ``epoch_start_s`` that is the run's first epoch: the processes and
    workers start and caches are cold in every configuration, so no change removes it."""
    pause_s: float = 0.0
    """Per step on average: the loop's pauses between steps (a checkpoint, a validation
    pass: NOTE [pauses] in iolens.rundir.timing), beyond its compute. No change to the
    input pipeline removes them."""
    pause_each_s: float = 0.0
    """How long one pause is, on average."""
    compute_delay_s: float = 0.0
    """Per step: the part of ``compute_s`` the loop waited for a core, runnable while the
    cores were busy with the workers (NOTE [a loop that waits for a core])."""
    epochs_per_step: float = 0.0
    """Epochs begun per step: how often the pipeline starts empty."""
    fetch_queue_s: float = 0.0
    """Per sample: the part of ``fetch_s`` the workers waited for a core (NOTE [a fetch
    that waits for a core] in iolens/analysis/pipeline.py)."""
    fill: bool = False
    """Workers the run did not have: each epoch's first batch waits for one worker to make
    it whole (NOTE [an epoch's first batch from workers])."""


@dataclass
class Rate:
    """The model's rate for one setting: the lowest limit and what each stage allows."""

    steps_per_s: float
    limit: str
    limits: dict[str, float] = field(default_factory=dict)


def rate(f: Figures, workers: int | None = None) -> Rate:
    """The steps per second ``f``'s pipeline sustains with ``workers`` (default: as run)."""
    n = f.workers if workers is None else max(0, workers)
    lim: dict[str, float] = {}
    loader_cpu = f.loader_cpu_s
    if n == 0:
        fetch = f.batch * f.fetch_s + f.collate_s
        lim["workers"] = _inv(f.compute_s + fetch)
    else:
        loop = f.compute_s + f.handover_s
        name = "handover" if f.handover_s >= HANDOVER_NAMED * loop > 0 else "compute"
        lim[name] = _inv(loop)
        lim["workers"] = n * _inv(f.batch * f.fetch_s + f.collate_s)
    if f.cores is not None:
        lim["cpu"] = f.cores * _inv(f.main_cpu_s + loader_cpu)
    if f.storage_sps is not None and f.batch > 0:
        lim["storage"] = f.storage_sps / f.batch
    limit = min(lim, key=lambda k: lim[k])
    best = lim[limit]
    fill = 0.0
    if f.fill and n and math.isfinite(best) and best > 0:
        # NOTE [an epoch's first batch from workers]
        made = f.batch * f.fetch_s + f.collate_s
        fill = f.epochs_per_step * max(0.0, made + f.compute_s + f.handover_s - 1 / best)
    steps = (1 / (1 / best + f.epoch_start_s + fill + _paused(f, n, limit, best))
             if math.isfinite(best) and best > 0 else 0.0)
    return Rate(steps, limit, {k: round(v, 4) for k, v in lim.items() if math.isfinite(v)})


PREFETCH_BATCHES = 2
"""Batches each worker keeps ready (torch's default prefetch_factor)."""


def _paused(f: Figures, workers: int, limit: str, rate_now: float) -> float:
    """What the pauses cost a step at ``rate_now``. The loop pays each in full where it
    binds; where the workers (or the storage) bind, they go on filling their queue during
    a pause (PREFETCH_BATCHES a worker), and the loop takes those batches without waiting
    after it: that much of each pause is not lost."""
    if not f.pause_s or f.pause_each_s <= 0:
        return f.pause_s
    if limit not in ("workers", "storage") or workers == 0:
        return f.pause_s
    hidden = PREFETCH_BATCHES * workers / rate_now
    return f.pause_s * max(0.0, 1 - hidden / f.pause_each_s)


def _pause_cost(f: Figures) -> float:
    """What the pauses cost a step of ``f`` as it ran (see :func:`_paused`)."""
    if not f.pause_s:
        return 0.0
    r = rate(dataclasses.replace(f, pause_s=0.0, epoch_start_s=0.0))
    return _paused(f, f.workers, r.limit, r.steps_per_s)


def _inv(x: float) -> float:
    return 1 / x if x > 0 else math.inf
