"""The verdict: what holds the training back, the evidence, and what to do about it.

Pure functions over a run's interval records (and its meta.json, when
there is one). The thresholds and their reasons live in
:mod:`iolens.analysis.rules`; this module applies them in this order:

1. Severity from the share of step time spent waiting for data.
2. The primary class, exactly one: ``write-stall`` when steps stall while the
   job's writes saturate a device and that costs more than the data wait;
   else ``compute-bound`` under the moderate band; else, for an input-bound
   run, ``storage-bound`` (a device serving the job saturated or slow, the
   job's reads making up its load, or the job blocked on I/O above a device),
   ``cpu-bound-input`` (workers or the whole machine out of CPU), or
   ``loader-starved`` (nothing saturated).
3. Secondary findings, any number: ``noisy-neighbor``, ``warm-cache``,
   ``cold-start``, ``epoch-start-stall``, ``no-disk-stats``.

A run with no timed batches gets the class ``no-steps`` with the reason.
"""

from __future__ import annotations

import bisect
import shlex
import statistics
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from iolens.analysis import model as pm
from iolens.analysis import rules
from iolens.analysis.model import Model, Prediction
from iolens.analysis.pipeline import Pipeline, pipeline
from iolens.core.words import plural
from iolens.training import overrides

PRIMARY_CLASSES = ("compute-bound", "storage-bound", "cpu-bound-input", "loader-starved",
                   "handover-bound", "write-stall", "hung")
FINDING_CLASSES = ("noisy-neighbor", "warm-cache", "cold-start", "epoch-start-stall",
                   "straggler", "no-disk-stats", "hang")
NO_STEPS = "no-steps"
HUNG = "hung"
"""The run ended while its loop waited for a batch longer than it had trained (NOTE [no
batch for a while] in iolens/recorder/sampler.py)."""
STEPS_ONLY = "steps-only"
"""Steps marked with iolens.step() and no batch timed: the step rate is known, the data
wait is not."""
NO_MODEL = ("the workers' stages were not timed, so there is no model of the pipeline to "
            "predict from")


def severity(share: float) -> str:
    """``none`` under 5%, ``moderate`` 5-20%, ``high`` from 20%."""
    if share >= rules.HIGH:
        return "high"
    if share >= rules.MODERATE:
        return "moderate"
    return "none"


def clock(seconds: float) -> str:
    """Elapsed time as ``mm:ss`` or ``h:mm:ss``."""
    s = max(0, round(seconds))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m:02d}:{sec:02d}"


@dataclass
class Window:
    """A stretch of the run, in seconds since its start."""

    start: float
    end: float
    label: str
    """What happened in it (the class or finding it supports)."""

    def text(self) -> str:
        return f"from {clock(self.start)} to {clock(self.end)}"

    def to_dict(self) -> dict[str, Any]:
        return {"start_s": round(self.start, 3), "end_s": round(self.end, 3), "label": self.label}


@dataclass
class Recommendation:
    """One thing to do, why (the evidence it follows from) and what it should gain: the
    model's prediction of the throughput after it (iolens.analysis.model), or why there
    is none."""

    action: str
    because: str
    gain: str
    prediction: Prediction | None = None
    unavailable: str | None = None
    """Why there is no prediction (a measurement, a change the model cannot size)."""
    change: dict[str, Any] | None = None
    """What the action changes, as data (``{"num_workers": 4}``): what ``iolens compare``
    looks for in the run after it."""
    try_it: str | None = None
    """The command that tries a change of DataLoader settings with no code change
    (``iolens run --set ...``), where the change is one."""

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "action": self.action, "because": self.because,
            "expected_gain": self.prediction.text() if self.prediction else self.gain,
            "prediction": self.prediction.to_dict() if self.prediction else None,
            "change": self.change}
        if self.try_it is not None:
            d["try"] = self.try_it
        if self.prediction is None:
            d["prediction_unavailable"] = self.unavailable or NO_MODEL
        return d


@dataclass
class Finding:
    """A secondary finding with its evidence."""

    cls: str
    evidence: list[str]
    window: Window | None = None
    recommendations: list[Recommendation] = field(default_factory=list)
    subject: dict[str, Any] = field(default_factory=dict)
    """What the finding is about, as data (the straggler's rank and host)."""

    def to_dict(self) -> dict[str, Any]:
        return {"class": self.cls, "evidence": self.evidence,
                "window": self.window.to_dict() if self.window else None,
                "recommendations": [r.to_dict() for r in self.recommendations],
                **self.subject}


@dataclass
class Verdict:
    """The answer to "why is my training slow, and what do I do?"."""

    cls: str
    """One of PRIMARY_CLASSES, or ``no-steps``."""
    severity: str
    """``none``, ``moderate``, ``high``, or ``unknown`` without timed steps."""
    data_wait_share: float | None
    """Share of step time (0-1) the loop waited for its data."""
    devices: list[str] = field(default_factory=list)
    """Devices the verdict implicates."""
    evidence: list[str] = field(default_factory=list)
    recommendations: list[Recommendation] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    windows: list[Window] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)
    """Run-level figures the verdict was drawn from (batches, step times ...)."""
    caveat: str | None = None
    """What the verdict could not see, in one sentence (no device statistics), or None."""
    storage: list[dict[str, Any]] = field(default_factory=list)
    """What serves the dataset: ``{"mount", "fstype", "device"}`` each (device None where
    no block device does), from the folders the input pipeline opened files in."""
    declined: list[Recommendation] = field(default_factory=list)
    """Changes the model predicts to gain nothing (or to lose): not offered as fixes."""
    model: Model | None = field(default=None, repr=False, compare=False)
    """The model of the pipeline the predictions come from (iolens.analysis.model)."""
    probe: dict[str, Any] | None = None
    """The storage probe's result for the dataset's storage (``iolens probe --storage``)."""
    run_dir: str = "RUN"
    """The run's folder, as advice names it (meta.json's ``run_dir``)."""
    loaders: list[dict[str, Any]] = field(default_factory=list, repr=False, compare=False)
    """The settings of the job's DataLoaders (meta.json's ``loaders``, NOTE [loader
    settings] in iolens/training/_hooks.py): advice never asks for what is set."""

    def already(self, key: str, value: Any) -> bool:
        """Whether every loader with workers already has ``key`` set to ``value`` (False
        when no loader's settings are known)."""
        mine = [d for d in self.loaders if int(d.get("num_workers") or 0) > 0]
        return bool(mine) and all(d.get(key) == value for d in mine)

    def offer(self, rec: Recommendation) -> None:
        """Add ``rec`` unless the model predicts it gains nothing as a fix."""
        p = rec.prediction
        if p is not None and rec.change and p.gain < rules.MIN_GAIN:
            self.declined.append(rec)
        else:
            self.recommendations.append(rec)

    def predict(self, change: pm.Change, *, workers: int | None = None,
                basis: Sequence[str] = ()) -> Prediction | None:
        return self.model.predict(change, workers, basis) if self.model else None

    def fix(self, action: str, because: str, gain: str, change: dict[str, Any],
            how: pm.Change, *, workers: int | None = None, basis: Sequence[str] = (),
            unavailable: str | None = None) -> Recommendation:
        """A recommendation with the model's prediction of the throughput after it."""
        pred = self.predict(how, workers=workers, basis=basis)
        if pred is None and unavailable is None and self.model is not None:
            unavailable = self.model.unavailable  # (too few batches to predict from)
        return Recommendation(action, because, gain, pred, unavailable, change)

    def lines(self) -> list[str]:
        """The three lines printed at the end of ``iolens run``."""
        return verdict_lines(self.to_dict())

    def to_dict(self) -> dict[str, Any]:
        return {
            "class": self.cls,
            "severity": self.severity,
            "data_wait_share": (round(self.data_wait_share, 4)
                                if self.data_wait_share is not None else None),
            "devices": self.devices,
            "evidence": self.evidence,
            "recommendations": [r.to_dict() for r in self.recommendations],
            "windows": [w.to_dict() for w in self.windows],
            "figures": self.figures,
            "caveat": self.caveat,
            "storage": self.storage,
            "model": self.model_dict(),
            "declined": [r.to_dict() for r in self.declined],
        }

    def model_dict(self) -> dict[str, Any] | None:
        """The model's figures: the rate it computes for the run as it was, the limit, what
        each stage allows, and how far it is from the measured rate."""
        m = self.model
        now = m.now if m is not None else None
        if m is None or now is None or m.whole is None:
            return None
        return {"steps_per_s": round(now.steps_per_s, 3), "limit": now.limit,
                "limits": now.limits, "measured_steps_per_s": round(m.whole.steps_per_s, 3),
                "fit": round(m.fit or 0.0, 4), "basis": pm.basis_of(m.whole),
                "num_workers": m.whole.workers, "batch_size": round(m.whole.batch, 2)}


def verdict_lines(v: dict[str, Any]) -> list[str]:
    """Class and severity, the main evidence, the first recommendation (a verdict's dict),
    and the caveat when there is one."""
    if v.get("class") == NO_STEPS:
        out = ["verdict: no timed training steps"]
    elif v.get("class") == STEPS_ONLY:
        out = ["verdict: steps marked, data wait not timed"]
    else:
        share = v.get("data_wait_share") or 0.0
        out = [f"verdict: {v.get('class')} (data wait {share * 100:.1f}% of step time, "
               f"{v.get('severity')})"]
    if v.get("evidence"):
        out.append(f"evidence: {v['evidence'][0]}")
    if v.get("recommendations"):
        r = v["recommendations"][0]
        sep = ": " if r.get("prediction") else "; expected: "
        out.append(f"try: {r.get('action')}{sep}{r.get('expected_gain')}")
        if r.get("try"):
            out.append(f"  with no code change: {r['try']}")
    if v.get("caveat"):
        out.append(f"note: {v['caveat']}")
    return out


# -- figures over a set of intervals ---------------------------------------------------


def _secs(rec: dict[str, Any]) -> float:
    try:
        return max(0.0, float(rec.get("interval_s") or 0.0))
    except (TypeError, ValueError):
        return 0.0


def _end(rec: dict[str, Any]) -> float:
    try:
        return float(rec.get("elapsed_s") or 0.0)
    except (TypeError, ValueError):
        return 0.0


def _window(recs: Sequence[dict[str, Any]], label: str) -> Window | None:
    if not recs:
        return None
    return Window(max(0.0, _end(recs[0]) - _secs(recs[0])), _end(recs[-1]), label)


def _num(d: Any, key: str) -> float:
    try:
        v = d.get(key) if isinstance(d, dict) else None
        return float(v) if v is not None else 0.0
    except (TypeError, ValueError):
        return 0.0


@dataclass
class DeviceLoad:
    """One device over a set of intervals, time-weighted as iostat would over the whole span."""

    name: str
    secs: float = 0.0
    util: float = 0.0
    r_s: float = 0.0
    w_s: float = 0.0
    rkB_s: float = 0.0
    wkB_s: float = 0.0
    r_await: float = 0.0
    w_await: float = 0.0
    aqu_sz: float = 0.0

    @property
    def rareq_kib(self) -> float:
        return self.rkB_s / self.r_s if self.r_s else 0.0

    @property
    def rMB_s(self) -> float:
        return self.rkB_s / 1024

    @property
    def wMB_s(self) -> float:
        return self.wkB_s / 1024


def device_load(recs: Iterable[dict[str, Any]], name: str) -> DeviceLoad:
    """Averages of one device's figures over ``recs``; awaits weighted by I/O counts."""
    out = DeviceLoad(name)
    r_ios = w_ios = r_wait = w_wait = 0.0
    util = rkb = wkb = aqu = 0.0
    for rec in recs:
        d = (rec.get("devices") or {}).get(name)
        if not isinstance(d, dict):
            continue
        s = _secs(rec)
        out.secs += s
        util += _num(d, "util") * s
        rkb += _num(d, "rkB_s") * s
        wkb += _num(d, "wkB_s") * s
        aqu += _num(d, "aqu_sz") * s
        ri, wi = _num(d, "r_s") * s, _num(d, "w_s") * s
        r_ios += ri
        w_ios += wi
        r_wait += _num(d, "r_await") * ri
        w_wait += _num(d, "w_await") * wi
    if out.secs > 0:
        out.util, out.rkB_s, out.wkB_s = util / out.secs, rkb / out.secs, wkb / out.secs
        out.aqu_sz = aqu / out.secs
        out.r_s, out.w_s = r_ios / out.secs, w_ios / out.secs
        out.r_await = r_wait / r_ios if r_ios else 0.0
        out.w_await = w_wait / w_ios if w_ios else 0.0
    return out


def _job_bytes(recs: Iterable[dict[str, Any]], role: str | None = None) -> tuple[float, float]:
    """Bytes the job (or one role) read from and wrote to storage over ``recs``."""
    rd = wr = 0.0
    for rec in recs:
        job = rec.get("job") or {}
        src = (job.get("roles") or {}).get(role) if role else job
        s = _secs(rec)
        rd += _num(src, "read_bytes_s") * s
        wr += _num(src, "write_bytes_s") * s
    return rd, wr


def _helper_bytes(recs: Iterable[dict[str, Any]]) -> float:
    """Bytes read from devices on the job's behalf by processes outside it: the local
    server of a network dataset, a FUSE daemon (NOTE [network storage] in
    iolens/recorder/network.py). They are the job's load, seen one step away."""
    out = 0.0
    for rec in recs:
        st = rec.get("storage")
        if not isinstance(st, dict):
            continue
        s = _secs(rec)
        for fig in st.values():
            out += (_num(fig, "server_read_bytes_s") + _num(fig, "daemon_read_bytes_s")) * s
    return out


def _device_names(records: Sequence[dict[str, Any]]) -> list[str]:
    names: dict[str, None] = {}
    for rec in records:
        for name in rec.get("devices") or {}:
            names.setdefault(name, None)
    return list(names)


def _train(rec: dict[str, Any]) -> dict[str, Any]:
    t = rec.get("train")
    return t if isinstance(t, dict) else {}


def timed_records(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The intervals with timed DataLoader batches: what the model is built from."""
    return [r for r in records if _timed(r)]


def _timed(rec: dict[str, Any]) -> bool:
    t = _train(rec)
    return t.get("step_source") == "dataloader" and _num(t, "batches") > 0


def _sum(rec: dict[str, Any], part: str) -> float:
    return _num(_train(rec).get(part) or {}, "sum_s")


def _share(recs: Iterable[dict[str, Any]]) -> float | None:
    wait = step = 0.0
    for r in recs:
        wait += _sum(r, "data_wait")
        step += _sum(r, "step")
    return wait / step if step > 0 else None


def _workers(recs: Sequence[dict[str, Any]]) -> tuple[int, float]:
    """Most workers seen at once, and their mean CPU per worker (% of a core) over ``recs``."""
    most = 0
    per_worker: list[tuple[float, float]] = []
    for rec in recs:
        w = ((rec.get("job") or {}).get("roles") or {}).get("worker") or {}
        n = int(_num(w, "pids"))
        most = max(most, n)
        if n:
            per_worker.append((_num(w, "cpu_pct") / n, _secs(rec)))
    secs = sum(s for _, s in per_worker)
    mean = sum(c * s for c, s in per_worker) / secs if secs else 0.0
    return most, mean


def _machine_idle(recs: Sequence[dict[str, Any]]) -> float | None:
    """Mean idle + iowait percent of all CPUs over ``recs`` (None without CPU figures)."""
    vals = [(_num(c, "idle") + _num(c, "iowait"), _secs(r))
            for r in recs if isinstance(c := r.get("cpu"), dict) and c]
    secs = sum(s for _, s in vals)
    return sum(v * s for v, s in vals) / secs if secs else None


def _d_state_share(recs: Sequence[dict[str, Any]]) -> float:
    """Share of the job's process samples in uninterruptible sleep (state D)."""
    d = total = 0
    for rec in recs:
        states = (rec.get("job") or {}).get("states") or {}
        if isinstance(states, dict):
            for k, v in states.items():
                n = int(v) if isinstance(v, int) else 0
                total += n
                if k == "D":
                    d += n
    return d / total if total else 0.0


def _ceiling(share: float) -> str:
    """What removing the data wait entirely would give."""
    if share >= 0.999:
        return "the loop does nothing but wait: any faster input speeds it up in proportion"
    return (f"up to {1 / (1 - share):.2f}x more steps per second if the data wait went to zero "
            f"(it is {share * 100:.0f}% of the step time)")


# -- the verdict -----------------------------------------------------------------------


def diagnose(records: Sequence[dict[str, Any]], meta: dict[str, Any] | None = None) -> Verdict:
    """The verdict over a run's records (in order). ``meta`` adds the CPU count and notes."""
    meta = meta or {}
    records, tuned = _tuned_part(records, meta)
    timed = [r for r in records if _timed(r)]
    batches = int(sum(_num(_train(r), "batches") for r in timed))
    figures = _figures(records, timed, meta)
    blind = _no_disk_stats(records, meta)
    findings = [blind] if blind is not None else []
    storage = served_storage(meta)
    if batches == 0:
        v = _no_steps(records, meta, figures, findings)
        v.storage = storage
        return v
    share = _share(timed) or 0.0
    v = Verdict("compute-bound", severity(share), share, figures=figures,
                caveat=blind.evidence[0] if blind is not None else None, storage=storage)
    v.probe = _probe_for(meta, storage)
    if isinstance(meta.get("run_dir"), str):
        v.run_dir = shlex.quote(meta["run_dir"])
    v.loaders = [d for d in meta.get("loaders") or [] if isinstance(d, dict)]
    model = Model(timed, int(meta.get("cpus") or 0) or None)
    v.model = model if model.whole is not None else None
    stall = _write_stall(records, timed, share)
    if stall is not None:
        v.cls, v.devices, v.evidence, v.recommendations, v.windows = stall
    elif share < rules.MODERATE:
        _compute_bound(v, timed)
        _epoch_starts_first(v, timed)
    else:
        _input_bound(v, timed, meta)
        _epoch_starts_first(v, timed)
        _nothing_to_gain(v)
    if batches < rules.MIN_BATCHES:
        v.evidence.append(f"only {plural(batches, 'batch', 'batches')} timed: a longer run "
                          "gives a firmer verdict")
    v.findings = findings + _findings(records, timed, v)
    hang = next((f for f in v.findings if f.cls == "hang"), None)
    step_s = sum(_sum(r, "step") for r in timed)
    if hang is not None and _num(_train(records[-1]), "waiting_s") > step_s:
        # It hung for longer than it trained: that is what the run says, first.
        v.cls, v.severity = HUNG, "high"
        v.evidence.insert(0, hang.evidence[0])
        # (advice from a handful of batches before the hang would only distract)
        v.recommendations = hang.recommendations + (
            v.recommendations if batches >= rules.MIN_BATCHES else [])
    if tuned is not None:
        v.evidence.append(tuned)
    _not_what_failed(v, meta)
    _how_to_try(v, meta)
    return v


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


def _tuned_part(records: Sequence[dict[str, Any]],
                meta: dict[str, Any]) -> tuple[Sequence[dict[str, Any]], str | None]:
    """A run of ``iolens run --autotune`` is judged on the intervals since its loader
    settings last changed (NOTE [autotune between epochs] in iolens/training/autotune.py):
    the epochs before ran other settings, whose figures would blend into figures of no
    setting at all. The words that say so, or None (a run without autotune, or one whose
    settings never changed)."""
    at = meta.get("autotune")
    since = at.get("since_t") if isinstance(at, dict) else None
    if not isinstance(since, int | float) or isinstance(since, bool):
        return records, None
    kept = [r for r in records if _num(r, "t") > since]
    if not kept or len(kept) == len(records):
        return records, None
    return kept, (f"the verdict is of the run from {clock(_num(kept[0], 'elapsed_s'))} on, "
                  "where autotune's settings last changed: the epochs before ran other "
                  "settings")


def _how_to_try(v: Verdict, meta: dict[str, Any]) -> None:
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


def _figures(records: Sequence[dict[str, Any]], timed: Sequence[dict[str, Any]],
             meta: dict[str, Any]) -> dict[str, Any]:
    batches = int(sum(_num(_train(r), "batches") for r in timed))
    step_s = sum(_sum(r, "step") for r in timed)
    wait_s = sum(_sum(r, "data_wait") for r in timed)
    p50s = [_num(_train(r).get("step") or {}, "p50_s") for r in timed]
    waits = [_num(_train(r).get("data_wait") or {}, "p50_s") for r in timed]
    return {
        "intervals": len(records),
        "seconds": round(sum(_secs(r) for r in records), 3),
        "batches": batches,
        "epochs": int(sum(_num(_train(r), "epochs_started") for r in records)),
        "step_time_s": round(step_s / batches, 6) if batches else None,
        "data_wait_s": round(wait_s / batches, 6) if batches else None,
        "step_p50_s": round(statistics.median(p50s), 6) if p50s else None,
        "data_wait_p50_s": round(statistics.median(waits), 6) if waits else None,
        "steps_per_s": round(batches / step_s, 3) if step_s > 0 else None,
        "cpus": meta.get("cpus"),
    }


def _no_steps(records: Sequence[dict[str, Any]], meta: dict[str, Any],
              figures: dict[str, Any], findings: list[Finding]) -> Verdict:
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
    marked = [r for r in records if _train(r).get("step_source") == "marks"]
    marks = sum(_num(_train(r).get("step") or {}, "count") for r in marked)
    if marks:
        return _steps_only(marked, int(marks), figures, findings)
    if not records:
        why.append("no interval was recorded (the run ended at once, or its records are lost)")
    began = [r for r in records if _num(_train(r), "epochs_started")]
    if began and not why:
        # The loop began iterating a DataLoader: no batch came, however long it waited.
        workers = max(int(_num(_train(r), "num_workers")) for r in began)
        start = max(0.0, _end(began[0]) - _secs(began[0]))
        why.append(
            f"the loop began iterating a DataLoader ({plural(workers, 'worker')}) in the "
            f"interval from {clock(start)} and no batch came in the "
            f"{max(0.0, _end(records[-1]) - start):.0f} s until the recording ended"
            + (f" (exit code {meta['exit_code']})" if isinstance(meta.get("exit_code"), int)
               else ""))
        hang = _hang(records)
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


def _steps_only(marked: Sequence[dict[str, Any]], marks: int, figures: dict[str, Any],
                findings: list[Finding]) -> Verdict:
    """Steps marked with iolens.step() and no batch timed: the step figures, and how to get
    the data wait too."""
    step_s = sum(_sum(r, "step") for r in marked)
    p50s = [_num(_train(r).get("step") or {}, "p50_s") for r in marked]
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
    w = _window(marked, STEPS_ONLY)
    if w:
        v.windows.append(w)
    v.recommendations.append(Recommendation(
        "time the data too: iterate over `iolens.instrument(loader)` (any iterable of "
        "batches), so that each batch's wait is timed beside the steps",
        "the steps are marked, but not when the loop waits for its data",
        "the share of each step spent waiting for data, and a verdict on it"))
    return v


def _compute_bound(v: Verdict, timed: Sequence[dict[str, Any]]) -> None:
    share = v.data_wait_share or 0.0
    step = v.figures.get("step_time_s") or 0.0
    v.evidence.append(f"the loop waited {share * 100:.1f}% of its step time for data "
                      f"({(v.figures.get('data_wait_s') or 0) * 1000:.1f} ms of a "
                      f"{step * 1000:.1f} ms step), below the {rules.MODERATE * 100:.0f}% mark")
    w = _window(timed, "compute-bound")
    if w:
        v.windows.append(w)
    v.recommendations.append(v.fix(
        "look at the model step, not the input: profile it (torch.profiler), use mixed "
        "precision, a larger batch or a compiled model",
        "the data arrives in time",
        f"at most {share * 100:.1f}% from any input-side change", {"compute": 0.5},
        pm.cheaper_compute(0.5), basis=["if the model step took half as long"]))


def _input_windows(timed: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for r in timed:
        s = _share([r])
        if s is not None and s >= rules.MODERATE:
            out.append(r)
    return out or list(timed)


def _input_bound(v: Verdict, timed: Sequence[dict[str, Any]], meta: dict[str, Any]) -> None:
    share = v.data_wait_share or 0.0
    win = _input_windows(timed)
    window = _window(win, "input-bound")
    when = f", {window.text()}" if window else ""
    ceiling = _ceiling(share)
    job_read, _ = _job_bytes(win)
    job_read += _helper_bytes(win)
    workers, worker_cpu = _workers(win)
    declared = max([int(_num(_train(r), "num_workers")) for r in timed]
                   + [int(_num(d, "num_workers")) for d in v.loaders], default=0)
    plain = (not declared and any(_train(r).get("iterable_loader") is True for r in timed))
    unseen = workers == 0 and declared > 0  # short-lived workers between two samples
    workers = max(workers, declared) if unseen else workers
    idle = _machine_idle(win)
    cpus = int(meta.get("cpus") or 0)
    # storage: the busiest device the job's reads make up, saturated or slow
    best: tuple[DeviceLoad, float] | None = None
    for name in _device_names(win):
        load = device_load(win, name)
        dev_bytes = load.rkB_s * 1024 * load.secs
        own = min(1.0, job_read / dev_bytes) if dev_bytes > 0 else 0.0
        busy = load.util >= rules.UTIL_SATURATED or (
            load.r_await >= rules.AWAIT_SLOW_MS and load.aqu_sz >= rules.QUEUE_BUSY)
        if busy and own >= rules.JOB_SHARE_OWN and (best is None or load.util > best[0].util):
            best = (load, own)
    d_share = _d_state_share(win)
    # Without device figures nothing says the storage is idle: say it was not measured.
    measured = bool(_device_names(win))
    storage = "the storage not saturated" if measured else "the storage not measured"
    pipe = pipeline(win, meta)
    idle_workers = pipe is not None and (pipe.worker_idle_share or 0.0) >= rules.WORKERS_IDLE
    # Of the workers' busy time (fetch and collate, the collate counted as CPU): a light
    # read beside a heavy collate is not storage's doing.
    blocked = pipe is not None and (pipe.busy_blocked_share or 0.0) >= rules.FETCH_BLOCKED
    on_cpu = pipe is not None and (1 - (pipe.busy_blocked_share or 0.0)) >= rules.FETCH_CPU
    top = v.storage[0] if v.storage else None
    if top is not None and top.get("kind") == "network" and pipe is not None and (
            best is not None or (blocked and not idle_workers
                                 and reads_dataset(pipe, v.storage))):
        _network_store(v, pipe, win, top, best[0] if best is not None else None,
                       share=share, when=when, ceiling=ceiling, workers=workers)
    elif best is not None:
        load, own = best
        v.cls, v.devices = "storage-bound", [load.name]
        v.evidence.append(
            f"{load.name} {load.util:.0f}% util, r_await {load.r_await:.1f} ms, aqu-sz "
            f"{load.aqu_sz:.1f}, {load.rMB_s:.1f} MB/s in {load.r_s:.0f} reads/s of "
            f"{load.rareq_kib:.0f} KiB, {own * 100:.0f}% of its reads by this job{when}")
        v.evidence.append(f"the loop waited {share * 100:.1f}% of its step time for data")
        if pipe is not None:
            v.evidence.append(fetch_text(pipe))
        _saturated_device(v, load, ceiling=ceiling, workers=workers,
                          iterable=any(_train(r).get("iterable_loader") is True for r in win)
                          or any(d.get("iterable") is True for d in v.loaders),
                          packed=_packed(v, pipe))
    elif (pipe is not None and blocked and not idle_workers
          and _waits_on_storage(pipe, win, v.storage, d_share)):
        _storage_from_inside(v, pipe, win, share=share, when=when, ceiling=ceiling,
                             workers=workers)
    elif pipe is None and d_share >= rules.D_STATE_SHARE and job_read > 0:
        v.cls = "storage-bound"
        v.devices = _busiest_read(win)
        v.evidence.append(
            f"the job's processes were blocked on I/O (state D) in {d_share * 100:.0f}% of "
            f"the samples while reading {job_read / max(_span(win), 1e-9) / 2**20:.1f} MB/s, "
            f"yet no device they read is saturated: the limit is above the device (a cgroup "
            f"I/O throttle, a network or FUSE filesystem){when}")
        v.evidence.append(f"the loop waited {share * 100:.1f}% of its step time for data")
        v.recommendations.append(Recommendation(
            "lift the I/O limit (cgroup io.max / blkio throttle) or copy the dataset to "
            "local storage or RAM first", "reads wait above the block device", ceiling))
    elif pipe is not None and idle_workers and _handover_share(pipe, win) >= rules.HANDOVER_SHARE:
        _handover_bound(v, pipe, win, share=share, when=when, workers=workers)
    elif (pipe is not None and on_cpu and not idle_workers) or (pipe is None and workers and (
            worker_cpu >= rules.WORKER_CPU_BUSY or (
                worker_cpu >= rules.WORKER_CPU_SOME and idle is not None
                and idle < rules.MACHINE_IDLE_LOW))):
        v.cls = "cpu-bound-input"
        free = cpus * (idle or 0.0) / 100 if cpus else 0.0
        if workers:
            v.evidence.append(f"{plural(workers, 'DataLoader worker')} at {worker_cpu:.0f}% "
                              f"of a core each{when}")
        if idle is not None:
            v.evidence.append(f"the machine's CPUs {100 - idle:.0f}% busy"
                              + (f" ({free:.1f} of {cpus} cores free)" if cpus else ""))
        v.evidence.append(f"the loop waited {share * 100:.1f}% of its step time for data; "
                          + ("the storage is not saturated" if measured
                             else "the storage was not measured"))
        if pipe is not None:
            v.evidence.append(fetch_text(pipe))
        fewer = _fewer_workers(v, pipe, workers)
        if fewer is not None:
            v.offer(fewer)
        target = v.model.workers_to_next_limit() if v.model is not None else None
        if fewer is None and target is not None and target > workers:
            v.offer(_raise_workers(v, workers, target, f"{free:.1f} cores are idle while "
                                   "each worker is busy" if free >= 1 else
                                   "the workers' CPU use leaves room", ceiling))
        elif v.model is None and free >= 1:
            v.recommendations.append(Recommendation(
                f"raise num_workers from {workers} to {workers + int(free)}",
                f"{free:.1f} cores are idle while each worker is busy", ceiling,
                change={"num_workers": workers + int(free)}))
        v.offer(v.fix(
            "make the per-sample work cheaper: decode at lower resolution, move augmentation "
            "to the GPU (torchvision.transforms.v2 on tensors, DALI), or pre-process once and "
            "store the result",
            f"the workers spend {worker_cpu:.0f}% of a core each on CPU work"
            if workers else "the CPUs are busy", ceiling, {"fetch_cpu": 0.5},
            pm.cheaper_fetch(0.5), basis=["if the per-sample CPU cost halved"]))
        v.recommendations.append(_tune(v))
    else:
        v.cls = "loader-starved"
        if unseen:
            v.evidence.append(f"{plural(workers, 'DataLoader worker')} asked for, none seen at "
                              "work in "
                              f"the samples (each lives shorter than an interval), "
                              f"{storage}{when}")
        elif workers:
            v.evidence.append(f"{plural(workers, 'DataLoader worker')} at {worker_cpu:.0f}% "
                              f"of a core each, {storage}{when}")
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
                  else _more_workers(workers, worker_cpu, cpus, idle)) or workers
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
            v.offer(_raise_workers(v, workers, target, why_more, ceiling))
        elif v.model is not None and workers and model_target is None:
            # The model's workers do not bind: one more is the candidate it sizes (offered
            # only if the model predicts it gains; else it is declined with its figure).
            v.offer(_raise_workers(v, workers, workers + 1, why_more, ceiling))
        elif target > workers:
            v.recommendations.append(Recommendation(
                f"raise num_workers from {workers} to {target}", why_more, ceiling,
                change={"num_workers": target}))
        bursts = _bursty(win)
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
        if any(r.get("gpu") for r in timed) and not v.already("pin_memory", True):
            v.recommendations.append(Recommendation(
                "use pin_memory=True in the DataLoader and .to(device, non_blocking=True)",
                "host-to-GPU copies then overlap the step", "overlapped copies", None,
                "the model does not time the host-to-GPU copy", {"pin_memory": True}))
        v.recommendations.append(_tune(v))
    if window is not None:
        window.label = v.cls
        v.windows.append(window)


def _raise_workers(v: Verdict, workers: int, target: int, because: str,
                   ceiling: str) -> Recommendation:
    """More workers, as many as reach the next limit (the model's number, not a doubling);
    from none, in a run that began several epochs, persistent ones (NOTE [an epoch's first
    batch from workers] in iolens/analysis/model.py): workers started anew each epoch cost
    that epoch their start, which the model does not know from a run without them."""
    action, change = f"raise num_workers from {workers} to {target}", {"num_workers": target}
    epochs = (sum(_num(_train(r), "epochs_started") for r in v.model.records)
              if v.model is not None else 0)
    if not workers and epochs >= 2:
        action += " and set persistent_workers=True"
        change["persistent_workers"] = True
    return v.fix(action, because, ceiling, change, pm.more_workers(target),
                 basis=[f"{target} workers, each making a batch in the time one takes now"])


def _fewer_workers(v: Verdict, pipe: Pipeline | None, workers: int) -> Recommendation | None:
    """Fewer workers, as many as the job has cores, where more workers than that queue for
    the cores (NOTE [a fetch that waits for a core] in iolens/analysis/pipeline.py): each
    process beyond the cores costs CPU of its own (switches, caches, its epoch start) and
    takes the loop's core from it. The model takes the workers' wait for a core away in
    proportion, and counts a sample's CPU halfway down what the extra workers may cost
    (NOTE [workers beyond the cores] in iolens/analysis/model.py)."""
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


def _probe_for(meta: dict[str, Any], storage: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The storage probe's result (meta's ``storage_probe``, from ``iolens probe --storage
    PATH --run RUN``) when it probed what serves the dataset: the same mount or device."""
    p = meta.get("storage_probe")
    if not isinstance(p, dict) or p.get("limit") not in ("iops", "bandwidth", "latency",
                                                          "rate"):
        return None
    if not storage:
        return p
    top = storage[0]
    same = (p.get("mount") == top.get("mount")
            or (p.get("device") is not None and p.get("device") == top.get("device")))
    return p if same else None


def _probe_rec(v: Verdict, settles: str) -> Recommendation:
    """The probe of the dataset's storage, where it would settle the advice."""
    return Recommendation(
        f"measure the storage's ceilings: `iolens probe --storage {_where(v)} --run "
        f"{v.run_dir}` (a few seconds of read-only reads), then `iolens report {v.run_dir}` "
        "again",
        settles, "a prediction for the fix that fits",
        unavailable="a measurement, not a change: it settles which fix to predict")


def _store_limited(v: Verdict, samples_per_s: float) -> None:
    """From here on the model knows the storage serves at most ``samples_per_s``."""
    m = v.model
    if m is not None:
        v.model = Model(m.records, m.cpus, storage_sps=samples_per_s)


def _samples_per_s(v: Verdict) -> float:
    m = v.model
    return m.whole.steps_per_s * m.whole.batch if m is not None and m.whole else 0.0


def _packed(v: Verdict, pipe: Pipeline | None) -> str | None:
    """Whether the dataset sits in large files already (LMDB, HDF5, Arrow, tar shards):
    ``blocks`` when it is also read in blocks (a block sampler, or streamed), ``scattered``
    when it is read one sample at a time, None when it is a file per sample (or unknown).

    A dataset file many samples large, or one the job maps, is a pack: the storage entry
    has the largest data file the job held open or mapped."""
    top = v.storage[0] if v.storage else {}
    per = (pipe.bytes_per_sample or 0.0) if pipe is not None else 0.0
    large = _num(top, "largest_file") >= max(rules.PACKED_FILE_BYTES,
                                             rules.PACKED_FILE_SAMPLES * per)
    if not (large or top.get("mapped")):
        return None
    if pipe is not None and (pipe.files_per_sample or 0.0) >= rules.PACKED_FILES_PER_SAMPLE:
        return None  # (a file opened per sample beside the large one: a file per sample)
    in_blocks = block_sampled(v) or any(d.get("iterable") is True for d in v.loaders)
    return "blocks" if in_blocks else "scattered"


def block_sampled(v: Verdict) -> bool:
    """Whether the run's loaders read in blocks of consecutive samples (the sampler the
    pack advice names)."""
    return any("BlockShuffleSampler" in str(d.get("sampler") or "") for d in v.loaders)


def _saturated_device(v: Verdict, load: DeviceLoad, *, ceiling: str, workers: int,
                      iterable: bool = False, packed: str | None = None) -> None:
    """A device the job's reads saturate, or keep slow with a queue: what it serves now is
    its ceiling in this reading pattern. A cache lifts it; a pack only where the device
    limits requests, not bytes, and the data is not in large files already: then reading
    the large files in larger requests (a batch of consecutive samples) is what a pack
    would have brought; data read in blocks already is told no more."""
    word = "saturated" if load.util >= rules.UTIL_SATURATED else "slow"
    state = word if word == "saturated" else (
        f"slow ({load.r_await:.1f} ms a read, {load.aqu_sz:.1f} queued)")
    sps = _samples_per_s(v)
    if sps > 0:
        _store_limited(v, sps * 100 / max(load.util, rules.UTIL_SATURATED))
    small = load.rareq_kib < rules.SMALL_READ_KIB
    probe = v.probe
    cache = v.fix(
        "cache the dataset in RAM (/dev/shm, or the page cache once it fits and is read "
        "again) or put it on faster local storage (NVMe)",
        f"{load.name} answers in {load.r_await:.1f} ms at {load.util:.0f}% util", ceiling,
        {"storage": "ram"}, pm.cached(),
        basis=["if the dataset fits in RAM: no reads reach a device"])
    pack_action = _pack_action(iterable) if packed is None else _block_action()
    because_small = (f"{load.name} is {state} with small reads ({load.rareq_kib:.0f} KiB "
                     f"on average, {load.r_s:.0f}/s)")
    limit = probe.get("limit") if probe else None
    if small and packed == "blocks":
        v.offer(cache)
        v.declined.append(Recommendation(
            _pack_action(iterable), "the dataset is in large files read in blocks already",
            "none", unavailable="the data is packed and read in order already",
            change={"pack": True}))
        v.evidence.append("the dataset is in large files, read in blocks already: a pack "
                          "would change nothing")
    elif small and limit == "iops":
        v.offer(_pack_rec(v, probe or {}, load, action=pack_action, because=because_small,
                          ceiling=ceiling))
        v.offer(cache)
    elif small and limit == "bandwidth":
        v.offer(cache)
        v.declined.append(Recommendation(
            pack_action, "the probe found the device limits bytes, not requests: "
            f"large reads give no more than {_mb(probe)} MB/s", "none",
            unavailable="packing reads the same bytes from a device that limits bytes",
            change={"pack": True}))
        v.evidence.append(f"the storage probe: {load.name} limits bytes ({_mb(probe)} MB/s "
                          "whatever the request size), not requests: packing would not help")
    elif small:
        v.offer(cache)
        if v.storage:  # (the probe needs a path on the storage: never a placeholder)
            v.recommendations.append(_probe_rec(
                v, "whether the device limits requests (then packing helps) or bytes "
                "(then only a cache or faster storage does) decides the fix"))
        v.recommendations.append(Recommendation(
            pack_action, because_small, ceiling, None,
            "whether the device limits requests or bytes is not known: the probe tells",
            {"pack": True}))
    else:
        v.offer(cache)
    more = max(2 * workers, workers + 2)
    v.recommendations.append(v.fix(
        f"do not add DataLoader workers (or prefetch) while {load.name} is {state}",
        f"{load.name} is {load.util:.0f}% busy", "little until the device is relieved",
        {"num_workers": more}, pm.more_workers(more),
        basis=[f"{more} workers: more requests in flight on a {word} device"]))


def _block_action() -> str:
    """The pack advice for data in large files already, read one sample at a time."""
    return ("read the large files in larger requests: a batch of consecutive samples at a "
            "time, in a random order of blocks (sampler=iolens.data.BlockShuffleSampler("
            "dataset, batch_size), with __getitems__ reading a batch in one request, as "
            "iolens.data.LMDBDataset and HDF5Dataset do), or HDF5 chunks of a batch; the "
            "data is packed already")


def _pack_action(iterable: bool) -> str:
    """The pack advice in the form that fits the job's loader: tar shards streamed whole for
    an IterableDataset (``iterable``), an indexed pack read in shuffled blocks for a
    map-style one."""
    if iterable:
        return ("pack the dataset into tar shards read whole: `iolens pack SRC DST --format "
                "webdataset --shard-size 256M --shuffle`; read them with "
                "webdataset.WebDataset(DST/shard-{00000..N}.tar, shardshuffle=True)"
                ".shuffle(1000): the shards in a new order each epoch, each read in order, "
                "the samples mixed in a buffer")
    return ("pack the dataset into large files read in large requests: `iolens pack SRC DST "
            "--shuffle` writes LMDB or HDF5 shards in a random order; read them with "
            "iolens.data.LMDBDataset or HDF5Dataset and "
            "sampler=iolens.data.BlockShuffleSampler(dataset, batch_size), so that each "
            "batch is one read of consecutive samples")


def _where(v: Verdict) -> str:
    """The dataset's folder to probe: its first folder, else its mount."""
    top = v.storage[0]
    folders = top.get("folders") or []
    return str(folders[0] if folders and isinstance(folders[0], str) else top["mount"])


def _mb(probe: dict[str, Any] | None) -> str:
    bw = _num(probe, "bandwidth_ceiling")
    return f"{bw / 2**20:.1f}"


def _pack_rec(v: Verdict, probe: dict[str, Any], load: DeviceLoad, *, action: str,
              because: str, ceiling: str) -> Recommendation:
    """Packing on a device that limits requests: the same bytes in requests of about
    PACK_REQUEST_BYTES, each costing one of the device's requests."""
    sps = _samples_per_s(v)
    iops, bw = _num(probe, "iops_ceiling"), _num(probe, "bandwidth_ceiling")
    per = (load.rkB_s * 1024 / sps) if sps > 0 else 0.0  # device bytes per sample now
    m = v.model
    if per <= 0 or iops <= 0 or bw <= 0 or m is None or m.whole is None:
        return Recommendation(action, because, ceiling, None,
                              "the device's bytes per sample or the probe's ceilings are "
                              "missing", {"pack": True})
    # In order, the kernel reads a pack in requests of its readahead window, the size the
    # probe read at; a batch larger than the window is read in one larger request.
    seq = probe.get("sequential") or {}
    window = _num(seq, "request_bytes") or rules.PACK_REQUEST_BYTES
    request = max(per, window, min(m.whole.batch * per, rules.PACK_REQUEST_BYTES))
    packed = min(iops * request / per, bw / per)
    fetch = m.whole.fetch_cpu_s + per / bw
    return v.fix(action, because + f"; the probe found it limits requests ({iops:.0f}/s), "
                 f"with {bw / 2**20:.1f} MB/s in large reads", ceiling, {"pack": True},
                 pm.storage_at(packed, fetch),
                 basis=[f"packed, {per / 1024:.0f} KiB per sample read a batch at a time, in "
                        f"requests of {request / 1024:.0f} KiB: the device serves "
                        f"{packed:.0f} samples/s"])


def reads_dataset(pipe: Pipeline, storage: Sequence[dict[str, Any]] = ()) -> bool:
    """Whether the fetch reads files or bytes enough to be reading a dataset: files
    opened, bytes read through syscalls, bytes read from a device (page faults of a
    memmap count there, not in rchar), or a dataset mapped into memory."""
    least = rules.READS_DATA_BYTES_IN_PROCESS if pipe.in_process else rules.READS_DATA_BYTES
    return (bool(pipe.files) or (pipe.bytes_per_sample or 0.0) >= least
            or (pipe.disk_bytes_per_sample or 0.0) >= least
            or any(s.get("mapped") for s in storage[:1]))


def _waits_on_storage(pipe: Pipeline, win: Sequence[dict[str, Any]],
                      storage: list[dict[str, Any]], d_share: float) -> bool:
    """Whether a fetch that blocks off CPU blocks on the dataset's storage.

    It must read the dataset. On FUSE or NFS (the mount the most files were opened
    on) that is enough: those reads are what blocks. On a block device, the device
    must be slow (r_await), busy (rules.BLOCKED_DEVICE_UTIL), or the job's processes
    blocked on I/O (state D) in most samples, as under a throttle above the device; a
    fetch that sleeps or waits on a lock or a remote call sits in state S beside a fast,
    idle device.
    """
    if not reads_dataset(pipe, storage):
        return False
    top = storage[0] if storage else None
    if top is not None and top.get("kind") in ("fuse", "nfs"):
        return True
    if d_share >= rules.D_STATE_SHARE:
        return True
    loads = [device_load(win, d) for d in (top.get("disks") or [])] if top is not None else []
    return any(x.r_await >= rules.AWAIT_SLOW_MS or x.util >= rules.BLOCKED_DEVICE_UTIL
               for x in loads)


def _handover_share(pipe: Pipeline, win: Sequence[dict[str, Any]]) -> float:
    """The part of the loop's data wait that is the batches' hand-over or the epochs' first
    batches (at most 1: the two overlap in the first batch)."""
    wait = sum(_sum(r, "data_wait") for r in win)
    if wait <= 0:
        return 0.0
    batches = sum(_num(_train(r), "batches") for r in win)
    hand = (pipe.handover_s_per_batch or 0.0) * batches
    starts = sum(_num(x, "sum_s") for r in win
                 if isinstance(x := _train(r).get("epoch_start_wait"), dict))
    return min(1.0, (hand + starts) / wait)


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
        out += (f", reading {(pipe.bytes_per_sample or 0.0) / 1024:.1f} KiB in "
                f"{pipe.files_per_sample or 0.0:.2f} files per sample")
    idle = pipe.worker_idle_share
    if idle is not None:
        out += f"; the workers idle {idle * 100:.0f}% of their time"
    return out


def _bursty(recs: Sequence[dict[str, Any]]) -> str | None:
    """Why deeper prefetch would help, when the waits come in bursts (the p95 wait well
    above the median); None when they do not."""
    p50s = [_num(_train(r).get("data_wait") or {}, "p50_s") for r in recs]
    p95s = [_num(_train(r).get("data_wait") or {}, "p95_s") for r in recs]
    if not p50s:
        return None
    p50, p95 = statistics.median(p50s), statistics.median(p95s)
    if p95 <= 2 * p50 or p95 < 0.001:  # (under a millisecond: no burst worth a setting)
        return None
    return (f"the workers fall behind in bursts: the p95 wait {p95 * 1000:.1f} ms against a "
            f"median {p50 * 1000:.1f} ms")


def _storage_from_inside(v: Verdict, pipe: Pipeline, win: Sequence[dict[str, Any]], *,
                         share: float, when: str, ceiling: str, workers: int) -> None:
    """storage-bound from the workers' own timing: the fetch blocks off CPU while reading
    the dataset, whatever serves it (a FUSE or NFS mount, a throttled device)."""
    v.cls = "storage-bound"
    where = v.storage[0] if v.storage else None
    if where is not None and where.get("disks"):
        v.devices = [str(d) for d in where["disks"]]
        load = device_load(win, v.devices[0])
        what = (f"{where['mount']} ({where['fstype']} on {where['device']}: "
                f"{load.util:.0f}% util, r_await {load.r_await:.1f} ms, "
                f"{load.rMB_s:.1f} MB/s)")
    elif where is not None:
        what = f"{where['mount']} ({where['fstype']}, no block device)"
    else:
        what = "storage iolens could not map"
    v.evidence.append(f"the fetch blocks off CPU while it reads the dataset from {what}{when}")
    v.evidence.append(fetch_text(pipe))
    waiting = _fuse_waiting(win, where["mount"]) if where is not None else None
    if waiting is not None:
        v.evidence.append(f"{waiting:.1f} requests waiting on the FUSE connection on average")
    v.evidence.append(f"the loop waited {share * 100:.1f}% of its step time for data")
    kind = where.get("kind") if where is not None else None
    cache = v.fix(
        "cache the dataset near the job: the mount's own cache (rclone --vfs-cache-mode "
        "full, mountpoint-s3 --cache DIR, gcsfuse's file cache, s3fs -o use_cache=DIR), "
        "or copy it to local NVMe or /dev/shm before training",
        f"every epoch reads it again through {where['fstype'] if where else 'the mount'}",
        ceiling, {"storage": "ram"}, pm.cached(),
        basis=["if the dataset fits the cache: no request reaches the store"])
    if kind in ("fuse", "nfs"):
        limit = v.probe.get("limit") if v.probe else None
        if limit == "rate":
            # The store serves a fixed number of requests a second: what it serves now.
            _store_limited(v, _samples_per_s(v))
            v.evidence.append(
                f"the storage probe: the store serves about "
                f"{_num(v.probe, 'iops_ceiling'):.0f} requests/s however many are in "
                "flight (a rate limit): more workers cannot fetch faster")
        target = v.model.workers_to_next_limit() if v.model is not None else None
        more = target or (max(2 * workers, workers + 2) if workers else 4)
        if limit == "latency":
            if target is not None:
                v.offer(_raise_workers(v, workers, more, "the probe found the store answers "
                                       "more requests at once about as fast as one: its "
                                       "latency, not a rate limit, sets the pace", ceiling))
            v.offer(cache)
        elif limit == "rate":
            v.offer(cache)
            v.recommendations.append(v.fix(
                f"do not add DataLoader workers: the store limits the rate at about "
                f"{_num(v.probe, 'iops_ceiling'):.0f} requests/s",
                "the probe found more requests in flight are not served faster", "none",
                {"num_workers": more}, pm.more_workers(more), basis=[f"{more} workers"]))
        else:
            v.offer(cache)
            v.recommendations.append(_probe_rec(
                v, "whether the store answers slowly (then more workers help) "
                "or limits the requests it serves (then only a cache does) decides the fix"))
            v.offer(_if_slow_store(
                v, workers, more, ceiling, "each worker waits on the store's latency one "
                "sample at a time", unless="limiting how many it serves",
                basis="if the store's latency, not a rate limit, sets the pace (the probe "
                "tells)"))
        if (pipe.files_per_sample or 0.0) >= 0.5:
            v.recommendations.append(Recommendation(
                "store fewer, larger objects: tar shards (WebDataset) read sequentially, one "
                "request per shard instead of one per sample",
                f"each sample costs {pipe.files_per_sample or 0.0:.1f} file opens on the "
                f"store, {(pipe.bytes_per_sample or 0.0) / 1024:.0f} KiB each", ceiling,
                None, "the store's cost per request of a large object is not measured",
                {"pack": True}))
    else:
        cache.action = ("lift the I/O limit (cgroup io.max / blkio throttle), or copy the "
                        "dataset to faster local storage or RAM first")
        cache.because = "the reads wait though the device is not saturated: the limit is above it"
        v.offer(cache)


def _peer_figures(win: Sequence[dict[str, Any]], key: str) -> list[tuple[dict[str, Any], float]]:
    return [(d, _secs(r)) for r in win
            if isinstance(d := (r.get("storage") or {}).get(key), dict)]


def net_scaling(figs: Sequence[tuple[dict[str, Any], float]]) -> str | None:
    """Whether a network store gives more bytes a second to more connections at once:
    ``latency`` (it does: each request waits on the store's answer), ``capped`` (it does
    not: the store, or the link, caps the throughput), or None when the run's intervals
    do not tell (fewer than two levels of connections, each seen in
    rules.NET_SCALING_INTERVALS intervals or more)."""
    by: dict[int, list[float]] = {}
    for d, _ in figs:
        n = int(_num(d, "connections"))
        if n >= 1:
            by.setdefault(n, []).append(_num(d, "rx_bytes_s"))
    levels = sorted(n for n, xs in by.items() if len(xs) >= rules.NET_SCALING_INTERVALS)
    if len(levels) < 2:
        return None
    lo, hi = levels[0], levels[-1]
    rx_lo, rx_hi = statistics.mean(by[lo]), statistics.mean(by[hi])
    if rx_lo <= 0:
        return None
    more = hi / lo - 1  # (the share more connections: 1 = twice as many)
    gain = rx_hi / rx_lo - 1
    if gain <= rules.NET_CAPPED_GAIN * more:
        return "capped"
    if gain >= rules.NET_LATENCY_GAIN * more:
        return "latency"
    return None


def _network_store(v: Verdict, pipe: Pipeline, win: Sequence[dict[str, Any]],
                   where: dict[str, Any], load: DeviceLoad | None, *, share: float,
                   when: str, ceiling: str, workers: int) -> None:
    """storage-bound on a store the job reads over the network (NOTE [network storage]
    in iolens/recorder/network.py). A store whose own disk is saturated (a server on this
    machine), or whose bytes a second do not grow with the connections open, caps the
    throughput: more workers only add requests to its queue. One that gives more to more
    connections answers slowly: more requests in flight help."""
    v.cls = "storage-bound"
    name = str(where.get("mount"))
    figs = _peer_figures(win, str(where.get("peer") or ""))
    secs = sum(s for _, s in figs) or 1.0
    rx = sum(_num(d, "rx_bytes_s") * s for d, s in figs) / secs
    conns = sum(_num(d, "connections") * s for d, s in figs) / secs
    new = sum(_num(d, "new_connections_s") * s for d, s in figs) / secs
    server = (f", served by {where.get('server') or 'a process'} (pid {where['server_pid']}) "
              "on this machine" if where.get("server_pid") else "")
    v.evidence.append(f"the fetch blocks off CPU while it reads the dataset over the network "
                      f"from {name}{server}: {rx / 2**20:.1f} MB/s received on {conns:.1f} "
                      f"connections open on average, {new:.1f} new a second{when}")
    scaling = net_scaling(figs)
    why: str | None = None
    if load is not None:
        v.devices = [load.name]
        word = "saturated" if load.util >= rules.UTIL_SATURATED else "slow"
        v.evidence.append(f"the store reads the data from {load.name}, {word}: {load.util:.0f}% "
                          f"util, r_await {load.r_await:.1f} ms, {load.rMB_s:.1f} MB/s")
        why = f"the store's disk {load.name} is {word}"
    elif scaling == "capped":
        why = ("the store gave no more bytes a second to more connections at once: it caps "
               "the throughput")
    elif scaling == "latency":
        v.evidence.append("the store gave more bytes a second to more connections at once: "
                          "it answers slowly rather than capping the throughput")
    v.evidence.append(fetch_text(pipe))
    v.evidence.append(f"the loop waited {share * 100:.1f}% of its step time for data")
    cache = v.fix(
        "copy the dataset near the job before training (local NVMe or /dev/shm), or read "
        "it through a cache on this machine",
        f"every epoch fetches it again from {name}", ceiling, {"storage": "ram"},
        pm.cached(), basis=["if the dataset fits the local copy: no request reaches the store"])
    target = v.model.workers_to_next_limit() if v.model is not None else None
    more = target or (max(2 * workers, workers + 2) if workers else 4)
    if why is not None:
        v.evidence.append(why + ": more requests in flight are not served faster")
        _store_limited(v, _samples_per_s(v))
        v.offer(cache)
        v.recommendations.append(v.fix(
            f"do not add DataLoader workers: {why}", "more requests in flight are not "
            "served faster", "none", {"num_workers": more}, pm.more_workers(more),
            basis=[f"{more} workers"]))
    elif scaling == "latency":
        v.offer(_raise_workers(v, workers, more, "the store answers slowly: more requests in "
                               "flight are served about as fast each", ceiling))
        v.offer(cache)
    else:
        v.offer(cache)
        v.offer(_if_slow_store(
            v, workers, more, ceiling, "each worker waits on the store one request at a time",
            unless="capping its throughput", basis="if the store's latency, not a cap on its "
            "throughput, sets the pace (not told by this run)"))


def _if_slow_store(v: Verdict, workers: int, more: int, ceiling: str, because: str, *,
                   unless: str, basis: str) -> Recommendation:
    """More workers, on the condition the run cannot settle: that the store answers each
    request slowly rather than ``unless`` (a rate limit, a cap on its throughput)."""
    rec = _raise_workers(v, workers, more, because, ceiling)
    rec.action = (f"if the store answers each request slowly rather than {unless}, keep more "
                  "requests in flight: " + rec.action)
    if rec.prediction is not None:
        rec.prediction.basis.insert(0, basis)
    return rec


def _fuse_waiting(win: Sequence[dict[str, Any]], mount: str) -> float | None:
    vals = [(_num(d, "waiting"), _secs(r)) for r in win
            if isinstance(d := (r.get("storage") or {}).get(mount), dict)
            and d.get("waiting") is not None]
    secs = sum(s for _, s in vals)
    return sum(v * s for v, s in vals) / secs if secs else None


def _nothing_to_gain(v: Verdict) -> None:
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
    v.recommendations = [r for r in v.recommendations if r.action != _tune(v).action]
    short = best.action.split(":")[0].split(", so that")[0]
    v.recommendations.insert(0, Recommendation(
        f"leave the input pipeline as it is: no change iolens can size gains "
        f"{(rules.MIN_GAIN - 1) * 100:.0f}% or more (the best, {short}, is predicted at "
        f"{p.steps_per_s:.3g} steps/s against {p.now:.3g} now, {(p.gain - 1) * 100:+.1f}%)",
        f"the loop waits {(v.data_wait_share or 0.0) * 100:.1f}% of its step time and each "
        "change the model sizes leaves most of it", "none from the input side", None,
        "nothing to change: the figure is the best candidate's"))


def _epoch_starts_first(v: Verdict, timed: Sequence[dict[str, Any]]) -> None:
    """Workers started anew each epoch (not persistent), whose epoch starts after the run's
    first are a large part of the data wait: keeping the workers comes first, with its
    prediction, whatever the steady batches wait for."""
    f = v.model.whole if v.model is not None else None
    if f is None or not f.workers or v.already("persistent_workers", True):
        return
    batches = sum(_num(_train(r), "batches") for r in timed)
    wait = sum(_sum(r, "data_wait") for r in timed)
    steps = sum(_sum(r, "step") for r in timed)
    # (the start is in the first batch's wait, or in its step where iter() waits for the
    # workers: both are the epoch start's, NOTE [epoch starts in the model])
    later = (f.epoch_start_s - f.first_start_s) * batches
    if steps <= 0 or later <= 0 or (later < rules.EPOCH_START_LEAD * wait
                                    and later < rules.MODERATE * steps):
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
                      f"beyond a steady step, {later / steps * 100:.0f}% of the step time")


def _handover_bound(v: Verdict, pipe: Pipeline, win: Sequence[dict[str, Any]], *,
                    share: float, when: str, workers: int) -> None:
    """The workers keep up: the wait left is the hand-over of each batch or the epochs'
    starts, which more workers do not shorten."""
    v.cls = "handover-bound"
    batches = sum(_num(_train(r), "batches") for r in win)
    wait = sum(_sum(r, "data_wait") for r in win)
    hand = pipe.handover_s_per_batch
    starts = [_train(r).get("epoch_start_wait") for r in win]
    start_s = sum(_num(x, "sum_s") for x in starts if isinstance(x, dict))
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
    types = {t for d in v.loaders for t in str(d.get("batch_types") or "").split(",") if t}
    if types == {"torch.Tensor"}:
        action = ("make each batch cheaper to hand over: keep it small in bytes (decode on "
                  "the GPU, or uint8 rather than float32); its tensors go through shared "
                  "memory already")
    else:
        held = f" (the batches hold {', '.join(sorted(types))})" if types else ""
        action = ("make each batch cheaper to hand over: return tensors (moved through shared "
                  "memory) rather than Python lists or NumPy arrays (pickled whole)" + held
                  + ", and keep the batch small in bytes (decode on the GPU, or uint8 rather "
                  "than float32)")
    v.offer(v.fix(
        action,
        "the wait left is the batch's way from the worker to the loop",
        "the hand-over's share of the wait", {"handover": 0.5}, pm.cheaper_handover(0.5),
        basis=["if the hand-over took half as long"]))


def _tune(v: Verdict) -> Recommendation:
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


def _more_workers(workers: int, worker_cpu: float, cpus: int, idle: float | None) -> int:
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


def _span(recs: Sequence[dict[str, Any]]) -> float:
    return sum(_secs(r) for r in recs)


def _busiest_read(recs: Sequence[dict[str, Any]]) -> list[str]:
    loads = [device_load(recs, n) for n in _device_names(recs)]
    loads = [x for x in loads if x.rkB_s > 0]
    return [max(loads, key=lambda x: x.rkB_s).name] if loads else []


def _write_episodes(records: Sequence[dict[str, Any]], name: str) -> list[list[int]]:
    """Runs of consecutive intervals in which ``name`` is saturated by writes."""
    episodes: list[list[int]] = []
    current: list[int] = []
    for i, r in enumerate(records):
        d = (r.get("devices") or {}).get(name)
        # A bucket of a long run (iolens.analysis.longrun) is saturated if any of its
        # intervals was: a checkpoint's seconds would vanish in the bucket's mean.
        util = "util_max" if isinstance(d, dict) and "util_max" in d else "util"
        hit = (isinstance(d, dict) and _num(d, util) >= rules.UTIL_SATURATED
               and _num(d, "wkB_s") > 0 and _num(d, "wkB_s") >= _num(d, "rkB_s"))
        if hit:
            current.append(i)
        elif current:
            episodes.append(current)
            current = []
    if current:
        episodes.append(current)
    return episodes


def _write_stall(records: Sequence[dict[str, Any]], timed: Sequence[dict[str, Any]],
                 share: float
                 ) -> tuple[str, list[str], list[str], list[Recommendation], list[Window]] | None:
    """Steps slowed while the job's own writes saturate a device.

    A checkpoint is written in two phases: write() dirties the page cache (the
    job's write_bytes count then), and the device writes later, at fsync() or
    writeback. So the job's writes are looked for up to WRITE_LOOKBACK_S
    before each episode of write saturation, and the stalled steps are those
    that end in the episode or in the first timed interval after it (a step
    blocked in fsync is handed over only when the write is done).
    """
    p50s = [_num(_train(r).get("step") or {}, "p50_s") for r in timed]
    step_total = sum(_sum(r, "step") for r in timed)
    if not p50s or step_total <= 0:
        return None
    typical = statistics.median(p50s)
    best: tuple[float, str, list[dict[str, Any]], list[dict[str, Any]]] | None = None
    ends = [_end(r) for r in records]
    for name in _device_names(records):
        excess = 0.0
        saturated: list[dict[str, Any]] = []
        stalled: list[dict[str, Any]] = []
        for ep in _write_episodes(records, name):
            ep_recs = [records[i] for i in ep]
            start = _end(ep_recs[0]) - _secs(ep_recs[0])
            dev_w = sum(_num((r.get("devices") or {}).get(name) or {}, "wkB_s") * 1024 * _secs(r)
                        for r in ep_recs)
            window = records[bisect.bisect_right(ends, start - rules.WRITE_LOOKBACK_S):
                             ep[-1] + 1]
            _, job_w = _job_bytes(window)
            if dev_w <= 0 or job_w / dev_w < rules.JOB_SHARE_OWN:
                continue
            hit = [r for r in ep_recs if _timed(r)]
            after = next((r for r in records[ep[-1] + 1:] if _timed(r)), None)
            if after is not None:
                hit.append(after)
            excess += sum(max(0.0, _sum(r, "step") - typical * _num(_train(r), "batches"))
                          for r in hit)
            saturated += ep_recs
            stalled += hit
        if saturated and (best is None or excess > best[0]):
            best = (excess, name, saturated, stalled)
    if best is None:
        return None
    excess, name, saturated, stalled = best
    stall_share = excess / step_total
    if stall_share < rules.STALL_SHARE or stall_share <= share:
        return None
    load = device_load(saturated, name)
    first = _end(saturated[0]) - _secs(saturated[0])
    _, job_w = _job_bytes([r for r in records if _end(r) > first - rules.WRITE_LOOKBACK_S])
    _, main_w = _job_bytes([r for r in records if _end(r) > first - rules.WRITE_LOOKBACK_S],
                           "main")
    w = Window(first, max(_end(r) for r in saturated + stalled), "write-stall")
    who = "the training process" if main_w >= 0.5 * job_w else "the job"
    evidence = [
        f"{name} {load.util:.0f}% util writing {load.wMB_s:.1f} MB/s (w_await "
        f"{load.w_await:.1f} ms) in {len(saturated)} intervals, the writes by {who}, "
        f"{w.text()}",
        f"steps that waited for those writes took {excess:.1f} s more than the typical "
        f"{typical * 1000:.1f} ms step, {stall_share * 100:.0f}% of the step time",
    ]
    batches = sum(_num(_train(r), "batches") for r in timed)
    now = batches / step_total
    free = batches / max(step_total - excess, 1e-9)
    u = pm.MODEL_ERROR  # (the model's error on the lab cases; the stalls' spread untold)
    recs = [
        Recommendation(
            "write checkpoints asynchronously (a background thread or torch.distributed."
            "checkpoint.async_save) or less often",
            f"the loop stalls while {name} absorbs the job's writes",
            f"up to {1 / (1 - min(stall_share, 0.99)):.2f}x more steps per second without the "
            "stalls",
            Prediction(free, free * (1 - u), free * (1 + u), "compute", [
                f"the steps without their {excess:.1f} s of stalls beyond a typical step",
                f"interval: the model's error of {u * 100:.0f}% on the lab cases"],
                now), change={"checkpoint": "async"}),
        Recommendation(
            "write checkpoints to faster or local storage and copy them off later",
            f"{name} writes at {load.wMB_s:.1f} MB/s", "shorter stalls", None,
            "how fast the other storage writes is not measured", {"checkpoint": "elsewhere"}),
    ]
    return "write-stall", [name], evidence, recs, [w]


# -- secondary findings ----------------------------------------------------------------


def rank_figures(records: Sequence[dict[str, Any]], host: str | None = None
                 ) -> list[dict[str, Any]]:
    """Per rank over the run: batches, data wait and step seconds, share (multi-rank jobs)."""
    acc: dict[str, list[float]] = {}
    for r in records:
        for rank, d in (_train(r).get("ranks") or {}).items():
            a = acc.setdefault(str(rank), [0.0, 0.0, 0.0])
            a[0] += _num(d, "batches")
            a[1] += _num(d, "data_wait_s")
            a[2] += _num(d, "step_s")
    out = []
    for rank, (n, wait, step) in sorted(acc.items(), key=lambda kv: _rank_key(kv[0])):
        out.append({"rank": rank, "host": host, "batches": int(n), "data_wait_s": round(wait, 6),
                    "step_s": round(step, 6),
                    "data_wait_share": round(wait / step, 4) if step > 0 else None,
                    "step_mean_s": round(step / n, 6) if n else None})
    return out


def _rank_key(rank: str) -> tuple[int, str]:
    return (int(rank), "") if rank.isdigit() else (1 << 30, rank)


def straggler(ranks: Sequence[dict[str, Any]]) -> Finding | None:
    """The rank (on its host) whose data wait holds the others back, if one does."""
    usable = [r for r in ranks if r.get("data_wait_share") is not None
              and int(r.get("batches") or 0) >= rules.STRAGGLER_MIN_BATCHES]
    if len(usable) < 2:
        return None
    slow = max(usable, key=lambda r: float(r["data_wait_share"]))
    others = [float(r["data_wait_share"]) for r in usable if r is not slow]
    base = statistics.median(others)
    share = float(slow["data_wait_share"])
    if (share < rules.MODERATE or share - base < rules.STRAGGLER_GAP
            or share < rules.STRAGGLER_RATIO * base):
        return None
    where = f"rank {slow['rank']}" + (f" on {slow['host']}" if slow.get("host") else "")
    gap = share - base
    return Finding("straggler", [
        f"{where} waited {share * 100:.0f}% of its step time for data, the other "
        f"{len(others)} rank(s) {base * 100:.0f}% (median): in synchronous data-parallel "
        "training the slowest input pipeline sets every rank's pace"], None, [
        Recommendation(
            f"look at {where}'s input: its storage (a slower, remote or busier disk), its "
            "page cache, its DataLoader workers and CPU",
            f"it waits {gap * 100:.0f} points more than the others",
            f"up to {1 / (1 - min(gap, 0.99)):.2f}x more steps per second for every rank if "
            "it waited no more than they do")],
        {k: slow[k] for k in ("rank", "host", "run") if k in slow})


def _hang(records: Sequence[dict[str, Any]]) -> Finding | None:
    """The run ended while the loop waited for a batch (NOTE [no batch for a while] in
    iolens/recorder/sampler.py): a hang, with where each process of the loader waits."""
    last = _train(records[-1]) if records else {}
    since = _num(last, "waiting_s")
    if since <= 0:
        return None
    # Where they waited: each process as most intervals of the hang saw it (a tie goes to
    # the earlier). The last intervals may come as the job is stopped (a worker running
    # its signal handler, a main process gone), so no single one speaks for the hang.
    hung: list[dict[str, Any]] = []
    for r in reversed(records[-rules.HANG_LOOKBACK:]):
        if _num(_train(r), "waiting_s") <= 0:
            break
        hung.insert(0, _train(r))
    seen: dict[tuple[bool, int, str], Counter[str]] = {}
    for t in hung:
        for p in t.get("waiting") or []:
            if not isinstance(p, dict):
                continue
            at = ", ".join(x for x in (f"in {p['syscall']}" if p.get("syscall") else "",
                                       f"at {p['wchan']}" if p.get("wchan") else "") if x)
            who = (p.get("role") != "main", int(p.get("pid") or 0), str(p.get("role")))
            seen.setdefault(who, Counter())[f"{p.get('state')}" + (f", {at}" if at else "")] += 1
    where = [f"{who[2]} {who[1]} ({seen[who].most_common(1)[0][0]})" for who in sorted(seen)]
    return Finding("hang", [
        f"no batch came in the last {since:.0f} s recorded: the loop was waiting in next() "
        "for one"
        + (f"; {', '.join(where)}" if where else "")], _window(records[-1:], "hang"), [
        Recommendation(
            "see where the workers wait (py-spy dump --pid PID, or faulthandler), and set "
            "DataLoader(timeout=SECONDS) so that a stuck batch raises instead of hanging; "
            "a spawned worker needs the script's `if __name__ == '__main__':` guard",
            f"the loop waited {since:.0f} s for one batch", "a job that fails fast")])


def _findings(records: Sequence[dict[str, Any]], timed: Sequence[dict[str, Any]],
              v: Verdict) -> list[Finding]:
    out: list[Finding] = []
    hang = _hang(records)
    if hang is not None:
        out.append(hang)
    slow = straggler(rank_figures(records))
    if slow is not None:
        out.append(slow)
    out += _noisy_neighbors(timed)
    out += _warm_cache(timed, v)
    out += _cold_start(timed)
    out += _epoch_start(timed, v)
    return out


def _noisy_neighbors(timed: Sequence[dict[str, Any]]) -> list[Finding]:
    out = []
    names = _device_names(timed)
    loops = [n for n in names if n.startswith("loop")]
    span = _span(timed)
    for name in names:
        hit = []
        for r in timed:
            d = (r.get("devices") or {}).get(name) or {}
            if _num(d, "util") < rules.NEIGHBOR_UTIL:
                continue
            dev_bytes = (_num(d, "rkB_s") + _num(d, "wkB_s")) * 1024 * _secs(r)
            if dev_bytes <= 0:
                continue
            # A loop device's reads reach its backing disk from the kernel's loop
            # thread, not from the job: that load is the job's, seen one level down.
            looped = sum((_num((r.get("devices") or {}).get(lp) or {}, "rkB_s")
                          + _num((r.get("devices") or {}).get(lp) or {}, "wkB_s")) * 1024
                         * _secs(r) for lp in loops if lp != name)
            jr, jw = _job_bytes([r])
            if (jr + jw + looped + _helper_bytes([r])) / dev_bytes < rules.JOB_SHARE_OWN:
                hit.append(r)
        if hit and _span(hit) >= rules.NEIGHBOR_SHARE_OF_TIME * span:
            load = device_load(hit, name)
            jr, jw = _job_bytes(hit)
            dev_bytes = (load.rkB_s + load.wkB_s) * 1024 * load.secs
            own = (jr + jw) / dev_bytes if dev_bytes else 0.0
            # A helper's reads (a local server's, a FUSE daemon's) reach its counters an
            # interval early or late: the intervals where they look low are picked by
            # that. Over all the busy intervals they must leave room for a neighbour.
            busy = [r for r in timed
                    if _num((r.get("devices") or {}).get(name) or {}, "util")
                    >= rules.NEIGHBOR_UTIL]
            helped = _helper_bytes(busy)
            if helped:
                b = device_load(busy, name)
                all_bytes = (b.rkB_s + b.wkB_s) * 1024 * b.secs
                if all_bytes and (sum(_job_bytes(busy)) + helped) / all_bytes >= (
                        rules.JOB_SHARE_OWN):
                    continue
            w = _window(hit, "noisy-neighbor")
            out.append(Finding("noisy-neighbor", [
                f"{name} {load.util:.0f}% util, {load.rMB_s:.1f} MB/s read and "
                f"{load.wMB_s:.1f} MB/s written, only {own * 100:.0f}% of it by this job"
                + (f", {w.text()}" if w else "")], w, [Recommendation(
                    "find the other reader (iotop, or `iolens top`) and move it or the "
                    "dataset to another device",
                    f"another process makes {100 - own * 100:.0f}% of {name}'s load",
                    "steadier step times")]))
    return out


def _warm_cache(timed: Sequence[dict[str, Any]], v: Verdict) -> list[Finding]:
    if v.storage and not v.storage[0].get("page_cache_visible", True):
        # Their reads never reach read_bytes: 1 - read_bytes/rchar would claim a cache
        # hit for every byte (NOTE [dataset folders] in iolens/recorder/storage.py).
        return []
    role = "worker" if any(((r.get("job") or {}).get("roles") or {}).get("worker")
                           for r in timed) else "main"
    rchar = disk = secs = 0.0
    for r in timed:
        src = ((r.get("job") or {}).get("roles") or {}).get(role) or {}
        s = _secs(r)
        secs += s
        rchar += _num(src, "rchar_s") * s
        disk += _num(src, "read_bytes_s") * s
    if secs <= 0 or rchar / secs < rules.WARM_CACHE_MIN_RCHAR:
        return []
    hit = max(0.0, 1 - disk / rchar)
    if hit < rules.WARM_CACHE_HIT:
        return []
    caveat = (" The storage verdict may differ on a cold cache (a first epoch after a "
              "reboot, a dataset larger than RAM).")
    return [Finding("warm-cache", [
        f"{hit * 100:.0f}% of what the {role} processes read came from the page cache "
        f"({rchar / secs / 2**20:.1f} MB/s read, {disk / secs / 2**20:.1f} MB/s from disk)."
        + (caveat if v.cls != "storage-bound" else "")], _window(timed, "warm-cache"))]


def _cold_start(timed: Sequence[dict[str, Any]]) -> list[Finding]:
    span = _span(timed)
    if len(timed) < 5 or span <= 0:
        return []
    first: list[dict[str, Any]] = []
    acc = 0.0
    for r in timed:
        if acc >= rules.COLD_START_SHARE_OF_TIME * span:
            break
        first.append(r)
        acc += _secs(r)
    rest = list(timed[len(first):])
    a, b = _share(first), _share(rest)
    if a is None or b is None or a < rules.HIGH or a < rules.COLD_START_RATIO * b:
        return []
    w = _window(first, "cold-start")
    return [Finding("cold-start", [
        f"the loop waited {a * 100:.0f}% of its step time for data in its first "
        f"{_span(first):.0f} s" + (f" ({w.text()})" if w else "")
        + f", then {b * 100:.0f}%: the cache filled or the workers warmed up"], w, [
        Recommendation("judge throughput after the start-up, or warm the cache first "
                       "(read the dataset once, vmtouch)",
                       "the start-up waits far more than the rest",
                       "a steady measurement")])]


def _epoch_start(timed: Sequence[dict[str, Any]], v: Verdict) -> list[Finding]:
    starts = [_train(r).get("epoch_start_wait") for r in timed]
    starts_n = sum(_num(s, "count") for s in starts if isinstance(s, dict))
    starts_sum = sum(_num(s, "sum_s") for s in starts if isinstance(s, dict))
    waits = [_num(_train(r).get("data_wait") or {}, "p50_s") for r in timed]
    step_total = sum(_sum(r, "step") for r in timed)
    if not starts_n or not waits or step_total <= 0:
        return []
    mean_start = starts_sum / starts_n
    median_wait = statistics.median(waits)
    if (mean_start < rules.EPOCH_START_RATIO * max(median_wait, 1e-6)
            or starts_sum / step_total < rules.EPOCH_START_SHARE):
        return []
    cache = next((x for x in v.storage if x.get("role") == "cache"), None)
    if starts_n < 2 and cache is None:
        return []  # (the run's one start: no epoch repeats it; cold-start tells its wait)
    evidence = [
        f"the first batch of each epoch waited {mean_start * 1000:.0f} ms on average over "
        f"{plural(starts_n, 'epoch')}, against a median wait of "
        f"{median_wait * 1000:.1f} ms; {starts_sum / step_total * 100:.1f}% of the step "
        "time in all"]
    if cache is not None:
        # A streaming library copies the data into a cache it then reads: the first
        # batches wait for the copy (NOTE [storage roles] in iolens/recorder/storage.py).
        source = next((x for x in v.storage if x.get("role") == "source"), None)
        copied = sum(_num(((r.get("job") or {}).get("roles") or {}).get(role), "wchar_s")
                     * _secs(r) for r in timed for role in ("worker", "main"))
        secs = _span(timed) or 1.0
        evidence.append(
            f"the job copies the data into a cache on {cache['mount']}"
            + (f" from {source['mount']}" if source else "")
            + f": {copied / 2**20:.0f} MB written at {copied / secs / 2**20:.1f} MB/s, which "
            "the first batches wait for")
        return [Finding("epoch-start-stall", evidence, None, [Recommendation(
            "fill the cache before training (copy or prefetch the data into "
            f"{cache['mount']} first), or read it near the job from the start",
            "the first batches wait for the copy into the cache",
            f"up to {starts_sum / step_total * 100:.1f}% of the step time", None,
            "what the copy costs the first batches is not timed apart")])]
    if v.already("persistent_workers", True):
        # The workers persist: what the first batch waits for is their first work (a
        # cache the library fills, files and connections opened at the first sample).
        evidence.append("the workers persist (persistent_workers=True): the wait is their "
                        "first work, not their start")
        return [Finding("epoch-start-stall", evidence, None, [Recommendation(
                "make the first batch cheap: open the dataset's files and connections when "
                "the Dataset is made, and fill a streaming library's local cache before "
                "training (or copy the data near the job)",
                "the workers persist, yet each epoch's first batch waits",
                f"up to {starts_sum / step_total * 100:.1f}% of the step time", None,
                "what the first batch does is not timed apart")])]
    return [Finding("epoch-start-stall", evidence, None, [
        v.fix("set persistent_workers=True (workers and their state survive the "
              "epoch) and keep prefetch_factor at 2 or more",
              "workers start anew each epoch",
              f"up to {starts_sum / step_total * 100:.1f}% of the step time",
              {"persistent_workers": True}, pm.no_epoch_starts(),
              basis=["without the epochs' first batches' wait"])])]


_BLIND = ("the verdict rests on the training loop's timing (data wait share, step time) and "
          "the job's processes alone")


def _no_disk_stats(records: Sequence[dict[str, Any]], meta: dict[str, Any]) -> Finding | None:
    """The ``no-disk-stats`` finding when device figures are missing for the whole run or
    stopped partway (the recorder's note says why), else None."""
    notes = [n for n in meta.get("notes") or [] if isinstance(n, str)]
    seen = [i for i, r in enumerate(records) if r.get("devices")]
    if seen:
        stopped = next((n for n in notes if n.startswith("device statistics stopped")), None)
        last = seen[-1]
        if stopped is None or last == len(records) - 1:
            return None
        at = _end(records[last])
        w = Window(at, _end(records[-1]), "no-disk-stats")
        return Finding("no-disk-stats", [
            f"{stopped} (at {clock(at)}); from then on {_BLIND}"], w)
    why = next((n for n in notes if "statistic" in n), None)
    if why is not None:
        why = why.removesuffix(": no device statistics on this system")
    elif records and meta.get("disk_source") is not None:
        why = "no watched device had figures (none serves the job's files?)"
    return Finding("no-disk-stats", [
        f"no device statistics: {why or 'none were recorded'}; {_BLIND}"])
