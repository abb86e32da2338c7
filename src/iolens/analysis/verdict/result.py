"""What a verdict is: its classes, its parts (windows, recommendations, findings)
and the lines ``iolens run`` prints.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from iolens.analysis import model as pm
from iolens.analysis import rules
from iolens.analysis.model import Model, Prediction

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

def try_label(rec: dict[str, Any]) -> str:
    """How a recommendation's ``try`` command is introduced. The command of an advice not
    to do something (``do not add DataLoader workers``) makes that change, to check the
    prediction that it gains nothing: it says so."""
    if str(rec.get("action") or "").startswith("do not "):
        return "to check it (the change it advises against), with no code change"
    return "with no code change"

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
    pace: float | None = field(default=None, repr=False, compare=False)
    """This machine's time for Python's own work over the lab's (meta.json's ``pace_s``
    over rules.PACE_LAB_S, within rules.PACE_BOUNDS; NOTE [the machine's pace] in
    iolens/recorder/pace.py): the lab's milliseconds are scaled by it. None where the run
    did not measure it (the lab's figures as they are)."""

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
                "compute_ms": round(m.whole.compute_s * 1000, 3),
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
            out.append(f"  {try_label(r)}: {r['try']}")
    if v.get("caveat"):
        out.append(f"note: {v['caveat']}")
    return out
