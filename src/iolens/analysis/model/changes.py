"""What each change to the input pipeline (more or fewer workers, a cache, a pack, cheaper
transforms, hand-over or compute, persistent workers) does to the stage costs of a run: a
:data:`Change` maps the run's :class:`Figures` to those after it, which
:func:`~iolens.analysis.model.stages.rate` evaluates again; and the priors for what workers
cost where the run had none, and the loop's wait for a core that a change frees.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from iolens.analysis.model.stages import Figures, rate

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
spans both, its figure the cores' own."""


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
more cores busy than the run did has an interval from the whole loss to none, its figure
the cores' own. That figure once went halfway down the loss where workers were added to a
run without any; the same JPEG case (0 -> 2 persistent workers) then ran over it on the
lab machine as it is now: 41.3 steps/s measured where the cores' own gave 38.0 (the CPU a
step 48.0 ms before and 48.1 after: the loop's own fell by 3.4 ms when the workers took
its fetch over, as much as the priors add), and the prediction bench's 44.7-46.0 where
the halfway figure was 39.7. The CPU-only case (1 -> 2 workers) and a cache of a
throttled disk ran 2-9% over the cores' own."""


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


def cheaper_handover(factor: float, tensors: bool = False, release_s: float = 0.0,
                     write_s: float | None = None) -> Change:
    """The loop's hand-over of a batch times ``factor``, and the CPU it spends on it with
    it; ``tensors``: the change is fewer tensors a batch, and the workers' CPU beyond
    their fetch (the collate and the sending, a tensor at a time) falls by the same factor
    (NOTE [a hand-over's CPU]); ``release_s``: the loop's step gains that much CPU a batch
    (freeing shared memory the batch did not use before: NOTE [a tensor's release] in
    iolens/analysis/verdict/workers.py); ``write_s``: the workers' CPU beyond their fetch
    becomes that, a batch written into shared memory where it was pickled (NOTE [a
    tensor's write])."""
    def apply(f: Figures) -> Figures:
        cut = 1 - factor
        out = dataclasses.replace(
            f, handover_s=f.handover_s * factor, compute_s=f.compute_s + release_s,
            main_cpu_s=f.main_cpu_s - cut * min(f.handover_s, f.main_cpu_s) + release_s)
        if tensors and f.workers:
            beyond = max(0.0, f.loader_cpu_s - f.batch * f.fetch_cpu_s)
            out = dataclasses.replace(out, loader_cpu_s=f.loader_cpu_s - cut * beyond,
                                      collate_s=f.collate_s * factor)
        if write_s is not None and f.workers:
            collate = max(out.collate_s, write_s)
            out = dataclasses.replace(out, loader_cpu_s=f.batch * f.fetch_cpu_s + collate,
                                      collate_s=collate)
        return out
    return apply


"""NOTE [a hand-over's CPU]: the loop's hand-over is its own CPU where the workers are
ahead (receiving the handles and mapping them, or unpickling: NOTE [the loop's own
hand-over] in iolens/analysis/model/records.py), and a cheaper one frees that CPU for the
workers: the training process's CPU per batch falls with it. Two lab runs on 2 cores, 2
workers: 4 MiB a batch pickled, then as one tensor, 5.10 -> 0.80 ms of the loop's CPU a
batch (the hand-over 7.62 -> 1.05 ms); a sample of 16 tensors, then of one, 2.72 -> 0.51
(4.18 -> 0.61). The workers' side depends on what was cut. From 16 tensors to one their
CPU beyond the fetch fell as the loop's, 3.15 -> 0.73 ms a batch (0.23; the collate, a
shared-memory tensor made for each, 0.92 -> 0.22 ms): a tensor costs each side its own
part. From pickled bytes to a tensor it rose, 2.87 -> 3.37 (the collate copies the bytes
into shared memory where the pickling copied them into the pipe): the model makes it the
write of the batch into shared memory (NOTE [a tensor's write]).
Where the CPU bound before, the loop's part alone had the prediction 17-25% under the
run after (CI: 183 predicted for 245 measured, 235 for 349)."""


"""NOTE [a tensor's write]: a batch pickled whole costs its worker the pickling and the
pipe, and what that costs depends on what it holds; returned as tensors it costs the
collate that writes it into shared memory, and that depends on its bytes alone. Four lab
runs on 2 cores, 2 workers, 4 MiB a batch, at 1.0-1.5x the lab's pace: pickled as 4 bytes
objects, 3.5 ms of the workers' CPU a batch beyond the fetch; as 8 NumPy arrays of 512
KiB, 10.2; returned as tensors the default collate stacks (either way, at 1.03-1.05x the
lab's pace), 4.6 in both, of which the collate 4.0-4.1. Kept as it was, the workers'
CPU bound the NumPy case's prediction at 162-179 steps/s where 197-218 were measured
(four runs). So the workers' CPU beyond the fetch is, after, 1.1 ms a MiB at the lab's pace
(rules.HANDOVER_WRITE_MIB_S, scaled by the pace), and the collate at least that: a
collate that costs more (padding, work of its own) is kept, the write in it."""


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
