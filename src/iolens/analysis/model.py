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
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from iolens.analysis import resample
from iolens.rundir.rollup import Bucket
from iolens.analysis.pipeline import Pipeline, pipeline
from iolens.analysis.pipeline import amount as _num

LIMITS = ("compute", "handover", "workers", "cpu", "storage")
HANDOVER_NAMED = 0.25
"""The loop's limit is named ``handover`` when the hand-over is this share of the loop's
time per step or more: a cheaper hand-over is then what lifts it."""
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
run's own variation. The table of 2026-12-04 12:58: 3.5% the median over 39 runs of 13
cases, all inside their intervals; the largest, 14.2%, one run of the JPEG case from 6
workers to 2. An earlier table put one run of that case at 32.8% (a rerun held it at
-0.2%): the JPEG cases vary with the shared machine."""
MIN_STEADY_BATCHES = 20
"""Fewer steady batches (not opening an epoch, holding no pause) than this: no prediction."""
TARGET_MARGIN = 1.15
"""Workers are sized for 15% above the next limit: the batches do not all take the mean
time, and a worker short of the rate leaves the loop waiting."""
MAX_WORKERS = 64
"""No more workers than this are advised (each is a process with its own memory)."""
FIGURE_MAX = 1e12
"""No stage figure of a real run comes near this (seconds, samples, steps per second)."""
CPU_SKIP_FROM = 4
"""From this many timed intervals on, the first and last are left out of the CPU per step."""
HANDOVER_PRIOR_S = 0.002
"""A run without workers has no hand-over to measure; a batch of tensors takes about 2 ms
to cross from a worker (a shared-memory descriptor sent over a socket per tensor, and the
loop's wake-up), which the loop then pays per step, on its CPU (NOTE [workers share the
cores])."""
WORKER_BATCH_CPU_PRIOR_S = 0.0016
"""... and a worker spends about 1.6 ms of CPU a batch beyond its fetch and collate (its
index queue, the batch's tensors moved to shared memory and sent)."""
CORES_TOGETHER_LOSS = 0.20
"""Cores kept busy together did up to this much less work each than one busy alone, in the
lab (NOTE [workers share the cores]): none in arithmetic on the CPU, this much in JPEG
decoding. A prediction that keeps more cores busy than the run did has an interval that
spans both; one that adds workers to a run without any is put halfway."""


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


# -- changes: what an action does to the stage costs ----------------------------------


Change = Callable[[Figures], Figures]


"""NOTE [workers share the cores]: a run without workers has not measured what workers
cost beyond the fetch: the loop's CPU to take each batch over (HANDOVER_PRIOR_S) and the
workers' own (WORKER_BATCH_CPU_PRIOR_S), both measured on this project's lab machine with
batches of 4 KiB to 8 MiB of tensors. Their CPU comes from the same cores as the step's:
the ``cpu`` limit (the cores over the CPU a step costs, the loop's and the workers') binds
where the cores are all busy. And cores busy together do less each than one alone (shared
caches and memory, a hypervisor's steal): a JPEG pipeline on 2 cores, 0 -> 2 workers, ran
its workers' fetch at 1.2x the CPU a sample and the job at 1.8 of the 2 cores, 32.5 steps/s
where the cores' own figures gave 38; CPU-only samples lost nothing. So a change that keeps
more cores busy than the run did has an interval from the whole loss to none, and where it
adds workers to a run without any (whose cost beyond the fetch is the priors' above) the
figure is put halfway: the JPEG case ran 12-19% under the cores' own figures, the CPU-only
case (1 -> 2 workers) and a cache of a throttled disk 2-9% over them."""


"""NOTE [an epoch's first batch from workers]: without workers the loop fetches every
batch the same way, the first of an epoch too. With workers, each epoch starts with their
queues empty: its first batch waits for one worker to make it whole (a batch's fetch and
collate), then the loop computes, where steady batches come at the pipeline's pace. So
workers added to a run without any cost each epoch that batch, its compute and hand-over,
less a steady step's time; persistent workers (which the advice sets where the run began
several epochs) start no processes. A run with workers measured its epoch starts already.
Epochs of 12 batches, 5 ms a sample off the CPU, batch 16: 0 -> 5 persistent workers was
predicted at 45.7 steps/s without it and measured at 35.8."""


def more_workers(n: int) -> Change:
    """``n`` workers; from none, the hand-over they bring (HANDOVER_PRIOR_S a batch, of the
    loop's time and its CPU), the workers' CPU beyond the fetch (NOTE [workers share the
    cores]) and each epoch's first batch (NOTE [an epoch's first batch from workers])."""
    def apply(f: Figures) -> Figures:
        if f.workers and 0 < n < f.workers and f.fetch_queue_s > 0 and f.cores:
            # fewer workers queue less for the cores: by how far the processes that want
            # one (the workers, and the loop for its share of the time) outnumber them
            g0 = _queued(f, f.workers)
            k = min(1.0, _queued(f, n) / g0) if g0 > 0 else 1.0
            saved = f.fetch_queue_s * (1 - k)
            out = dataclasses.replace(f, workers=n, fetch_s=f.fetch_s - saved,
                                      fetch_queue_s=f.fetch_queue_s - saved)
            if _sheds_extra_workers(f, n):  # NOTE [workers beyond the cores]
                out = cheaper_fetch(1 - CORES_TOGETHER_LOSS / 2)(out)
            # the epochs' first batches wait for the first fetches, which queue less too
            kept = out.fetch_s / f.fetch_s if f.fetch_s > 0 else 1.0
            return dataclasses.replace(out, epoch_start_s=f.epoch_start_s * kept,
                                       first_start_s=f.first_start_s * kept)
        if f.workers or n == 0:
            return dataclasses.replace(f, workers=n)
        hand = max(f.handover_s, HANDOVER_PRIOR_S)
        return dataclasses.replace(f, workers=n, handover_s=hand, fill=True,
                                   main_cpu_s=f.main_cpu_s + hand - f.handover_s,
                                   loader_cpu_s=f.loader_cpu_s + WORKER_BATCH_CPU_PRIOR_S)
    return apply


def _queued(f: Figures, n: int) -> float:
    """How far ``n`` workers and the loop want more cores than the job has, as the wait for
    a core per second on one (NOTE [fewer workers queue less]): 0 where they fit."""
    if not f.cores:
        return 0.0
    on_cpu = (f.fetch_cpu_s + f.fetch_queue_s) / f.fetch_s if f.fetch_s > 0 else 1.0
    loop = f.steps_per_s * (f.main_cpu_s + f.compute_delay_s)
    return max(0.0, (n * min(1.0, on_cpu) + min(1.0, loop)) / f.cores - 1)


"""NOTE [fewer workers queue less]: processes that want a core more often than there are
cores share them as a fluid: each waits for one in proportion to how far their number
exceeds the cores, D / C - 1, for D processes on C cores. Workers that bind want a core
for the part of their fetch on the CPU or queued for it (not blocked on a read); the loop
for its CPU a step and its own wait for a core, at the run's rate. The wait for a core
left with fewer workers is the run's, scaled by that figure with them over the figure as
run. Counting the loop as always wanting a core (it sleeps, or waits on its batch, most
of a light step) kept a third of six workers' wait when two were left, and predicted
7.7 steps/s from 9.8 for a CPU-bound sample where two workers measured 11.4."""


"""NOTE [workers beyond the cores]: workers that outnumber the job's cores each cost CPU of
their own beyond their samples (switches between them, caches they evict from each other):
six JPEG workers on 2 cores spent 19% more CPU a sample than two. One run does not tell
how much, so a change to as many workers as cores or fewer counts a sample's CPU halfway
down CORES_TOGETHER_LOSS (the cores' loss when kept busy together), and its interval is
wider by that half either way (added to its other errors in quadrature)."""


def _sheds_extra_workers(f: Figures, n: int) -> bool:
    """Whether ``n`` workers are fewer than the run's, and as many as the job's cores or
    fewer, where the run's queued for the cores (NOTE [workers beyond the cores])."""
    return (f.cores is not None and f.fetch_queue_s > 0 and f.workers > f.cores
            and 0 < n < f.workers and n <= max(1, round(f.cores)))


def cached() -> Change:
    """The dataset in RAM: no storage limit, the fetch's blocked part gone (from the
    epochs' first batches too, which wait for the first fetches)."""
    def apply(f: Figures) -> Figures:
        kept = f.fetch_cpu_s / f.fetch_s if f.fetch_s > 0 else 1.0
        return dataclasses.replace(f, storage_sps=None, fetch_s=f.fetch_cpu_s,
                                   epoch_start_s=f.epoch_start_s * kept)
    return apply


def storage_at(samples_per_s: float, fetch_s: float | None = None) -> Change:
    """Storage that serves ``samples_per_s`` (a pack's new ceiling), each sample fetched in
    ``fetch_s``: the epochs' first batches, which wait for the first fetches, shrink with
    the fetch (as in :func:`cached`)."""
    def apply(f: Figures) -> Figures:
        if fetch_s is None:
            return dataclasses.replace(f, storage_sps=samples_per_s)
        kept = min(1.0, fetch_s / f.fetch_s) if f.fetch_s > 0 else 1.0
        return dataclasses.replace(f, storage_sps=samples_per_s, fetch_s=fetch_s,
                                   epoch_start_s=f.epoch_start_s * kept)
    return apply


def cheaper_fetch(factor: float) -> Change:
    """The fetch's CPU cost times ``factor`` (cheaper decode and augmentation)."""
    def apply(f: Figures) -> Figures:
        saved = f.fetch_cpu_s * (1 - factor)
        return dataclasses.replace(f, fetch_cpu_s=f.fetch_cpu_s - saved,
                                   fetch_s=max(0.0, f.fetch_s - saved),
                                   loader_cpu_s=max(0.0, f.loader_cpu_s - f.batch * saved))
    return apply


def cheaper_handover(factor: float) -> Change:
    return lambda f: dataclasses.replace(f, handover_s=f.handover_s * factor)


def cheaper_compute(factor: float) -> Change:
    """The model step's time (and its CPU) times ``factor``."""
    return lambda f: dataclasses.replace(f, compute_s=f.compute_s * factor,
                                         main_cpu_s=f.main_cpu_s * factor,
                                         compute_delay_s=f.compute_delay_s * factor)


"""NOTE [a loop that waits for a core]: where the workers keep the cores busy, the loop's
step waits on a run queue for one (its main thread's run delay, /proc/PID/schedstat), and
its compute as measured holds that wait: a JPEG pipeline's 2 workers on 2 cores stretched
a 27 ms step to 38 ms. A change that takes the workers' CPU away (a cheaper transform,
fewer workers) gives the loop that time back, and how much depends on how busy the workers
leave the cores: as a fluid of processes shares them, the loop (one core's demand while it
computes) waits in proportion to how far the workers' demand W and its own exceed the
cores C, (W + 1) / C - 1. The wait after the change is the run's, scaled by that figure
there over its figure in the run (in proportion to W where the run's figure is none: the
wait came from bursts), at the rate the change reaches. A change that keeps the cores
busier keeps the run's wait: the cores-shared interval (NOTE [workers share the cores])
speaks for it."""


def _contention(f: Figures, workers_cpu: float) -> float:
    if f.cores is None or f.cores <= 0:
        return 0.0
    return max(0.0, (workers_cpu + 1) / f.cores - 1)


def with_freed_cores(before: Figures, after: Figures, workers: int | None = None) -> Figures:
    """``after`` with the loop's wait for a core scaled to the workers' CPU it leaves
    (NOTE [a loop that waits for a core])."""
    delay = after.compute_delay_s
    if delay <= 0 or before.workers == 0 or before.cores is None:
        return after
    w0 = before.steps_per_s * before.loader_cpu_s
    g0 = _contention(before, w0)
    n = after.workers if workers is None else workers

    def kept(k: float) -> Figures:
        return dataclasses.replace(after, compute_s=after.compute_s - delay * (1 - k),
                                   compute_delay_s=delay * k)

    def wait_share(k: float) -> float:  # the share the workers' CPU at that rate leaves
        w1 = rate(kept(k), workers).steps_per_s * after.loader_cpu_s if n else 0.0
        if g0 > 0:
            return min(1.0, _contention(before, w1) / g0)
        return min(1.0, w1 / w0) if w0 > 0 else 1.0

    # The less wait kept, the faster the loop and the busier the workers: wait_share falls
    # as k grows, and the share that agrees with itself is found by halving.
    lo, hi = 0.0, 1.0
    for _ in range(30):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if wait_share(mid) > mid else (lo, mid)
    out = kept((lo + hi) / 2)
    return out


def no_epoch_starts() -> Change:
    """Workers that persist: the epochs after the first start with their workers ready;
    the run's own start stays."""
    return lambda f: dataclasses.replace(f, epoch_start_s=min(f.epoch_start_s,
                                                              f.first_start_s))


# -- from a run's records ---------------------------------------------------------------


def _train(rec: dict[str, Any]) -> dict[str, Any]:
    t = rec.get("train")
    return t if isinstance(t, dict) else {}


def _role(rec: dict[str, Any], role: str) -> dict[str, Any]:
    job = rec.get("job")
    roles = job.get("roles") if isinstance(job, dict) else None
    r = roles.get(role) if isinstance(roles, dict) else None
    return r if isinstance(r, dict) else {}


def declared_workers(records: Sequence[dict[str, Any]]) -> int:
    """The DataLoader's num_workers (recorded in the intervals where an epoch starts)."""
    return max((int(_num(_train(r), "num_workers")) for r in records), default=0)


def figures(records: Sequence[dict[str, Any]], cpus: int | None,
            storage_sps: float | None = None, workers: int | None = None) -> Figures | None:
    """The stage costs over ``records`` (timed intervals of a run), or None where the
    stages were not timed (no pipeline figures) or no step was, or where the figures are
    beyond arithmetic (a damaged record). ``workers``: the run's num_workers (default: as
    declared in ``records``)."""
    try:
        return _figures(records, cpus, storage_sps, workers)
    except (ArithmeticError, ValueError):
        return None


def _figures(records: Sequence[dict[str, Any]], cpus: int | None,
             storage_sps: float | None, workers: int | None) -> Figures | None:
    pipe = pipeline(records)
    batches = step = wait = starts = 0.0
    for r in records:
        t = _train(r)
        batches += _num(t, "batches")
        step += _num(t.get("step"), "sum_s")
        wait += _num(t.get("data_wait"), "sum_s")
        starts += _num(t.get("epoch_start_wait"), "sum_s")
    steady = _stepping(records)
    # ... and the intervals in which an epoch began, where there are enough others: the
    # CPU of starting workers (a spawned worker imports torch again) is the epoch start's,
    # which persistent workers do not pay, not the step's.
    calm = [r for r in steady if not _num(_train(r), "epochs_started")
            and not _num(_train(r).get("pause_step"), "count")]
    if len(calm) >= max(1, len(steady) // 2):
        steady = calm
    secs = cpu_batches = main_cpu = worker_cpu = job_cpu = busy = main_delay = 0.0
    for r in steady:
        s = _num(r, "interval_s")
        secs += s
        cpu_batches += _num(_train(r), "batches")
        main_cpu += _num(_role(r, "main"), "cpu_pct") / 100 * s
        main_delay += _num(_role(r, "main"), "run_delay_pct") / 100 * s
        worker_cpu += _num(_role(r, "worker"), "cpu_pct") / 100 * s
        job_cpu += _num(r.get("job"), "cpu_pct") / 100 * s
        c = r.get("cpu")
        if isinstance(c, dict) and c and cpus:
            busy += cpus * (100 - _num(c, "idle") - _num(c, "iowait")) / 100 * s
    cpu_batches = cpu_batches or batches
    if pipe is None or batches <= 0 or step <= 0 or not pipe.samples:
        return None
    if workers is None:
        workers = declared_workers(records)
    if not workers and not pipe.in_process:
        workers = pipe.processes
    per = pipe.samples / pipe.batches
    fetch = pipe.fetch_s / pipe.samples
    fetch_cpu = min(fetch, pipe.fetch_cpu_s / pipe.samples)
    collate = pipe.collate_s / pipe.batches
    handover = _loop_handover(pipe)
    in_process = pipe.in_process and workers == 0
    made_cpu = per * fetch_cpu + collate
    # The training process's CPU beyond its own fetch; the workers' at least what their
    # fetch and collate took on the CPU (they also pickle and wait on queues).
    main_s = main_cpu / cpu_batches
    loader = made_cpu if in_process else max(made_cpu, worker_cpu / cpu_batches)
    main_s = max(0.0, main_s - made_cpu) if in_process else main_s
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
    epochs = sum(_num(_train(r), "epochs_started") for r in records)
    # The loop's pauses (NOTE [pauses]) are left out of its compute and the typical wait
    # as the epoch starts are, and what they take beyond a step is their own stage.
    n_pauses = pause_steps = pause_waits = 0.0
    for r in records:
        t = _train(r)
        n_pauses += _num(t.get("pause_step"), "count")
        pause_steps += _num(t.get("pause_step"), "sum_s")
        pause_waits += _num(t.get("pause_wait"), "sum_s")
        sw, ss = t.get("epoch_start_wait"), t.get("epoch_start_step")
        count = _num(sw, "count")
        if count <= 0:
            continue
        n_starts += count
        # (records from before the steps were kept: the step taken as the wait)
        ss_sum = _num(ss, "sum_s") if isinstance(ss, dict) else _num(sw, "sum_s")
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


def _loop_handover(pipe: Pipeline) -> float:
    """The loop's own cost of a hand-over per batch. Workers idle behind the loop hand
    over batches that are ready: the hand-over is then the loop's own work (unpickling,
    pin_memory), in series with its step. Busy workers hand over late, and the figure also
    holds the time a worker's queue took to send the batch, which overlaps the other
    workers' batches (a worker busy on the CPU starves its own sending thread of the
    GIL): that part counts at most HANDOVER_PRIOR_S. In between, in proportion to the
    workers' idle share."""
    h = pipe.handover_s_per_batch or 0.0
    idle = pipe.worker_idle_share
    if idle is None:
        return h
    return idle * h + (1 - idle) * min(h, HANDOVER_PRIOR_S)


# -- predictions -------------------------------------------------------------------------


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
        return (f"predicted {self.steps_per_s:.3g} steps/s ({self.low:.3g}-{self.high:.3g}, "
                f"then {self.limit}-bound), now {self.now:.3g}")


"""NOTE [prediction intervals]: a prediction's interval holds two errors. The run's own
variation: the run's intervals (less its first and last, the start-up and the shutdown)
are cut into contiguous blocks of about sqrt(n), each folded into one record as the
long-run buckets are (iolens.analysis.longrun), and the blocks are resampled
(RESAMPLES times, fixed seed); each resample gives the stage costs again, and the
prediction is made from each (its measured rate times what the change does to its model's
rate), so the 5th and 95th percentiles of those predictions are how far the run's
variation moves the figure. Blocks, not intervals, because neighbouring intervals are
alike (a cache warming, a slow stretch of the disk). Each resample keeps the whole run's
epoch starts: how many epochs a run has is its own, not a resample's, and a block that
held a start of seconds would swing the spread by it. And the model's own error: how far
its predictions missed in the lab cases (MODEL_ERROR, or this run's own misfit if larger),
added to each side in quadrature. The basis says both."""


def _stepping(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The intervals the CPU per step is read from: from the first that timed a batch to
    the last, less those two (NOTE [the CPU of the steps])."""
    timed = [i for i, r in enumerate(records) if _num(_train(r), "batches") > 0]
    if not timed:
        return list(records)
    window = list(records[timed[0]:timed[-1] + 1])
    return window[1:-1] if len(window) >= CPU_SKIP_FROM else window


"""NOTE [the CPU of the steps]: the CPU a step costs (the loop's and the workers') is the
processes' CPU over the intervals that timed steps, over their batches. Before the first
batch the job imports, lists its dataset and starts its workers, and after the last it
shuts down: none of that is a step's, and the intervals that hold only that are left out,
as are the first and the last that timed batches (they hold the ends of both). A 6-second
lab run spent 3 s before its first batch, one core importing torch and then 6 workers
making their first batches: counted, they put the loop at 26 ms of CPU a step (17 ms with
2 workers), and the job's CPU at 2.1 cores of a 2-core machine."""


def _folded_blocks(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The run's intervals (less its first and last) in contiguous blocks, each folded into
    one record."""
    pool = _stepping(records)
    n = len(pool)
    if not n:
        return []
    out = []
    for a, z in resample.block_bounds(n, MAX_BLOCKS):
        b = Bucket()
        for r in pool[a:z]:
            try:
                b.add(r)
            except (TypeError, ValueError, AttributeError):
                continue  # (a damaged record: the whole run's figures left it out too)
        if b.n:
            out.append(b.record())
    return out


class Model:
    """The model of one run, with resamples of it for the interval of its predictions."""

    def __init__(self, records: Sequence[dict[str, Any]], cpus: int | None,
                 storage_sps: float | None = None) -> None:
        self.records = list(records)
        self.cpus = cpus
        self.whole = figures(self.records, cpus, storage_sps)
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
        blocks = _folded_blocks(self.records)
        rng = random.Random(SEED)
        for _ in range(RESAMPLES if len(blocks) >= 2 else 0):
            picks = rng.choices(blocks, k=len(blocks))
            # Each resample keeps the run's storage ceiling: a saturated device's rate in
            # a resample is its ceiling there.
            d = figures(picks, cpus, storage_sps, whole.workers)
            if d is None:
                continue
            # its steps without its starts and pauses, with the whole run's
            paced = 1 / d.steps_per_s - d.epoch_start_s - _pause_cost(d)
            self.draws.append(dataclasses.replace(
                d, epoch_start_s=whole.epoch_start_s, first_start_s=whole.first_start_s,
                pause_s=whole.pause_s, pause_each_s=whole.pause_each_s,
                steps_per_s=1 / (max(paced, 1e-9) + whole.epoch_start_s
                                 + _pause_cost(whole))))

    def steady_batches(self) -> int:
        """Batches timed that did not open an epoch or hold a pause."""
        n = starts = 0.0
        for r in self.records:
            t = _train(r)
            n += _num(t, "batches")
            starts += _num(t.get("epoch_start_wait"), "count")
            starts += _num(t.get("pause_step"), "count")
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
            if self.whole.workers == 0 and change(self.whole).workers > 0:
                # from none, what workers cost is the priors' (NOTE [workers share the
                # cores]): the figure goes halfway
                point *= 1 - CORES_TOGETHER_LOSS / 2
                shared += (f"; from no workers the figure is {CORES_TOGETHER_LOSS * 50:.0f}% "
                           "below the cores' own")
            how += "; " + shared
        kept = [_pauses_text(self.whole)] if self.whole.pause_s else []
        return Prediction(point, low, high, after.limit,
                          [*basis, *kept, _limits_text(after), how], self.whole.steps_per_s)

    def _cores_shared(self, after: Figures, point: float) -> str | None:
        """Where the change keeps more cores busy than the run did, and most of the job's
        cores: the words for it (NOTE [workers share the cores]), else None."""
        f = self.whole
        if f is None or f.cores is None:
            return None
        now = f.steps_per_s * (f.main_cpu_s + f.loader_cpu_s)
        then = point * (after.main_cpu_s + after.loader_cpu_s)
        if then < now + 0.5 or then < 0.75 * f.cores:
            return None
        return (f"the loop and the workers would keep {then:.1f} of the job's {f.cores:.1f} "
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
