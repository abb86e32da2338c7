"""The classes of an input-bound run (storage-bound, cpu-bound-input, loader-starved,
handover-bound): which one, its evidence and its advice.
"""

from __future__ import annotations

from typing import Any

from iolens.analysis import model as pm
from iolens.analysis import rules
from iolens.analysis.columns import DeviceLoad, RunColumns, Span, added
from iolens.analysis.pipeline import Pipeline, pipeline_over
from iolens.analysis.verdict.figures import (
    bursty,
    busiest_read,
    ceiling_text,
    d_state_share,
    fetch_d_share,
    handover_share,
    input_windows,
    machine_idle,
    num,
    span_window,
    worker_figures,
)
from iolens.analysis.verdict.remote import network_store, storage_from_inside
from iolens.analysis.verdict.result import Recommendation, Verdict
from iolens.analysis.verdict.storage import (
    packed_text,
    reads_dataset,
    sample_bytes,
    saturated_device,
    served_per_s,
    waits_on_storage,
)
from iolens.analysis.verdict.workers import (
    fetch_text,
    fewer_workers,
    handover_bound,
    raise_workers,
    tune,
    workers_to_add,
)
from iolens.core.words import plural


def input_bound(v: Verdict, meta: dict[str, Any], cols: RunColumns) -> str | None:
    """The input-bound classes. ``cols``: the run's columns (NOTE [columns] in
    iolens/analysis/columns/__init__.py). Returns the words of a close call (NOTE [a close
    call]), for the caveat where the class stands."""
    steps = cols.steps
    share = v.data_wait_share or 0.0
    picks = input_windows(steps)
    span = Span(cols, picks)
    within = span.within()
    window = span_window(span, "input-bound")
    when = f", {window.text()}" if window else ""
    ceiling = ceiling_text(share)
    job_read = added(steps.job_read_b[i] for i in picks)  # the job's, then its helpers'
    job_read += added(b for i in picks for b in steps.helper_b[i])
    workers, worker_cpu = worker_figures(steps, picks)
    declared = max([int(n) for n in steps.num_workers]
                   + [int(num(d, "num_workers")) for d in v.loaders], default=0)
    plain = not declared and any(steps.iterable)
    unseen = workers == 0 and declared > 0  # short-lived workers between two samples
    workers = max(workers, declared) if unseen else workers
    idle = machine_idle(steps, picks)
    cpus = int(meta.get("cpus") or 0)
    # storage: the busiest device the job's reads make up, saturated or slow
    best: tuple[DeviceLoad, float] | None = None
    names = span.devices(within)
    for name in names:
        load = span.load(name, within)
        dev_bytes = load.rkB_s * 1024 * load.secs
        own = min(1.0, job_read / dev_bytes) if dev_bytes > 0 else 0.0
        busy = load.util >= rules.UTIL_SATURATED or (
            load.r_await >= rules.AWAIT_SLOW_MS and load.aqu_sz >= rules.QUEUE_BUSY)
        if busy and own >= rules.JOB_SHARE_OWN and (best is None or load.util > best[0].util):
            best = (load, own)
    d_share = d_state_share(steps, picks)
    # Without device figures nothing says the storage is idle: say it was not measured.
    measured = bool(names)
    storage = "the storage not saturated" if measured else "the storage not measured"
    pipe = pipeline_over(steps, picks, meta)
    # Workers idle half their time keep up, unless their fetch waits for a core (NOTE
    # [idle workers queued for a core] in iolens/analysis/rules.py).
    queued = pipe is not None and (pipe.fetch_queue_share or 0.0) >= rules.FETCH_QUEUED
    idle_workers = (pipe is not None and not queued
                    and (pipe.worker_idle_share or 0.0) >= rules.WORKERS_IDLE)
    # Of the workers' busy time (fetch and collate, the collate counted as CPU): a light
    # read beside a heavy collate is not storage's doing.
    blocked = pipe is not None and (pipe.busy_blocked_share or 0.0) >= rules.FETCH_BLOCKED
    on_cpu = pipe is not None and (1 - (pipe.busy_blocked_share or 0.0)) >= rules.FETCH_CPU
    top = v.storage[0] if v.storage else None
    if top is not None and top.get("kind") == "network" and pipe is not None and (
            best is not None or (blocked and not idle_workers
                                 and reads_dataset(pipe, v.storage))):
        network_store(v, pipe, span, top, best[0] if best is not None else None,
                       share=share, when=when, ceiling=ceiling, workers=workers)
    elif best is not None:
        load, own = best
        # What the fetch did over the time the window's batches took, not its timed
        # intervals alone (NOTE [the time a span's batches took]): the figures the pack's
        # prediction is made of.
        covered = span.covered()
        whole = pipeline_over(span.cols.run, sorted(covered), meta)
        v.cls, v.devices = "storage-bound", [load.name]
        v.evidence.append(
            f"{load.name} {load.util:.0f}% util, r_await {load.r_await:.1f} ms, aqu-sz "
            f"{load.aqu_sz:.1f}, {load.rMB_s:.1f} MB/s in {load.r_s:.0f} reads/s of "
            f"{load.rareq_kib:.0f} KiB, {own * 100:.0f}% of its reads by this job{when}")
        v.evidence.append(f"the loop waited {share * 100:.1f}% of its step time for data")
        if pipe is not None:
            v.evidence.append(fetch_text(whole or pipe))
        saturated_device(v, load, ceiling=ceiling, workers=workers,
                          iterable=any(steps.iterable[i] for i in picks)
                          or any(d.get("iterable") is True for d in v.loaders),
                          packed=packed_text(v, pipe),
                          **_served(span, load.name, v, covered, whole))
    elif (pipe is not None and blocked and not idle_workers
          and waits_on_storage(pipe, span, v.storage,
                               fetch_d_share(steps, picks, pipe.in_process))):
        storage_from_inside(v, pipe, span, share=share, when=when, ceiling=ceiling,
                             workers=workers)
    elif pipe is None and d_share >= rules.D_STATE_SHARE and job_read > 0:
        secs = span.total("secs")
        v.cls = "storage-bound"
        v.devices = busiest_read(span, names)
        v.evidence.append(
            f"the job's processes were blocked on I/O (state D) in {d_share * 100:.0f}% of "
            f"the samples while reading {job_read / max(secs, 1e-9) / 2**20:.1f} MB/s, "
            f"yet no device they read is saturated: the limit is above the device (a cgroup "
            f"I/O throttle, a network or FUSE filesystem){when}")
        v.evidence.append(f"the loop waited {share * 100:.1f}% of its step time for data")
        v.recommendations.append(Recommendation(
            "lift the I/O limit (cgroup io.max / blkio throttle) or copy the dataset to "
            "local storage or RAM first", "reads wait above the block device", ceiling))
    elif pipe is not None and idle_workers and handover_share(pipe, span) >= rules.HANDOVER_SHARE:
        handover_bound(v, pipe, span, share=share, when=when, workers=workers)
    elif (pipe is not None and on_cpu and not idle_workers) or (pipe is None and workers and (
            worker_cpu >= rules.WORKER_CPU_BUSY or (
                worker_cpu >= rules.WORKER_CPU_SOME and idle is not None
                and idle < rules.MACHINE_IDLE_LOW))):
        v.cls = "cpu-bound-input"
        free = cpus * (idle or 0.0) / 100 if cpus else 0.0
        if workers:
            # (their fetch's share on a core or queued for one is what decided: a worker
            # at 24% of a core reads as idle beside it, on a machine with no core free)
            cpu_share = (1 - (pipe.busy_blocked_share or 0.0)) if pipe is not None else None
            v.evidence.append(
                f"{plural(workers, 'DataLoader worker')} at {worker_cpu:.0f}% "
                f"of a core{' each' if workers > 1 else ''}"
                + (f", their fetch and collate on a core or waiting for one "
                   f"{cpu_share * 100:.0f}% of the time" if cpu_share is not None else "")
                + when)
        if idle is not None:
            v.evidence.append(f"the machine's CPUs {100 - idle:.0f}% busy"
                              + (f" ({free:.1f} of {cpus} cores free)" if cpus else ""))
        v.evidence.append(f"the loop waited {share * 100:.1f}% of its step time for data; "
                          + ("the storage is not saturated" if measured
                             else "the storage was not measured"))
        if pipe is not None:
            v.evidence.append(fetch_text(pipe))
        fewer = fewer_workers(v, pipe, workers)
        if fewer is not None:
            v.offer(fewer)
        target = v.model.workers_to_next_limit() if v.model is not None else None
        if fewer is None and target is not None and target > workers:
            v.offer(raise_workers(
                v, workers, target,
                "loading in the main process stops the loop for every batch" if not workers
                else f"{free:.1f} cores are idle while each worker is busy" if free >= 1
                else "the workers' CPU use leaves room", ceiling))
        elif v.model is None and free >= 1:
            v.recommendations.append(Recommendation(
                f"raise num_workers from {workers} to {workers + int(free)}",
                f"{free:.1f} cores are idle while each worker is busy", ceiling,
                change={"num_workers": workers + int(free)}))
        v.offer(v.fix(
            "make the per-sample work cheaper: decode at lower resolution, move augmentation "
            "to the GPU (torchvision.transforms.v2 on tensors, DALI), or pre-process once and "
            "store the result",
            (f"the workers spend {worker_cpu:.0f}% of a core each on CPU work" if workers > 1
             else f"the worker spends {worker_cpu:.0f}% of a core on CPU work")
            if workers else "the CPUs are busy", ceiling, {"fetch_cpu": 0.5},
            pm.cheaper_fetch(0.5), basis=["if the per-sample CPU cost halved"]))
        v.recommendations.append(tune(v))
    else:
        v.cls = "loader-starved"
        if unseen:
            v.evidence.append(f"{plural(workers, 'DataLoader worker')} asked for, none seen at "
                              "work in "
                              f"the samples (each lives shorter than an interval), "
                              f"{storage}{when}")
        elif workers:
            v.evidence.append(f"{plural(workers, 'DataLoader worker')} at {worker_cpu:.0f}% "
                              f"of a core{' each' if workers > 1 else ''}, {storage}{when}")
        elif plain:
            v.evidence.append("the loop iterates a loader that is not a torch DataLoader "
                              "(wrapped with iolens.instrument()): each batch is made in the "
                              f"training process, between its steps{when}")
        else:
            v.evidence.append("no DataLoader worker process: the data is loaded in the "
                              f"training process itself (num_workers=0){when}")
        v.evidence.append(f"the loop waited {share * 100:.1f}% of its step time for data")
        if pipe is not None:
            reads = reads_dataset(pipe, v.storage)
            v.evidence.append(fetch_text(pipe) + (
                "; it reads no dataset file while it waits (a sleep, a remote call, a lock)"
                if blocked and not reads else
                "; the storage it reads answers fast and the workers are seldom blocked on "
                "I/O: they wait on something else (a sleep, a remote call, a lock)"
                if blocked and measured and v.storage else ""))
            if idle_workers:
                v.evidence.append(
                    f"the workers idle {(pipe.worker_idle_share or 0) * 100:.0f}% of their "
                    "time while the loop waits: batches come back in order, so one slow "
                    "batch holds back those made after it")
                v.recommendations.append(Recommendation(
                    "let batches be handed over as they are made: DataLoader(in_order=False) "
                    "(torch 2.6 and later), and a larger prefetch_factor",
                    "the workers wait idle behind a slow batch", ceiling, None,
                    "the model works from each stage's mean cost, not from how batches "
                    "wait behind each other", {"in_order": False}))
        model_target = v.model.workers_to_next_limit() if v.model is not None else None
        target = (model_target if v.model is not None
                  else workers_to_add(workers, worker_cpu, cpus, idle)) or workers
        why_more = (("neither the device nor the workers' CPU is saturated"
                     if measured else
                     "the workers' CPU is not saturated (the device was not measured)")
                    if workers else
                    "loading in the main process stops the loop for every batch")
        if plain:
            v.offer(v.fix(
                "make the batches ahead of the loop: wrap the source in a torch "
                "IterableDataset read by a DataLoader with num_workers, or read ahead in a "
                "background thread (a queue of a few batches)",
                "a plain iterable has no workers: the loop waits for every batch", ceiling,
                {"num_workers": 1}, pm.more_workers(1),
                basis=["one reader ahead of the loop, as one worker"]))
        elif target > workers and v.model is not None:
            v.offer(raise_workers(v, workers, target, why_more, ceiling))
        elif v.model is not None and workers and model_target is None:
            # The model's workers do not bind: one more is the candidate it sizes (offered
            # only if the model predicts it gains; else it is declined with its figure).
            v.offer(raise_workers(v, workers, workers + 1, why_more, ceiling))
        elif target > workers:
            v.recommendations.append(Recommendation(
                f"raise num_workers from {workers} to {target}", why_more, ceiling,
                change={"num_workers": target}))
        bursts = bursty(span)
        if workers and bursts:
            prefetch = max((int(d.get("prefetch_factor") or 2) for d in v.loaders
                            if int(d.get("num_workers") or 0) > 0), default=2)
            action = (f"raise prefetch_factor (batches each worker keeps ready) from "
                      f"{prefetch} to {2 * prefetch}")
            change: dict[str, Any] = {"prefetch_factor": 2 * prefetch}
            if not v.already("persistent_workers", True):
                action += " and set persistent_workers=True"
                change["persistent_workers"] = True
            v.recommendations.append(Recommendation(
                action, bursts, ceiling, None,
                "the model works from each stage's mean cost; bursts are in its interval",
                change))
        if any(steps.has_gpu) and not v.already("pin_memory", True):
            v.recommendations.append(Recommendation(
                "use pin_memory=True in the DataLoader and .to(device, non_blocking=True)",
                "host-to-GPU copies then overlap the step", "overlapped copies", None,
                "the model does not time the host-to-GPU copy", {"pin_memory": True}))
        v.recommendations.append(tune(v))
    if window is not None:
        window.label = v.cls
        v.windows.append(window)
    return close_call(v, pipe, queued=queued) if pipe is not None and best is None else None


def close_call(v: Verdict, pipe: Pipeline, *, queued: bool) -> str | None:
    """NOTE [a close call]: where no device is saturated, the workers' own timing decides
    the class, by two halves. Workers idle half their time or more keep up (handover-bound,
    or loader-starved behind a slow batch); busy workers whose fetch is off the CPU half
    their busy time or more wait (storage-bound, or loader-starved where the storage
    answers fast), and less is a fetch that computes (cpu-bound-input). Runs alike fall
    either side of a half: identical LMDB runs on this shared machine were classed
    loader-starved and cpu-bound-input, with nothing to say the class was unstable.
    Within rules.CLOSE_CALL of the half that decided, the caveat says so (these words,
    unless the run is classed otherwise after: one that hung longer than it trained)."""
    idle, off = pipe.worker_idle_share, pipe.busy_blocked_share
    notes = []
    if not queued and idle is not None and abs(idle - rules.WORKERS_IDLE) < rules.CLOSE_CALL:
        notes.append(f"the workers idle {idle * 100:.0f}% of their time, near the "
                     f"{rules.WORKERS_IDLE * 100:.0f}% that divides workers that keep up "
                     "from busy ones")
    if ((queued or idle is None or idle < rules.WORKERS_IDLE) and off is not None
            and abs(off - rules.FETCH_BLOCKED) < rules.CLOSE_CALL):
        notes.append(f"their fetch off the CPU {off * 100:.0f}% of their busy time, near "
                     f"the {rules.FETCH_BLOCKED * 100:.0f}% that divides a fetch that waits "
                     "from one that computes")
    if not notes:
        return None
    return (f"a close call, {' and '.join(notes)}: a run alike may be classed other than "
            f"{v.cls}")


def _served(span: Span, device: str, v: Verdict, covered: set[int],
            pipe: Pipeline | None) -> dict[str, float]:
    """The samples a second ``device`` served over ``span`` and the bytes a sample the
    dataset holds, over the time the span's batches took (``covered``, its intervals, and
    ``pipe``, the fetch over them: NOTE [the time a span's batches took] in
    iolens/analysis/columns/run.py); none where the run has no model.

    The bytes a sample are what the fetch read through read() calls (rchar), where it
    read so: what the device read holds readahead beyond each sample under a shuffled
    order (92 KiB a 64 KiB row of one HDF5 file in a lab run), which a pack or a block
    read does not read; else (a memory map) what the device read."""
    if v.model is None or v.model.whole is None:
        return {}
    batch = v.model.whole.batch
    n = (pipe.byte_samples or pipe.samples) if pipe is not None else 0
    data = pipe.read_bytes / n if pipe is not None and n and pipe.read_bytes > 0 else 0.0
    return {"served": served_per_s(span, batch, covered),
            "per": data or sample_bytes(span, device, batch, covered)}
