"""The stage costs of a run read out of its interval records (:func:`figures`): the loop's
compute, hand-over and waits paired per batch, the fetch and collate of the pipeline's
timing, the CPU a step costs over the intervals that timed steps, the cores the job may
use, and the epochs' starts and the loop's pauses apart from its steady steps; None where
the stages were not timed or the figures are beyond arithmetic.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from iolens.analysis.columns import StageColumns
from iolens.analysis.model.changes import HANDOVER_PRIOR_S
from iolens.analysis.model.stages import Figures
from iolens.analysis.pipeline import Pipeline, pipeline_over

MIN_STEADY_BATCHES = 20
"""Fewer steady batches (not opening an epoch, holding no pause) than this: no prediction."""
FIGURE_MAX = 1e12
"""No stage figure of a real run comes near this (seconds, samples, steps per second)."""
CPU_SKIP_FROM = 4
"""From this many timed intervals on, the first and last are left out of the CPU per step."""


def declared_workers(records: Sequence[dict[str, Any]] | StageColumns,
                     idx: Sequence[int] | None = None) -> int:
    """The DataLoader's num_workers (recorded in the intervals where an epoch starts: NOTE
    [the workers a run declared])."""
    c = records if isinstance(records, StageColumns) else StageColumns.of(records)
    return max((int(c.num_workers[i]) for i in _all(c, idx)), default=0)


"""NOTE [the workers a run declared]: the DataLoader's num_workers is recorded in the
interval in which an epoch starts, and that interval may time no batch: twelve workers on
2 cores took over a second to hand the first one over. The model reads the timed
intervals, and where none of them declared the workers it took the processes that timed a
stage, at most those that made a batch in one interval: 8 or 9 of the 12, which made the
run's own rate 6.2-7.2 steps/s in the model where it measured 8.4-8.6, and each
prediction, calibrated on that, 25-35% high (12 -> 2 workers predicted at 13.8-15.9,
measured 11.4). The verdict gives the model the num_workers its whole run declared."""


def _all(c: StageColumns, idx: Sequence[int] | None) -> Sequence[int]:
    return range(c.n) if idx is None else idx


def figures(records: Sequence[dict[str, Any]] | StageColumns, cpus: int | None,
            storage_sps: float | None = None, workers: int | None = None,
            idx: Sequence[int] | None = None) -> Figures | None:
    """The stage costs over ``records`` (timed intervals of a run, or their columns: then
    over the intervals ``idx``, in that order, by default all), or None where the
    stages were not timed (no pipeline figures) or no step was, or where the figures are
    beyond arithmetic (a damaged record). ``workers``: the run's num_workers (default: as
    declared in ``records``)."""
    try:
        c = records if isinstance(records, StageColumns) else StageColumns.of(records)
        return _figures(c, _all(c, idx), cpus, storage_sps, workers)
    except (ArithmeticError, ValueError):
        return None


def _figures(c: StageColumns, idx: Sequence[int], cpus: int | None,
             storage_sps: float | None, workers: int | None) -> Figures | None:
    pipe = pipeline_over(c, idx)
    batches = step = wait = starts = 0.0
    for i in idx:
        batches += c.batches[i]
        step += c.step_s[i]
        wait += c.wait_s[i]
        starts += c.start_wait_s[i]
    steady = _stepping(c, idx)
    # ... and the intervals in which an epoch began, where there are enough others: the
    # CPU of starting workers (a spawned worker imports torch again) is the epoch start's,
    # which persistent workers do not pay, not the step's.
    calm = [i for i in steady if not c.epochs[i] and not c.pauses[i]]
    if len(calm) >= max(1, len(steady) // 2):
        steady = calm
    secs = cpu_batches = main_cpu = worker_cpu = job_cpu = busy = main_delay = 0.0
    for i in steady:
        s = c.secs[i]
        secs += s
        cpu_batches += c.batches[i]
        main_cpu += c.main_cpu_s[i]
        main_delay += c.main_delay_s[i]
        worker_cpu += c.worker_cpu_s[i]
        job_cpu += c.job_cpu_s[i]
        used = c.used_pct[i]
        if used is not None and cpus:
            busy += cpus * used / 100 * s
    cpu_batches = cpu_batches or batches
    if pipe is None or batches <= 0 or step <= 0 or not pipe.samples:
        return None
    if workers is None:
        workers = declared_workers(c, idx)
    if not workers and not pipe.in_process:
        workers = pipe.processes
    per = pipe.samples / pipe.batches
    fetch = pipe.fetch_s / pipe.samples
    fetch_cpu = min(fetch, pipe.fetch_cpu_s / pipe.samples)
    collate = pipe.collate_s / pipe.batches
    in_process = pipe.in_process and workers == 0
    made_cpu = per * fetch_cpu + collate
    # The training process's CPU beyond its own fetch; the workers' at least what their
    # fetch and collate took on the CPU (they also pickle and wait on queues).
    main_s = main_cpu / cpu_batches
    loader = made_cpu if in_process else max(made_cpu, worker_cpu / cpu_batches)
    main_s = max(0.0, main_s - made_cpu) if in_process else main_s
    handover = _loop_handover(pipe, main_s)
    cores = None
    if cpus and secs > 0:
        others = max(0.0, busy - job_cpu) / secs
        cores = max(0.5, cpus - others)
    # NOTE [epoch starts in the model]: the batches that open an epoch are an epoch
    # start's, not a step's: their step runs from iter() (which starts the workers, or
    # wakes persistent ones) and their wait holds the workers' first fetches. The loop's
    # compute and the typical wait are the other batches' (the loop's records pair each
    # batch's step with its own wait); what the first batches take beyond such a step is
    # the epoch start, spread over the steps. A run's single first batch held 100 ms of
    # worker start in its step: 0.7 ms more compute a batch over a 147-batch starved run.
    n_starts = start_steps = 0.0
    first: tuple[float, float] | None = None
    epochs = sum(c.epochs[i] for i in idx)
    # The loop's pauses (NOTE [pauses]) are left out of its compute and the typical wait
    # as the epoch starts are, and what they take beyond a step is their own stage.
    n_pauses = pause_steps = pause_waits = 0.0
    for i in idx:
        n_pauses += c.pauses[i]
        pause_steps += c.pause_step_s[i]
        pause_waits += c.pause_wait_s[i]
        count = c.start_count[i]
        if count <= 0:
            continue
        n_starts += count
        ss_sum = c.start_step_s[i]
        start_steps += ss_sum
        if first is None:
            first = (ss_sum, count)
    if not n_pauses or batches - n_starts - n_pauses < max(n_pauses, MIN_STEADY_BATCHES):
        n_pauses = pause_steps = pause_waits = 0.0  # pauses that are the loop's pace
    steady_n = batches - n_starts - n_pauses
    if n_starts and steady_n >= n_starts:
        compute = (step - wait - (start_steps - starts) - (pause_steps - pause_waits)) / steady_n
        per_step = compute + (wait - starts - pause_waits) / steady_n
    else:  # epochs of a batch or two: their first batches are the run's pace
        steady_n = batches - n_pauses
        compute = (step - wait - (pause_steps - pause_waits)) / steady_n
        per_step = compute + (wait - pause_waits) / steady_n
        n_starts, first = 0, None
    extra = max(0.0, start_steps - n_starts * per_step) / batches if n_starts else 0.0
    # a pause's own length: its step less its wait, less the loop's compute
    paused = max(0.0, pause_steps - pause_waits - n_pauses * compute) / batches
    each = paused * batches / n_pauses if n_pauses else 0.0
    first_extra = (min(extra, max(0.0, first[0] / first[1] - per_step) / batches)
                   if first is not None else 0.0)
    compute = max(1e-6, compute)
    f = Figures(
        steps_per_s=batches / step,
        compute_s=compute,
        compute_delay_s=min(main_delay / cpu_batches, 0.9 * compute) if workers else 0.0,
        epochs_per_step=epochs / batches,
        fetch_queue_s=0.0 if in_process else pipe.fetch_queue_s / pipe.samples,
        handover_s=handover, batch=per, workers=workers, fetch_s=fetch,
        fetch_cpu_s=fetch_cpu, collate_s=collate, epoch_start_s=extra,
        first_start_s=first_extra, pause_s=paused, pause_each_s=each, cores=cores,
        main_cpu_s=main_s, loader_cpu_s=loader, storage_sps=storage_sps)
    # Absurd figures (a damaged record) give no model rather than an infinite prediction.
    sane = all(math.isfinite(x) and 0 <= x < FIGURE_MAX
               for x in dataclasses.astuple(f) if isinstance(x, float))
    return f if sane and f.steps_per_s > 0 and f.batch > 0 else None


def _loop_handover(pipe: Pipeline, main_cpu_s: float) -> float:
    """The loop's own cost of a hand-over per batch (NOTE [the loop's own hand-over]).
    Workers idle behind the loop hand over batches that are ready: the hand-over is then
    the loop's own work (unpickling, pin_memory), in series with its step. Busy workers
    hand over late, and the figure also holds the worker's sending of the batch and the
    loop's wake-up, which overlap the step once the workers are ahead: that part counts
    at most the training process's CPU per batch (``main_cpu_s``, where known) and
    HANDOVER_PRIOR_S. In between, in proportion to the workers' idle share."""
    h = pipe.handover_s_per_batch or 0.0
    idle = pipe.worker_idle_share
    if idle is None:
        return h
    own = min(h, HANDOVER_PRIOR_S, main_cpu_s) if main_cpu_s > 0 else min(h, HANDOVER_PRIOR_S)
    return idle * h + (1 - idle) * own


"""NOTE [the loop's own hand-over]: the hand-over is timed from the later of the loop's
``next()`` and the worker's handing the batch to its queue, to ``next()``'s return. When
the loop waits for its workers, that span holds the worker's queue thread pickling the
batch into shared memory and writing it, and the loop's wake-up, besides the loop's own
unpickling: once the workers are ahead all of that but the last overlaps the step. A
storage-bound lab run (2 workers, 1 MiB batches, a 5 ms step) timed 1.51 ms a hand-over
while it waited, with 1.05 ms of the training process's CPU per batch; with its data in
RAM its hand-overs took 0.90-1.02 ms. The cache predicted from the hand-over as timed was
12% under what followed (144 steps/s, then 162-166), and 20-21% under in two clean-clone
CI runs (132 for 165-168, 135 for 169); bounded, 155 for the first. The CPU per batch
bounds the loop's part from above (its unpickling and wake-ups are on it); a loop whose
step is on the CPU has far more CPU per batch than any hand-over, and the bound then
leaves the figure as timed. Timed by hand, a bare DataLoader (2 workers, 1 MiB batches)
took 2.1-2.2 ms from a worker's collate to next()'s return for a batch the loop waited
for, and 0.3-0.6 ms in next() for a batch already waiting."""


def _stepping(c: StageColumns, idx: Sequence[int]) -> list[int]:
    """The intervals (of ``idx``) the CPU per step is read from: from the first that timed
    a batch to the last, less those two (NOTE [the CPU of the steps])."""
    timed = [k for k, i in enumerate(idx) if c.batches[i] > 0]
    if not timed:
        return list(idx)
    window = list(idx[timed[0]:timed[-1] + 1])
    return window[1:-1] if len(window) >= CPU_SKIP_FROM else window


"""NOTE [the CPU of the steps]: the CPU a step costs (the loop's and the workers') is the
processes' CPU over the intervals that timed steps, over their batches. Before the first
batch the job imports, lists its dataset and starts its workers, and after the last it
shuts down: none of that is a step's, and the intervals that hold only that are left out,
as are the first and the last that timed batches (they hold the ends of both). A 6-second
lab run spent 3 s before its first batch, one core importing torch and then 6 workers
making their first batches: counted, they put the loop at 26 ms of CPU a step (17 ms with
2 workers), and the job's CPU at 2.1 cores of a 2-core machine."""
