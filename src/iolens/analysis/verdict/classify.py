"""The verdict over a run: :func:`diagnose` and the classes decided before the
input-bound ones (no steps, steps only, compute-bound), the autotuned part of a
run, and how each recommendation is tried.
"""

from __future__ import annotations

import shlex
import statistics
from collections.abc import Sequence
from typing import Any

from iolens.analysis import model as pm
from iolens.analysis import rules
from iolens.analysis.columns import RunColumns, RunView, Span, StageColumns, added
from iolens.analysis.model import Model
from iolens.analysis.verdict.figures import span_window
from iolens.analysis.verdict.findings import all_findings, hang_finding, no_disk_stats
from iolens.analysis.verdict.inputbound import input_bound
from iolens.analysis.verdict.result import (
    HUNG,
    NO_STEPS,
    STEPS_ONLY,
    Finding,
    Recommendation,
    Verdict,
    Window,
    clock,
    severity,
)
from iolens.analysis.verdict.storage import probe_for
from iolens.analysis.verdict.workers import epoch_starts_first, machine_pace, nothing_to_gain
from iolens.analysis.verdict.writes import write_stall
from iolens.core.words import plural
from iolens.training import overrides


def diagnose(run: RunView | Sequence[dict[str, Any]],
             meta: dict[str, Any] | None = None) -> Verdict:
    """The verdict over a run: its view (:class:`RunView`, read once by the caller: NOTE
    [columns] in iolens/analysis/columns/__init__.py), or its interval records in order,
    read here. ``meta`` adds the CPU count and notes."""
    meta = meta or {}
    view = run if isinstance(run, RunView) else RunView.of(run)
    view, tuned = _tuned_part(view, meta)
    columns, devices = view.run, view.devices
    timed_at = columns.timed()
    steps = columns if len(timed_at) == columns.n else columns.take(timed_at)  # (all timed)
    cols = RunColumns(columns, devices, timed_at, steps, view.stores, view.ranks)
    batches = int(sum(steps.batches))
    figures = _figures(columns, steps, meta)
    blind = no_disk_stats(columns, devices, meta)
    findings = [blind] if blind is not None else []
    storage = served_storage(meta)
    if batches == 0:
        v = _no_steps(columns, meta, figures, findings)
        v.storage = storage
        return v
    step_s = added(steps.step_s)
    share = added(steps.wait_s) / step_s if step_s > 0 else 0.0  # the data wait share
    v = Verdict("compute-bound", severity(share), share, figures=figures,
                caveat=blind.evidence[0] if blind is not None else None, storage=storage)
    v.probe = probe_for(meta, storage)
    if isinstance(meta.get("run_dir"), str):
        v.run_dir = shlex.quote(meta["run_dir"])
    v.loaders = [d for d in meta.get("loaders") or [] if isinstance(d, dict)]
    v.pace = machine_pace(meta)
    model = Model(steps, int(meta.get("cpus") or 0) or None,
                  workers=pm.declared_workers(columns) or None)
    v.model = model if model.whole is not None else None
    stall = write_stall(cols, share)
    close = None
    if stall is not None:
        v.cls, v.devices, v.evidence, v.recommendations, v.windows = stall
    elif share < rules.MODERATE:
        _compute_bound(v, cols)
        epoch_starts_first(v, steps)
    else:
        close = input_bound(v, meta, cols)
        epoch_starts_first(v, steps)
        nothing_to_gain(v)
    if batches < rules.MIN_BATCHES:
        v.evidence.append(f"only {plural(batches, 'batch', 'batches')} timed: a longer run "
                          "gives a firmer verdict")
    v.findings = findings + all_findings(cols, v)
    hang = next((f for f in v.findings if f.cls == "hang"), None)
    step_s = sum(steps.step_s)
    if hang is not None and columns.waiting_s[-1] > step_s:
        # It hung for longer than it trained: that is what the run says, first.
        v.cls, v.severity = HUNG, "high"
        v.evidence.insert(0, hang.evidence[0])
        # (advice from a handful of batches before the hang would only distract)
        v.recommendations = hang.recommendations + (
            v.recommendations if batches >= rules.MIN_BATCHES else [])
        close = None  # (of the class it no longer has)
    if close is not None:
        v.caveat = f"{v.caveat}; {close}" if v.caveat else close
    if tuned is not None:
        v.evidence.append(tuned)
    _not_what_failed(v, meta)
    how_to_try(v, meta)
    _ended_early(v, meta, batches)
    return v

def _ended_early(v: Verdict, meta: dict[str, Any], batches: int) -> None:
    """A caveat where the job failed or was stopped: its figures are of what it did until
    then (a new-user trial read "handover-bound, high" and a prediction of 597 steps/s,
    with no word of caution, off a job that raised in its second second)."""
    code = meta.get("exit_code")
    if not isinstance(code, int) or isinstance(code, bool) or code == 0:
        return
    how = "was stopped" if code in (130, 143, -2, -15) else "failed"  # (SIGINT, SIGTERM)
    note = (f"the job {how} (exit code {code}) after {plural(batches, 'batch', 'batches')}: "
            "the verdict is of what it did until then")
    v.caveat = f"{v.caveat}; {note}" if v.caveat else note

def _not_what_failed(v: Verdict, meta: dict[str, Any]) -> None:
    """No advice asks for as many workers as autotune found to fail in this run (NOTE [a
    setting that fails] in iolens/training/autotune.py): it is said instead."""
    at = meta.get("autotune")
    failed = [(e["settings"], str(e["failed"]))
              for t in (at.get("loaders") or [] if isinstance(at, dict) else [])
              if isinstance(t, dict) for e in t.get("epochs") or []
              if isinstance(e, dict) and e.get("failed") and isinstance(e.get("settings"), dict)]
    for settings, why in failed:
        n = settings.get("num_workers")
        if not isinstance(n, int):
            continue
        dropped = [r for r in v.recommendations
                   if isinstance(w := (r.change or {}).get("num_workers"), int) and w >= n]
        for r in dropped:
            v.recommendations.remove(r)
        v.evidence.append(
            f"autotune tried num_workers={n} in this run and it failed ({why})"
            + (f": not advised again ({dropped[0].action})" if dropped else ""))

def _tuned_part(view: RunView, meta: dict[str, Any]) -> tuple[RunView, str | None]:
    """A run of ``iolens run --autotune`` is judged on the intervals since its loader
    settings last changed (NOTE [autotune between epochs] in iolens/training/autotune.py):
    the epochs before ran other settings, whose figures would blend into figures of no
    setting at all. The words that say so, or None (a run without autotune, or one whose
    settings never changed)."""
    at = meta.get("autotune")
    since = at.get("since_t") if isinstance(at, dict) else None
    if not isinstance(since, int | float) or isinstance(since, bool):
        return view, None
    kept = [i for i, t in enumerate(view.run.t) if t > since]
    if not kept or len(kept) == view.run.n:
        return view, None
    return view.take(kept), (
        f"the verdict is of the run from {clock(view.run.elapsed_s[kept[0]])} on, where "
        "autotune's settings last changed: the epochs before ran other settings")

def how_to_try(v: Verdict, meta: dict[str, Any]) -> None:
    """Each recommendation that changes DataLoader settings only gets the ``iolens run
    --set`` line that tries it with no code change (the run's own ``--set`` kept)."""
    command = meta.get("command")
    tail = (" -- " + shlex.join(str(c) for c in command)
            if isinstance(command, list) and command else " -- CMD")
    given = meta.get("set")
    given = given if isinstance(given, dict) else {}
    only = "".join(f" --set-loader {shlex.quote(str(n))}"
                   for n in meta.get("set_loaders") or [])
    recs = [*v.recommendations, *v.declined,
            *(r for f in v.findings for r in f.recommendations)]
    loaders = [d for d in meta.get("loaders") or [] if isinstance(d, dict)]
    if given and loaders and not any("set" in d for d in loaders):
        names = sorted({str(d.get("dataset", "?")).rsplit(".", 1)[-1] for d in loaders})
        v.caveat = ((v.caveat + "; ") if v.caveat else "") + (
            f"the settings given ({overrides.line(given)}) reached no DataLoader: "
            + (f"--set-loader {', '.join(map(str, meta.get('set_loaders') or []))} matched "
               f"none of the loaders' datasets ({', '.join(names)})"
               if meta.get("set_loaders") else "none was made after they were given"))
    # (a DataLoader's settings only: not a plain iterable's, not an IterableDataset's,
    # whose samples repeat in every worker unless it splits them itself)
    settable = bool(loaders) and all(
        str(d.get("loader", "")).endswith("DataLoader") and not d.get("iterable")
        for d in loaders)
    for r in recs:
        change = r.change or {}
        if (not settable or not change or any(k not in overrides.KEYS for k in change)
                or "pin_memory" in change):  # (pinned memory wants non_blocking copies too)
            continue
        try:
            settings = overrides.parse(f"{k}={overrides.text(x)}"
                                       for k, x in {**given, **change}.items())
        except overrides.SetError:
            continue
        r.try_it = "iolens run " + overrides.line(settings) + only + tail

def served_storage(meta: dict[str, Any]) -> list[dict[str, Any]]:
    """What serves the dataset, from meta.json (NOTE [dataset folders] in
    iolens/recorder/storage.py), the dataset's first (the most files opened there):
    ``{"mount", "fstype", "device", "kind", "disks", "page_cache_visible", "mapped",
    "role", "folders"}``, and ``peer``, ``server``, ``server_pid`` of a network store and
    ``largest_file`` where they are known."""
    out = []
    for s in meta.get("storage") or []:
        if isinstance(s, dict) and isinstance(s.get("mount"), str):
            dev = s.get("device")
            kind = str(s.get("kind") or ("block" if dev else "other"))
            disks = [d for d in s.get("disks") or [] if isinstance(d, str)]
            out.append({"mount": s["mount"], "fstype": str(s.get("fstype") or ""),
                        "device": dev if isinstance(dev, str) else None, "kind": kind,
                        "disks": disks or ([dev] if isinstance(dev, str) else []),
                        "page_cache_visible": s.get("page_cache_visible") is not False
                        and kind not in ("fuse", "nfs", "tmpfs", "network"),
                        "mapped": s.get("mapped") is True,
                        "role": str(s.get("role") or "dataset"),
                        "folders": [f for f in s.get("folders") or [] if isinstance(f, str)]})
            for key in ("peer", "server", "server_pid", "largest_file"):
                if isinstance(s.get(key), (str, int)):
                    out[-1][key] = s[key]
    return out

def _figures(run: StageColumns, steps: StageColumns, meta: dict[str, Any]) -> dict[str, Any]:
    """The run's headline figures: ``run``, the columns of its intervals, and ``steps``,
    those of its timed ones."""
    batches = int(sum(steps.batches))
    step_s, wait_s = sum(steps.step_s), sum(steps.wait_s)
    return {
        "intervals": run.n,
        "seconds": round(sum(run.secs), 3),
        "batches": batches,
        "epochs": int(sum(run.epochs)),
        "step_time_s": round(step_s / batches, 6) if batches else None,
        "data_wait_s": round(wait_s / batches, 6) if batches else None,
        "step_p50_s": round(statistics.median(steps.step_p50_s), 6) if steps.n else None,
        "data_wait_p50_s": round(statistics.median(steps.wait_p50_s), 6) if steps.n else None,
        "steps_per_s": round(batches / step_s, 3) if step_s > 0 else None,
        "cpus": meta.get("cpus"),
    }

def _no_steps(run: StageColumns, meta: dict[str, Any], figures: dict[str, Any],
              findings: list[Finding]) -> Verdict:
    """No batch timed: why, from the run's columns (``run``: all its intervals) and meta,
    and what to do."""
    why: list[str] = []
    if meta.get("instrumented") is False:
        why.append("the run was recorded with --no-instrument, so no batch was timed")
    set_error = None
    for st in meta.get("timing") or []:
        if isinstance(st, dict) and st.get("error"):
            why.append(f"timing failed in process {st.get('pid')}: {st['error']}")
        if isinstance(st, dict) and st.get("set_error") and set_error is None:
            set_error = str(st["set_error"])
    if set_error is not None:
        # `iolens run --set` asked for settings this loader cannot take: it stopped there.
        v = Verdict(NO_STEPS, "unknown", None, evidence=[
            f"the job stopped where it made its DataLoader, before training: {set_error}"],
            figures=figures, findings=findings)
        v.recommendations.append(Recommendation(
            "run again with --set settings the loader can take", set_error,
            "a run with the settings asked for"))
        return v
    marked = [i for i in range(run.n) if run.marks[i]]
    marks = sum(run.step_count[i] for i in marked)
    if marks:
        return _steps_only(run, marked, marks, figures, findings)
    if not run.n:
        why.append("no interval was recorded (the run ended at once, or its records are lost)")
    began = [i for i in range(run.n) if run.epochs[i]]
    if began and not why:
        # The loop began iterating a DataLoader: no batch came, however long it waited.
        workers = max(int(run.num_workers[i]) for i in began)
        start = max(0.0, run.elapsed_s[began[0]] - run.secs[began[0]])
        why.append(
            f"the loop began iterating a DataLoader ({plural(workers, 'worker')}) in the "
            f"interval from {clock(start)} and no batch came in the "
            f"{max(0.0, run.elapsed_s[-1] - start):.0f} s until the recording ended"
            + (f" (exit code {meta['exit_code']})" if isinstance(meta.get("exit_code"), int)
               else ""))
        hang = hang_finding(run)
        if hang is not None:  # the headline: it hung, and where its processes wait
            v = Verdict(NO_STEPS, "unknown", None, evidence=[hang.evidence[0], why[-1]],
                        figures=figures, findings=[*findings, hang])
            v.recommendations += hang.recommendations
            return v
    if not why:
        why.append("no torch DataLoader batch was timed: the job is not a Python program, "
                   "does not use a DataLoader in its main process, or ended before its first "
                   "batch; wrap other loaders with iolens.instrument(loader) or mark steps "
                   "with iolens.step()")
    v = Verdict(NO_STEPS, "unknown", None, evidence=why, figures=figures, findings=findings)
    code = meta.get("exit_code")
    if began and isinstance(code, int) and not isinstance(code, bool) and code != 0:
        # It failed before its first batch: the loop is timed, the job's error is the news.
        spawned = sorted({str(ld.get("start_method")) for ld in meta.get("loaders") or []
                          if isinstance(ld, dict)
                          and ld.get("start_method") in ("spawn", "forkserver")})
        action = (f"fix the error the job exited with (code {code}) before its first batch: "
                  "its own output says what failed")
        if spawned:
            action += (f"; its DataLoader workers start by {' and '.join(spawned)}, which "
                       "imports the script again in each worker: the training loop must run "
                       "under `if __name__ == \"__main__\":`")
        v.recommendations.append(Recommendation(action, why[-1], "a run that reaches its "
                                                "first batch"))
        return v
    if meta.get("instrumented") is False:
        action = "record again without --no-instrument"
    elif meta.get("instrumented") is True:
        # Recorded with the DataLoader patch on (under `iolens run` or monitor()): what
        # is left is a loop that does not iterate a torch DataLoader in this process.
        action = ("time the loop itself: iterate over `iolens.instrument(loader)` (any "
                  "iterable of batches), or call iolens.step() once per step")
    else:
        action = ("time the loop: run the script under `iolens run`, or call "
                  "iolens.instrument(loader)")
    v.recommendations.append(Recommendation(action, why[0],
                                            "a verdict with evidence instead of none"))
    return v

def _steps_only(run: StageColumns, marked: Sequence[int], marks: int,
                figures: dict[str, Any], findings: list[Finding]) -> Verdict:
    """Steps marked with iolens.step() and no batch timed (in the intervals ``marked`` of
    the run's columns): the step figures, and how to get the data wait too."""
    step_s = sum(run.step_s[i] for i in marked)
    p50s = [run.step_p50_s[i] for i in marked]
    figures.update({"steps": marks, "step_source": "marks",
                    "step_time_s": round(step_s / marks, 6) if marks else None,
                    "step_p50_s": round(statistics.median(p50s), 6) if p50s else None,
                    "steps_per_s": round(marks / step_s, 3) if step_s > 0 else None})
    rate = figures["steps_per_s"]
    evidence = [f"{plural(marks, 'step')} timed between calls of iolens.step()"
                + (f", {rate:.2f} steps/s" if rate else "")
                + (f", median step {figures['step_p50_s'] * 1000:.1f} ms"
                   if figures["step_p50_s"] else "")
                + "; which part of each step waits for data is not timed"]
    v = Verdict(STEPS_ONLY, "unknown", None, evidence=evidence, figures=figures,
                findings=findings)
    first, last = marked[0], marked[-1]
    v.windows.append(Window(max(0.0, run.elapsed_s[first] - run.secs[first]),
                            run.elapsed_s[last], STEPS_ONLY))
    v.recommendations.append(Recommendation(
        "time the data too: iterate over `iolens.instrument(loader)` (any iterable of "
        "batches), so that each batch's wait is timed beside the steps",
        "the steps are marked, but not when the loop waits for its data",
        "the share of each step spent waiting for data, and a verdict on it"))
    return v

def _compute_bound(v: Verdict, cols: RunColumns) -> None:
    share = v.data_wait_share or 0.0
    step = v.figures.get("step_time_s") or 0.0
    v.evidence.append(f"the loop waited {share * 100:.1f}% of its step time for data "
                      f"({(v.figures.get('data_wait_s') or 0) * 1000:.1f} ms of a "
                      f"{step * 1000:.1f} ms step), below the {rules.MODERATE * 100:.0f}% mark")
    w = span_window(Span(cols, range(cols.steps.n)), "compute-bound")
    if w:
        v.windows.append(w)
    v.recommendations.append(v.fix(
        "look at the model step, not the input: profile it (torch.profiler), use mixed "
        "precision, a larger batch or a compiled model",
        "the data arrives in time",
        f"at most {share * 100:.1f}% from any input-side change", {"compute": 0.5},
        pm.cheaper_compute(0.5), basis=["if the model step took half as long"]))
