"""The proof of a prediction: the run after a fix against what the run before predicted.

``iolens compare BEFORE AFTER`` finds what AFTER changed against BEFORE (the
DataLoader's num_workers, what serves the dataset, the files per sample, the
per-sample CPU cost, the hand-over, the epoch starts) and the recommendation of
BEFORE's verdict that makes that change. Its prediction is then set beside the
throughput AFTER measured, with the bootstrap interval of the comparison. For the
changes AFTER's own figures measure (num_workers, the CPU per sample, the hand-over,
the epoch starts), BEFORE's model predicts the change AFTER made, in AFTER's amounts,
whether or not they are the ones advised. A prediction holds when the measured throughput is within
HELD_TOLERANCE of it; one that fails is a bug of the model to learn from.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from iolens.analysis import model as pm
from iolens.analysis.columns import StageColumns
from iolens.analysis.pipeline import pipeline_over
from iolens.analysis.verdict import Verdict, block_sampled
from iolens.analysis.verdict.workers import batch_most, batch_types, release_s, write_s

HELD_TOLERANCE = 0.25
"""A prediction holds when the throughput measured after the change is within 25% of it,
and went the way it said (NOTE [a prediction the other way])."""
DIRECTION_MIN = 0.05
"""A predicted change of 5% or more of BEFORE's throughput says which way it goes."""

"""NOTE [a prediction the other way]: 25% of a prediction is wider than many of the
changes predicted. A new-user trial fell in it: 47.9 steps/s before, a gain to 57.2
predicted, 45.6 measured after, 20% under the prediction, and it read "held" for a
change that made the job slower. A prediction of a gain (or a loss) of DIRECTION_MIN or
more fails where the throughput measured after did not move that way at all."""
CHANGED = 0.8
"""A stage cost that fell to 80% of BEFORE's or less was changed (the runs of one setting
vary by a few percent)."""
CHANGED_COLD = 0.6
"""... and where the workers came to persist, 60% or less: workers started anew each epoch
run their first samples cold (imports, caches), so the CPU a sample drops by itself when
they persist (a spawn case: to 0.78 of it)."""
CORES_MOVED = 0.05
"""Cores free to the job that moved by 5% or more between the runs (NOTE [the cores the
run after had])."""

"""NOTE [the cores the run after had]: the cores a job may use are the machine's less what
others took from it over the run: other processes, and a hypervisor's steal. A prediction
counts on them staying as they were; where a change needs more cores than the run kept
busy, the figure moves with them. The run after measures its own: where they moved, the
proof is BEFORE's model with AFTER's cores, the change judged apart from the machine's
load. A clean-clone CI run without workers lost 0.2 of its 2 cores to others (9% of the
machine, under the lab's 10% for a quiet run), and its 0 -> 2 workers were predicted for
1.8 cores; the two runs after had the 2 to themselves and ran 34% over."""
PACKED = 0.25
"""Files per sample that fell to a quarter or less: the dataset was packed."""


def _dict(d: Any) -> dict[str, Any]:
    return d if isinstance(d, dict) else {}


def _top(v: dict[str, Any]) -> dict[str, Any]:
    s = v.get("storage") or []
    return _dict(s[0]) if s else {}


def changes(before: Verdict, after: Verdict, before_cols: StageColumns,
            after_cols: StageColumns) -> dict[str, Any]:
    """What AFTER changed against BEFORE, in the keys of a recommendation's ``change``
    (``before_cols``, ``after_cols``: the runs' columns, NOTE [columns] in
    iolens/analysis/columns/__init__.py)."""
    out: dict[str, Any] = {}
    mb, ma = before.model, after.model
    fb = mb.whole if mb is not None else None
    fa = ma.whole if ma is not None else None
    # (from no workers there were no worker starts to shrink: the settings say it)
    if after.already("persistent_workers", True) and not before.already(
            "persistent_workers", True):
        out["persistent_workers"] = True
    if fb is not None and fa is not None:
        if fa.workers != fb.workers:
            out["num_workers"] = fa.workers
        # the epochs after the first (the run's own start is in every configuration), where
        # the loaders' settings are not known (fewer workers shorten the starts too)
        later_b = fb.epoch_start_s - fb.first_start_s
        later_a = fa.epoch_start_s - fa.first_start_s
        if later_b > 0 and later_a <= (1 - CHANGED) * later_b and not after.loaders:
            out["persistent_workers"] = True
        cut = CHANGED_COLD if out.get("persistent_workers") else CHANGED
        # (with another worker count the CPU a sample takes moves by itself: in the loop's
        # process against in workers, or more processes on the same cores; 0 -> 5 workers
        # read as a 0.47x cheaper fetch in a lab run)
        if fb.fetch_cpu_s > 0 and fa.fetch_cpu_s <= cut * fb.fetch_cpu_s and (
                fa.workers == fb.workers):
            out["fetch_cpu"] = round(fa.fetch_cpu_s / fb.fetch_cpu_s, 3)
        if fb.handover_s > 0 and fa.handover_s <= CHANGED * fb.handover_s and (
                fa.workers == fb.workers):
            out["handover"] = round(fa.handover_s / fb.handover_s, 3)
    pb, pa = (pipeline_over(c, range(c.n)) for c in (before_cols, after_cols))
    files_b = pb.files_per_sample if pb is not None else None
    files_a = pa.files_per_sample if pa is not None else None
    if files_b and files_a is not None and files_a <= PACKED * files_b:
        out["pack"] = True
    if block_sampled(after) and not block_sampled(before):  # (data in large files already)
        out["pack"] = True
    tb, ta = _top(before.to_dict()), _top(after.to_dict())
    if tb and ta and (tb.get("mount"), tb.get("device")) != (ta.get("mount"), ta.get("device")):
        out["storage"] = "ram" if ta.get("kind") == "tmpfs" else str(ta.get("mount"))
    return out


_MEASURED = ("num_workers", "fetch_cpu", "handover", "persistent_workers")
"""Changes whose amount AFTER's own figures give (NOTE [the change that was made])."""


def _remodelled(before: Verdict, found: dict[str, Any], fewer_tensors: bool = False,
                cores: float | None = None, released: tuple[float, float] | None = None
                ) -> tuple[Any, str]:
    """BEFORE's model evaluated with the changes AFTER made, in AFTER's amounts; and the
    action, as advised where BEFORE advised exactly that, else as made (``fewer_tensors``:
    AFTER's batches hold fewer tensors, NOTE [a hand-over's CPU]; ``cores``: the cores
    AFTER's job had, NOTE [the cores the run after had]; ``released``: the loop's CPU a
    batch to free the shared memory AFTER's batches came in where BEFORE's were pickled,
    NOTE [a tensor's release], and the workers' to write it, NOTE [a tensor's write])."""
    model = before.model
    assert model is not None
    steps: list[pm.Change] = []
    basis: list[str] = []
    made: list[str] = []
    if "fetch_cpu" in found:
        steps.append(pm.cheaper_fetch(float(found["fetch_cpu"])))
        basis.append(f"the CPU per sample times {found['fetch_cpu']:.2f}, as measured after")
        made.append(f"the CPU per sample times {found['fetch_cpu']:.2f}")
    if "handover" in found:
        free, write = released or (0.0, None)
        steps.append(pm.cheaper_handover(float(found["handover"]), fewer_tensors, free, write))
        basis.append(f"the hand-over times {found['handover']:.2f}, as measured after"
                     + (f", and the batches' shared memory written by the workers in "
                        f"{write * 1000:.2f} ms and freed by the loop in "
                        f"{free * 1000:.2f} ms" if write is not None else ""))
        made.append(f"the hand-over times {found['handover']:.2f}")
    if found.get("persistent_workers"):
        steps.append(pm.no_epoch_starts())
        basis.append("without the later epochs' starts")
        made.append("persistent workers")
    n = found.get("num_workers")
    if n is not None:
        steps.append(pm.more_workers(int(n)))  # (from none, the hand-over they bring)
        basis.append(f"{n} workers")
        was = model.whole.workers if model.whole is not None else "?"
        made.append(f"num_workers {was} to {n}")
        if was == 0 and not found.get("persistent_workers") and (
                model.whole is not None and model.whole.epochs_per_step > 0):
            basis.append("workers started anew each epoch: a run without workers does not "
                         "measure their start, which is not in this figure")

    was_cores = model.whole.cores if model.whole is not None else None
    if cores is not None and was_cores is not None and (
            abs(cores - was_cores) >= CORES_MOVED * max(cores, was_cores)):
        steps.append(lambda f: dataclasses.replace(f, cores=cores))
        basis.append(f"the job's {cores:.1f} cores as measured after ({was_cores:.1f} "
                     "before: the machine's other load moved)")

    def change(f: pm.Figures) -> pm.Figures:
        for step in steps:
            f = step(f)
        return f

    pred = model.predict(change, None if n is None else int(n), basis=basis)
    recs = [r for r in _recs(before) if r.change]
    advised = next((r for r in recs if set(r.change or ()) == set(found)), None)
    if advised is None:  # (the advice made, and a stage cost it moved besides)
        advised = next((r for r in recs if set(r.change or ()) < set(found)
                        and set(found) - set(r.change or ()) <= _SIDE_EFFECTS), None)
    if advised is None:
        return pred, ", ".join(made) + " (not as advised)"
    assert advised.change is not None
    if set(advised.change) == set(found) and all(
            _close(advised.change[k], found[k]) for k in found):
        return pred, advised.action
    return pred, f"{advised.action} (made as: {', '.join(made)})"


_SIDE_EFFECTS = frozenset({"fetch_cpu", "handover"})
"""Stage costs that move by themselves when another is cut: a cheaper transform on busy
cores also hands its batches over faster (0.72 of the time in a lab run where the CPU per
sample fell to 0.34), the workers waiting less for a core. A change advised and made with
one of these besides is the advice, made as measured."""


def _fewer_tensors(before: Verdict, after: Verdict) -> bool:
    """Whether AFTER's batches hold fewer tensors than BEFORE's, where both recorded them
    (the most of any loader's: NOTE [a hand-over's CPU])."""
    b, a = (batch_most(v, "batch_tensors") for v in (before, after))
    return b is not None and a is not None and 0 < a < b


def _released(before: Verdict, after: Verdict) -> tuple[float, float] | None:
    """The loop's CPU a batch to free AFTER's shared memory and the workers' to write it,
    where BEFORE's batches were pickled whole and AFTER's are tensors, at AFTER's pace;
    None otherwise (NOTE [a tensor's release], NOTE [a tensor's write])."""
    b, a = batch_types(before), batch_types(after)
    size = batch_most(after, "batch_bytes") or 0
    if not b or b == {"torch.Tensor"} or a != {"torch.Tensor"} or size <= 0:
        return None
    return release_s(size, after.pace), write_s(size, after.pace)


def _close(advised: Any, made: Any) -> bool:
    """Whether an amount made is the one advised (within a tenth for a factor)."""
    if isinstance(advised, bool) or isinstance(made, bool) or isinstance(advised, int):
        return bool(advised == made)
    return abs(float(advised) - float(made)) <= 0.1 * abs(float(advised))


def _recs(v: Verdict) -> list[Any]:
    return list(v.recommendations) + list(v.declined) + [
        r for f in v.findings for r in f.recommendations]


def prove(before: Verdict, after: Verdict, before_cols: StageColumns,
          after_cols: StageColumns, throughput: dict[str, Any] | None) -> dict[str, Any]:
    """The ``prediction`` object of ``iolens compare``: the change found, the prediction
    BEFORE made for it, the throughput AFTER measured with its interval, and whether the
    prediction held; or why there is none (``{"change": ..., "why": ...}``)."""
    found = changes(before, after, before_cols, after_cols)
    if not found:
        return {"change": found, "why": "NEW changes nothing the verdict predicts for "
                "(num_workers, the storage, a pack, the CPU per sample, the hand-over, the "
                "epoch starts)"}
    pred = None
    action = None
    n = found.get("num_workers")
    if before.model is not None and found and set(found) <= set(_MEASURED):
        # NOTE [the change that was made]: the changes AFTER measured (how many workers,
        # the CPU per sample, the hand-over, the epoch starts) are BEFORE's model evaluated
        # with AFTER's own amounts, not with the amounts advised: a transform made 4x
        # cheaper is held against BEFORE's model of a 4x cheaper one, not of the halving
        # it advised.
        fa = after.model.whole if after.model is not None else None
        pred, action = _remodelled(before, found, _fewer_tensors(before, after),
                                   fa.cores if fa is not None else None,
                                   _released(before, after))
    else:
        keys = set(found) - {"num_workers"} if n is None else set(found)
        for r in _recs(before):
            if r.prediction is not None and r.change and set(r.change) & keys:
                pred, action = r.prediction, r.action
                break
    if pred is None:
        return {"change": found, "why": "BEFORE's verdict has no prediction for this change"
                + (" (more than one thing changed)" if len(found) > 1 else "")}
    out: dict[str, Any] = {"change": found, "action": action, "predicted": pred.to_dict()}
    t = _dict(throughput)
    new, base = t.get("new"), t.get("base")
    if not isinstance(new, (int, float)) or new <= 0:
        out["why"] = "NEW has no measured throughput"
        return out
    lo, hi = t.get("ci_low"), t.get("ci_high")
    err = new / pred.steps_per_s - 1 if pred.steps_per_s > 0 else None
    # NOTE [a prediction the other way]
    wrong_way = False
    if isinstance(base, (int, float)) and base > 0:
        said = pred.steps_per_s / base - 1
        wrong_way = abs(said) >= DIRECTION_MIN and (new - base) * said <= 0
    out.update({
        "measured_steps_per_s": round(new, 3),
        "measured_low": round(base * (1 + lo / 100), 3)
        if isinstance(base, (int, float)) and isinstance(lo, (int, float)) else None,
        "measured_high": round(base * (1 + hi / 100), 3)
        if isinstance(base, (int, float)) and isinstance(hi, (int, float)) else None,
        "error": round(err, 4) if err is not None else None,
        "within_interval": pred.low <= new <= pred.high,
        "held": err is not None and abs(err) <= HELD_TOLERANCE and not wrong_way,
        "wrong_way": wrong_way,
        "tolerance": HELD_TOLERANCE,
    })
    return out


def text(p: dict[str, Any]) -> str:
    """The proof in one line."""
    if "predicted" not in p or "measured_steps_per_s" not in p:
        return f"no prediction to check: {p.get('why')}"
    q = p["predicted"]
    ci = (f" (95% CI {p['measured_low']:.3g}-{p['measured_high']:.3g})"
          if p.get("measured_low") is not None and p.get("measured_high") is not None else "")
    verdict = "held" if p["held"] else "FAILED"
    why = (f"{p['error'] * 100:+.0f}%: the change went the other way"
           if p.get("wrong_way") else
           f"{p['error'] * 100:+.0f}%, tolerance {p['tolerance'] * 100:.0f}%")
    return (f"{p['action']}: predicted {q['steps_per_s']:.3g} steps/s ({q['low']:.3g}-"
            f"{q['high']:.3g}, then {q['limit']}-bound), measured "
            f"{p['measured_steps_per_s']:.3g}{ci}: {verdict} ({why})")
