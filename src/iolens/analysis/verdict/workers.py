"""Advice on the DataLoader's workers: more, fewer, a search for the best settings,
the hand-over and the epochs' first batches.
"""

from __future__ import annotations

import math
from typing import Any

from iolens.analysis import model as pm
from iolens.analysis import rules
from iolens.analysis.columns import Span, StageColumns, added
from iolens.analysis.pipeline import Pipeline
from iolens.analysis.verdict.result import Recommendation, Verdict
from iolens.core.words import plural


def raise_workers(v: Verdict, workers: int, target: int, because: str,
                   ceiling: str) -> Recommendation:
    """More workers, as many as reach the next limit (the model's number, not a doubling);
    from none, in a run that began several epochs, persistent ones (NOTE [an epoch's first
    batch from workers] in iolens/analysis/model/changes.py): workers started anew each epoch cost
    that epoch their start, which the model does not know from a run without them."""
    action, change = f"raise num_workers from {workers} to {target}", {"num_workers": target}
    epochs = added(v.model.columns.epochs) if v.model is not None else 0
    if not workers and epochs >= 2:
        action += " and set persistent_workers=True"
        change["persistent_workers"] = True
    return v.fix(action, because, ceiling, change, pm.more_workers(target),
                 basis=[f"{target} workers, each making a batch in the time one takes now"])

def fewer_workers(v: Verdict, pipe: Pipeline | None, workers: int) -> Recommendation | None:
    """Fewer workers, as many as the job has cores, where more workers than that queue for
    the cores (NOTE [a fetch that waits for a core] in iolens/analysis/pipeline.py): each
    process beyond the cores costs CPU of its own (switches, caches, its epoch start) and
    takes the loop's core from it. The model takes the workers' wait for a core away in
    proportion, and counts a sample's CPU halfway down what the extra workers may cost
    (NOTE [workers beyond the cores] in iolens/analysis/model/changes.py)."""
    f = v.model.whole if v.model is not None else None
    queued = pipe.fetch_queue_share if pipe is not None else None
    if f is None or f.cores is None or queued is None or queued < rules.FETCH_QUEUED:
        return None
    n = max(1, round(f.cores))
    if workers <= n:
        return None
    return v.fix(
        f"lower num_workers from {workers} to {n}",
        f"{plural(workers, 'worker')} on the {f.cores:.1f} cores the job has queue for them: "
        f"{queued * 100:.0f}% of each fetch waited for a core, and the loop "
        f"{f.compute_delay_s * 1000:.1f} ms of its {f.compute_s * 1000:.1f} ms step; each "
        "worker beyond the cores costs CPU of its own", "the CPU the extra workers cost",
        {"num_workers": n}, pm.more_workers(n),
        basis=[f"{n} workers, their wait for a core shrunk to what {n} leave"])

def fetch_text(pipe: Pipeline) -> str:
    """The workers' fetch in one phrase: per-sample time, its CPU and blocked parts, reads."""
    who = ("the training process (num_workers=0)" if pipe.in_process
           else "the DataLoader workers")
    per = (pipe.fetch_s_per_sample or 0.0) * 1000
    queued = pipe.fetch_queue_share or 0.0
    out = (f"{who} took {per:.2f} ms to fetch a sample, "
           f"{(pipe.fetch_cpu_share or 0.0) * 100:.0f}% of it on CPU, "
           + (f"{queued * 100:.0f}% waiting for a core (the cores busy) " if queued >= 0.005
              else "")
           + f"and {(pipe.fetch_blocked_share or 0.0) * 100:.0f}% blocked off CPU")
    if pipe.samples:
        kib, files = (pipe.bytes_per_sample or 0.0) / 1024, pipe.files_per_sample or 0.0
        least = (rules.READS_DATA_BYTES_IN_PROCESS if pipe.in_process
                 else rules.READS_DATA_BYTES) / 1024
        if files >= 0.005:
            out += f", reading {kib:.1f} KiB in {files:.2f} files per sample"
        elif kib >= least:  # (no file opened a sample: a pack, a stream, a memory map)
            where = ("over the network" if pipe.net_bytes > 0
                     else "through a memory map" if pipe.mapped
                     else "from files held open" if pipe.on_disk
                     else "without opening a file")
            out += f", reading {kib:.1f} KiB a sample {where}"
        else:
            out += f", reading {kib:.1f} KiB a sample and opening no file"
    idle = pipe.worker_idle_share
    if idle is not None:
        out += f"; the workers idle {idle * 100:.0f}% of their time"
    return out

def nothing_to_gain(v: Verdict) -> None:
    """A moderate wait where no fix the model sizes gains MIN_GAIN: the first advice is to
    leave the input pipeline alone, with the best candidate's figure, rather than a change
    that gains nothing or an advice not to change."""
    if v.model is None or (v.data_wait_share or 0.0) >= rules.HIGH:
        return
    sized = [r for r in [*v.recommendations, *v.declined]
             if r.prediction is not None and r.change]
    if not sized or any(r.prediction.gain >= rules.MIN_GAIN for r in sized if r.prediction):
        return
    best = max(sized, key=lambda r: r.prediction.gain if r.prediction else 0.0)
    p = best.prediction
    assert p is not None
    for r in [r for r in v.recommendations if r in sized]:
        v.recommendations.remove(r)
        v.declined.append(r)
    # (a search for better loader settings, which the model says would find none, goes too)
    v.recommendations = [r for r in v.recommendations if r.action != tune(v).action]
    short = best.action.split(":")[0].split(", so that")[0]
    v.recommendations.insert(0, Recommendation(
        f"leave the input pipeline as it is: no change iolens can size gains "
        f"{(rules.MIN_GAIN - 1) * 100:.0f}% or more (the best, {short}, is predicted at "
        f"{p.steps_per_s:.3g} steps/s against {p.now:.3g} now, {(p.gain - 1) * 100:+.1f}%)",
        f"the loop waits {(v.data_wait_share or 0.0) * 100:.1f}% of its step time and each "
        "change the model sizes leaves most of it", "none from the input side", None,
        "nothing to change: the figure is the best candidate's"))

def epoch_starts_first(v: Verdict, steps: StageColumns) -> None:
    """Workers started anew each epoch (not persistent), whose epoch starts after the run's
    first are a large part of the data wait: keeping the workers comes first, with its
    prediction, whatever the steady batches wait for. ``steps``: the columns of the run's
    timed intervals."""
    f = v.model.whole if v.model is not None else None
    if f is None or not f.workers or v.already("persistent_workers", True):
        return
    batches, wait, step_s = sum(steps.batches), sum(steps.wait_s), sum(steps.step_s)
    # (the start is in the first batch's wait, or in its step where iter() waits for the
    # workers: both are the epoch start's, NOTE [epoch starts in the model])
    later = (f.epoch_start_s - f.first_start_s) * batches
    if step_s <= 0 or later <= 0 or (later < rules.EPOCH_START_LEAD * wait
                                     and later < rules.MODERATE * step_s):
        return
    keep = {"persistent_workers": True}
    rec = next((r for r in v.recommendations if r.change == keep), None)
    if rec is None:
        rec = v.fix("set persistent_workers=True, so that each epoch does not start its "
                    "workers anew", "the epochs' first batches wait for new workers",
                    "the epoch starts' wait", keep, pm.no_epoch_starts(),
                    basis=["without the epochs' first batches' wait, the run's first kept"])
        if rec.prediction is not None and rec.prediction.gain < rules.MIN_GAIN:
            return
    else:
        v.recommendations.remove(rec)
    v.recommendations.insert(0, rec)
    v.evidence.append(f"the epochs after the first start their {plural(f.workers, 'worker')} "
                      f"anew (persistent_workers=False): their first batches took {later:.1f} s "
                      f"beyond a steady step, {later / step_s * 100:.0f}% of the step time")

def handover_bound(v: Verdict, pipe: Pipeline, span: Span, *,
                   share: float, when: str, workers: int) -> None:
    """The workers keep up: the wait left over ``span`` is the hand-over of each batch or
    the epochs' starts, which more workers do not shorten."""
    v.cls = "handover-bound"
    batches, wait = span.total("batches"), span.total("wait_s")
    hand = pipe.handover_s_per_batch
    start_s = span.total("start_wait_s")
    v.evidence.append(f"{plural(workers, 'DataLoader worker')} idle "
                      f"{(pipe.worker_idle_share or 0) * 100:.0f}"
                      f"% of their time: they have the batches ready before the loop asks"
                      f"{when}")
    parts = []
    if hand is not None and batches and wait > 0:
        parts.append(f"the hand-over of each batch (queue, unpickling, pin_memory) "
                     f"{hand * 1000:.2f} ms, {min(1.0, hand * batches / wait) * 100:.0f}% of "
                     f"the wait")
    if start_s > 0 and wait > 0:
        parts.append(f"the epochs' first batches {start_s / wait * 100:.0f}% of it")
        if hand is not None and batches and (hand * batches + start_s) > wait:
            parts[-1] += " (the two overlap: a first batch is handed over too)"
    v.evidence.append(f"the loop waited {share * 100:.1f}% of its step time for data"
                      + (": " + "; ".join(parts) if parts else ""))
    v.evidence.append(fetch_text(pipe))
    # No claim on more workers either way: they would make no batch sooner (those there
    # idle), yet the loop's own cost of taking each batch fell with more of them where
    # it was measured (4 MiB pickled a batch on 2 cores: 2 -> 4 workers, 8.9 -> 6.0 ms a
    # hand-over and +39% steps/s over 8 pairs of runs), which the model does not know.
    if start_s > 0 and wait > 0 and start_s / wait >= 0.25 and not v.already(
            "persistent_workers", True):
        v.offer(v.fix(
            "set persistent_workers=True, so that each epoch does not start its workers anew",
            "the epochs' first batches wait for new workers", "the epoch starts' wait",
            {"persistent_workers": True}, pm.no_epoch_starts(),
            basis=["without the epochs' first batches' wait"]))
    types = batch_types(v)
    tensors, leaves, size = (batch_most(v, key) or 0
                             for key in ("batch_tensors", "batch_leaves", "batch_bytes"))
    pinned = any(d.get("pin_memory") is True for d in v.loaders)
    if types == {"torch.Tensor"} and not pinned and tensors:
        # NOTE [a tensor's hand-over]: the tensors count, the bytes little
        if tensors >= 2:
            factor = round(handover_s(1, size) / handover_s(tensors, size), 3)
            v.offer(v.fix(
                f"hand each batch over as one tensor: its {tensors} tensors each go from "
                "the worker to the loop as a shared-memory handle of their own, and their "
                "bytes count for little; stack a sample's fields into one tensor (and split "
                "it again in the step)",
                "the wait left is the batch's way from the worker to the loop",
                "the hand-over's share of the wait", {"handover": factor},
                pm.cheaper_handover(factor, tensors=True),
                basis=[f"the hand-over of one tensor a batch, {factor:.2f} of that of "
                       f"{tensors}, as in the lab (a batch's own part, each tensor's and "
                       "each MiB's), the loop's CPU and the workers' with it"]))
            return
        if handover_s(1, size) < 2 * handover_s(1, 0):
            if hand is not None:  # (the batch's own part: most of it)
                v.recommendations.append(Recommendation(
                    f"leave the hand-over as it is: a batch of one tensor costs the loop "
                    f"{hand * 1000:.2f} ms to take from a worker, a cost of each batch "
                    "whatever its bytes; only fewer batches (a larger batch_size, a "
                    "change to the training) would wait less",
                    "the wait left is the batch's way from the worker to the loop, a cost "
                    "of its own", "none from the hand-over",
                    unavailable="nothing to change: a batch of one tensor is handed over "
                                "at its own cost"))
            return
        # (one tensor of several MiB: its bytes are the most of its hand-over)
    if types and types != {"torch.Tensor"} and leaves and not pinned and (
            hand is not None and hand > 0):
        # NOTE [a tensor's hand-over]: the pickled leaves as tensors, each a handle
        leaves, fields = kept_apart(v) or (leaves, 0)  # (NOTE [samples kept apart])
        as_tensors = handover_s(fields or leaves, size) * (v.pace or 1.0)
        factor = round(min(1.0, as_tensors / hand), 3)
        release, write = release_s(size, v.pace), write_s(size, v.pace)
        action = ("make each batch cheaper to hand over: return tensors (moved through shared "
                  "memory, their bytes counting for little) rather than Python lists or NumPy "
                  f"arrays (pickled whole; the batches hold {', '.join(sorted(types))})")
        leaves_as = f"its {plural(leaves, 'leaf', 'leaves')} as tensors"
        if fields:
            action += (f", and let the default collate_fn stack them: a batch is its "
                       f"samples kept apart, {plural(leaves, 'leaf', 'leaves')} alike in "
                       f"shape, {plural(fields, 'tensor')} a batch once stacked")
            leaves_as = (f"its {plural(leaves, 'leaf', 'leaves')} stacked into "
                         f"{plural(fields, 'tensor')}")
        v.offer(v.fix(
            action,
            "the wait left is the batch's way from the worker to the loop",
            "the hand-over's share of the wait", {"handover": factor},
            pm.cheaper_handover(factor, release_s=release, write_s=write),
            basis=[f"{leaves_as}, handed over in "
                   f"{as_tensors * 1000:.2f} ms a batch as in the lab (a batch's own part, "
                   f"each tensor's and each MiB's{paced(v.pace)}), against "
                   f"{hand * 1000:.2f} ms now, their shared memory written by the workers "
                   f"in {write * 1000:.2f} ms and freed by the loop in "
                   f"{release * 1000:.2f} ms"]))
        return
    factor, basis = 0.5, "if the hand-over took half as long"
    if types == {"torch.Tensor"}:
        action = ("make each batch cheaper to hand over: keep it small in bytes (decode on "
                  "the GPU, or uint8 rather than float32); its tensors go through shared "
                  "memory already" + (", and pin_memory copies each byte" if pinned else ""))
        if tensors and not pinned:
            factor = round(handover_s(tensors, size // 2) / handover_s(tensors, size), 3)
            basis = (f"the batch in half its bytes ({size / (1 << 21):.1f} MiB), handed over "
                     "as in the lab (a batch's own part, each tensor's and each MiB's)")
    else:
        held = f" (the batches hold {', '.join(sorted(types))})" if types else ""
        action = ("make each batch cheaper to hand over: return tensors (moved through shared "
                  "memory) rather than Python lists or NumPy arrays (pickled whole)" + held
                  + ", and keep the batch small in bytes (decode on the GPU, or uint8 rather "
                  "than float32)")
    v.offer(v.fix(
        action,
        "the wait left is the batch's way from the worker to the loop",
        "the hand-over's share of the wait", {"handover": factor},
        pm.cheaper_handover(factor), basis=[basis]))


def batch_types(v: Verdict) -> set[str]:
    """The types the job's batches held, over its loaders (NOTE [loader settings] in
    iolens/training/_hooks.py)."""
    return {t for d in v.loaders for t in loader_types(d)}


def loader_types(d: dict[str, Any]) -> set[str]:
    """The types one loader's batches held (its settings' ``batch_types``)."""
    return {t for t in str(d.get("batch_types") or "").split(",") if t}


def batch_most(v: Verdict, key: str) -> int | None:
    """The most of any loader's ``key`` (``batch_tensors``, ``batch_leaves``,
    ``batch_bytes``); None where no loader recorded it."""
    return max((n for d in v.loaders if type(n := d.get(key)) is int), default=None)


def kept_apart(v: Verdict) -> tuple[int, int] | None:
    """The leaves of a batch pickled whole and the tensors it becomes with its samples
    stacked (the default collate_fn's way), where the timing hook saw the batch as its
    samples kept apart and alike (``batch_fields``: a tensor a field); read from the
    pickling loader with the most leaves. None where it did not (NOTE [samples kept
    apart])."""
    pickled = [d for d in v.loaders if type(d.get("batch_leaves")) is int
               and loader_types(d) - {"torch.Tensor"}]
    if not pickled:
        return None
    d = max(pickled, key=lambda d: d["batch_leaves"])
    leaves: int = d["batch_leaves"]
    fields = d.get("batch_fields")
    return (leaves, fields) if type(fields) is int and 0 < fields <= leaves else None


"""NOTE [samples kept apart]: a collate_fn that returns its input (a list of NumPy
arrays, a leaf a sample) has each batch pickled whole as its samples. Returned as
tensors the default collate_fn stacks, that is a tensor a field, not a tensor a leaf;
the advice says to let it stack them and predicts the hand-over of the stacked tensors.
The timing hook says when a batch is that (iolens.training._hooks.stackable_fields): a
list of batch_size samples with the same leaves, arrays of one shape and dtype or
numbers, which the default collate_fn can stack. Predicted as a tensor a leaf, the lab's
batch of 8 samples of 512 KiB (a NumPy array each, 75-79 steps/s before) was 162-171
steps/s in two runs where the stacked tensor ran at 205-218 (+24% and +31%); as a list
of 8 tensors, on a slower day, 96-114 against 121-138 predicted."""


def machine_pace(meta: dict[str, Any]) -> float | None:
    """meta.json's ``pace_s`` over the lab's, within rules.PACE_BOUNDS; None where the run
    has none (NOTE [the machine's pace] in iolens/recorder/pace.py)."""
    pace = meta.get("pace_s")
    if not isinstance(pace, (int, float)) or isinstance(pace, bool):
        return None
    if not math.isfinite(pace) or pace <= 0:
        return None
    low, high = rules.PACE_BOUNDS
    return min(high, max(low, float(pace) / rules.PACE_LAB_S))


def paced(pace: float | None) -> str:
    """The words that say the lab's milliseconds were scaled by ``pace`` (none at 1)."""
    if pace is None or round(pace, 2) == 1:
        return ""
    return f", at this machine's pace: {pace:.2f}x the lab's time for the same Python work"


def release_s(size: int, pace: float | None) -> float:
    """The loop's CPU a batch to free the ``size`` bytes of shared memory it was handed
    over in, at ``pace`` (NOTE [a tensor's release])."""
    return size / (1 << 20) * rules.HANDOVER_RELEASE_MIB_S * (pace or 1.0)


def write_s(size: int, pace: float | None) -> float:
    """The workers' CPU a batch, beyond the fetch, to write the ``size`` bytes of its
    tensors into shared memory and send them, at ``pace`` (NOTE [a tensor's write] in
    iolens/analysis/model/changes.py)."""
    return size / (1 << 20) * rules.HANDOVER_WRITE_MIB_S * (pace or 1.0)


def handover_s(tensors: int, size: int) -> float:
    """The loop's hand-over of a batch of ``tensors`` tensors of ``size`` bytes in all,
    from workers that keep up, as measured in the lab (NOTE [a tensor's hand-over])."""
    return ((rules.HANDOVER_FIXED + tensors) * rules.HANDOVER_TENSOR_S
            + max(0.0, size / (1 << 20) - rules.HANDOVER_FREE_MIB) * rules.HANDOVER_MIB_S)


"""NOTE [a tensor's hand-over]: a tensor a worker returns is written into shared memory
there, and the loop receives a handle to it (a file descriptor over a socket, then a
mapping): what the loop pays a batch is a part of its own and a part for each tensor,
and little for each byte. The lab's case (2 workers, batches of 8 samples of 16 KiB, no
pin_memory), its sample in 1, 2, 4, 8, 16 and 32 tensors: 0.46, 0.62, 0.89, 1.43, 2.75
and 8.89 ms a batch handed over, as iolens times it (0.31 ms a batch and 0.15 ms a
tensor up to 16: the batch's own part is that of about 2 tensors, rules.HANDOVER_FIXED;
at 32 the loop is short of CPU, and the model's figure is the lesser gain). Batches of 4
samples in one tensor of 16 KiB, 256 KiB, 1 MiB, 2 MiB, 4 MiB and 8 MiB: 0.46, 0.46,
0.46, 0.44-0.46, 1.02-1.16 and 1.92 ms, the last two where the workers, writing the
bytes, idled 53% and 26% of their time against 84-97%: nothing up to 2 MiB, then 0.3 ms
a MiB (rules.HANDOVER_FREE_MIB, rules.HANDOVER_MIB_S). With 0.22 ms a MiB beyond the
first, halving 4 MiB to 2 was predicted at 0.60 of the hand-over where 0.40 was
measured, and the rate 13-21% under the runs after (311-329 steps/s predicted, 371-376
measured); 0.43 now. Smaller batches in bytes are then a lever for a batch of several
MiB only (one tensor: from 3.5 MiB, where its bytes cost more than the batch's own
part), and fewer tensors the larger one: from k tensors to one, the
hand-over is handover_s(1) / handover_s(k) of what it was (16 to 1, at 128 KiB a batch:
0.17 predicted, 0.19 measured). A batch of
Python lists or NumPy arrays is pickled whole: its leaves returned as tensors are
predicted at the lab's cost of as many tensors of its bytes (the lab's 4 MiB of bytes a
batch, 4.35 ms: 1.05 predicted as one tensor, 1.05-1.37 measured). With pin_memory, the
loop's pinning thread copies each byte of each tensor, and the bytes count again: the
advice is then to make the batch smaller, predicted as a hand-over halved (a figure of
no measurement). The lab's milliseconds are scaled by the run's pace (NOTE [the machine's
pace] in iolens/recorder/pace.py): on a day this machine ran the recorder's fixed work
at 1.4-1.75x the lab's time, the 4 MiB tensor's hand-over took 1.68-2.86 ms."""


"""NOTE [a tensor's release]: the loop that lets a batch of tensors go frees the shared
memory its worker wrote it into, and that is in its step, not its hand-over. Timed by
hand on a day of 1.6-1.75x the lab's pace: `del batch` took 0.66-0.79 ms of the loop's
CPU for one tensor of 4 MiB, 0.07 ms for 128 KiB, and 0.004 ms (1.05 at the 90th
percentile, where the allocator gave memory back) for the same 4 MiB pickled as bytes.
So a batch pickled whole and returned as tensors costs the step 0.1 ms a MiB at the
lab's pace (rules.HANDOVER_RELEASE_MIB_S), which the prediction adds. Without it (and
without the pace) the prediction for the lab's 4 MiB of bytes was 271-279 steps/s that
day where 168-219 were measured; with both, 195-221 against 194-216. Changes between
batches of tensors alike in bytes (fewer tensors) free the same memory either way."""

def tune(v: Verdict) -> Recommendation:
    """Points the input-bound classes without saturated storage at ``iolens tune``, beside
    a stand-in for this run's step."""
    return Recommendation(
        "measure the best DataLoader settings on this machine: `iolens tune --dataset "
        f"MODULE:FACTORY --run {v.run_dir}` (or `--folder DIR`) measures the samples per "
        "second of "
        "each num_workers, prefetch_factor and persistent_workers beside a stand-in for "
        "this run's step, and `iolens probe` how far the preprocessing ceiling is from the "
        "training step's",
        "the right num_workers depends on the per-sample cost and the free cores",
        "the best num_workers, measured", None,
        "a measurement, not a change")

def workers_to_add(workers: int, worker_cpu: float, cpus: int, idle: float | None) -> int:
    """How many DataLoader workers to try when neither device nor CPU is saturated.

    Without workers: one per core but the training process's, at most 8. With
    workers: as many more as the idle cores can carry at the CPU each one uses
    now (workers that mostly wait add little CPU), at most doubling them, so
    that the next run checks the effect before going further.
    """
    if workers == 0:
        return max(1, min(8, cpus - 1)) if cpus else 2
    free = cpus * (idle or 0.0) / 100 if cpus else 0.0
    each = max(worker_cpu / 100, 0.1)
    return workers + max(1, min(workers, int(free / each)))
