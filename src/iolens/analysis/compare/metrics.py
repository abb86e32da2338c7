"""What a compared metric is (:class:`MetricSpec`, the training metrics in
:data:`TRAINING_METRICS`) and one metric's result over both runs (:class:`MetricResult`):
it decides how a change and its interval read, which way is better, how much worse NEW
is, and the statement and JSON object of the metric."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from iolens.analysis.compare.blocks import CONFIDENCE


@dataclass
class MetricSpec:
    """What a metric is: its id (stable, as in JSON and --fail-on), label, unit, statistic."""

    id: str
    label: str
    unit: str
    statistic: str
    better: str | None
    """``higher`` or ``lower`` (which way is an improvement), None for load figures."""
    up: str
    down: str
    """Words for a higher and a lower NEW."""
    points: bool = False
    """Compared as NEW - BASE in percentage points, not as a ratio."""
    device: str | None = None


@dataclass
class MetricResult:
    """One metric of both runs and whether their difference is real."""

    spec: MetricSpec
    source: str
    base: float | None
    new: float | None
    samples: tuple[int, int]
    change: float | None = None
    """Percent (NEW/BASE - 1) x 100, or percentage points for a share."""
    ci_low: float | None = None
    ci_high: float | None = None
    real: bool | None = None
    """None: cannot tell (too few samples, or a figure missing)."""
    why_unknown: str | None = None

    @property
    def direction(self) -> str | None:
        """``higher`` or ``lower`` when the difference is real, else None."""
        if not self.real or self.change is None:
            return None
        return "higher" if self.change > 0 else "lower"

    @property
    def outcome(self) -> str:
        """``better``, ``worse``, ``changed`` (a real change with no better direction),
        ``within-noise`` or ``unknown``."""
        if self.real is None:
            return "unknown"
        if not self.real:
            return "within-noise"
        if self.spec.better is None:
            return "changed"
        return "better" if self.direction == self.spec.better else "worse"

    @property
    def regression(self) -> float | None:
        """How much worse NEW is (percent, or points for a share); negative when better."""
        if self.change is None or self.spec.better is None:
            return None
        return self.change if self.spec.better == "lower" else -self.change

    def statement(self) -> str:
        """"NEW is slower by X% (95% CI a% to b%): real", or "within noise", or why unknown."""
        if self.change is None:
            return f"cannot tell: {self.why_unknown or 'missing in a run'}"
        unit = " points" if self.spec.points else "%"
        word = self.spec.up if self.change > 0 else self.spec.down
        # one decimal, two where the interval is narrower than a unit
        nd = 2 if (self.ci_low is not None and self.ci_high is not None
                   and self.ci_high - self.ci_low < 1) else 1
        if self.ci_low is None or self.ci_high is None:
            if self.change == 0:
                return f"no change; cannot tell: {self.why_unknown or 'the noise is unknown'}"
            return (f"NEW is {word} by {abs(self.change):.{nd}f}{unit}; cannot tell: "
                    f"{self.why_unknown or 'the noise is unknown'}")
        ci = (f"{CONFIDENCE * 100:.0f}% CI {self.ci_low:+.{nd}f}{unit} to "
              f"{self.ci_high:+.{nd}f}{unit}")
        if self.real:
            return f"NEW is {word} by {abs(self.change):.{nd}f}{unit} ({ci}): real"
        if self.change == 0:
            return f"no change ({ci}): within noise"
        return f"NEW is {word} by {abs(self.change):.{nd}f}{unit} ({ci}): within noise"

    def to_dict(self) -> dict[str, Any]:
        s = self.spec
        return {
            "id": s.id, "label": s.label, "device": s.device, "unit": s.unit,
            "statistic": s.statistic, "source": self.source,
            "base": _round(self.base), "new": _round(self.new),
            "samples": {"base": self.samples[0], "new": self.samples[1]},
            "change": _round(self.change, 3), "change_unit": "points" if s.points else "%",
            "ci_low": _round(self.ci_low, 3), "ci_high": _round(self.ci_high, 3),
            "real": self.real, "better": s.better, "direction": self.direction,
            "outcome": self.outcome, "statement": self.statement(),
        }


def _round(v: float | None, nd: int = 6) -> float | None:
    if v is None or not math.isfinite(v):
        return None
    return round(v, nd)


TRAINING_METRICS: dict[str, MetricSpec] = {
    "throughput": MetricSpec("throughput", "throughput", "steps/s", "mean", "higher",
                             "higher", "lower"),
    "step-time": MetricSpec("step-time", "step time", "s", "median", "lower",
                            "slower", "faster"),
    "data-wait": MetricSpec("data-wait", "data wait", "s", "mean", "lower",
                            "longer", "shorter"),
    "data-wait-share": MetricSpec("data-wait-share", "data-wait share", "%", "share", "lower",
                                  "higher", "lower", points=True),
}
