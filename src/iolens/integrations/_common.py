"""What the Lightning and Hugging Face callbacks share: the monitor, the loop timer, the figures.

Nothing here imports a framework. NOTE [never hurt the job] (see
training/_hooks.py): monitoring that fails to start or to stop is said
once, and training goes on; the per-step hooks only read the clock.
"""

from __future__ import annotations

import logging
import os
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from iolens.api import Monitor
from iolens.training import _hooks

log = logging.getLogger("iolens.integrations")
"""Where the callbacks log the verdict lines (INFO) and their own troubles (WARNING)."""

SEVERITY_LEVELS = {"none": 0, "moderate": 1, "high": 2}
"""The verdict's severity as a number, for loggers that take numbers only."""


@dataclass
class Outcome:
    """What a callback logs when training ends."""

    metrics: dict[str, float] = field(default_factory=dict)
    """Numeric figures: ``iolens/data_wait_share``, ``iolens/severity_level`` (0 none,
    1 moderate, 2 high), ``iolens/steps_per_s``, ``iolens/batches``."""
    text: dict[str, str] = field(default_factory=dict)
    """``iolens/verdict`` (the class), ``iolens/severity`` and ``iolens/run_dir``."""
    lines: list[str] = field(default_factory=list)
    """The verdict in three lines, as ``iolens run`` prints it."""
    verdict: dict[str, Any] | None = None
    """The whole verdict (``Verdict.to_dict()``), when a recording gave one."""


def num_workers(loader: Any) -> int:
    """A loader's ``num_workers``, 0 when it has none."""
    try:
        return max(0, int(getattr(loader, "num_workers", 0) or 0))
    except (TypeError, ValueError):
        return 0


class Session:
    """One training run seen by a callback: its monitor, its loop timer and its figures."""

    def __init__(self, out: str | os.PathLike[str] | None, interval: float,
                 paths: Sequence[str | os.PathLike[str]], devices: Sequence[str], *,
                 quiet: bool, hooks: str, mlflow: bool = False, wandb: bool = False) -> None:
        Monitor(out, interval, paths, devices, quiet=quiet)  # a bad interval fails here, early
        self.mlflow = mlflow
        self.wandb = wandb
        self._args = (out, interval, tuple(paths), tuple(devices))
        self.quiet = quiet
        self.hooks = hooks
        """The hooks that time the loop, in words (for the line without a recording)."""
        self.timer = _hooks.LoopTimer()
        self.monitor: Monitor | None = None
        self.run_dir: str | None = None
        self.outer = False
        """Whether another recording (``iolens run``, ``iolens.monitor()``) holds this process."""
        self._mark = (0, 0, 0)

    def start(self, main: bool) -> None:
        """Training starts: a fresh timer and, on the main process, the monitor.

        A process recorded already (under ``iolens run``, or inside an
        ``iolens.monitor()`` block) gets no second recording: the callback
        then times and logs, and the verdict it logs is the one over what
        that recording holds when training ends.
        """
        self.timer = _hooks.LoopTimer()
        self._mark = (0, 0, 0)
        if not main or self.monitor is not None:
            return
        self.outer, self.run_dir = False, None
        w = _hooks.writer()
        if w is not None:
            self.outer = True
            self.run_dir = os.path.dirname(w.directory)
            self._say(f"this process is already recorded into {self.run_dir}; the callback "
                      "adds no recording of its own")
            return
        out, interval, paths, devices = self._args
        try:
            self.monitor = Monitor(out, interval, paths, devices, quiet=self.quiet,
                                   mlflow=self.mlflow, wandb=self.wandb).start()
            self.run_dir = self.monitor.run_dir
        except Exception as exc:  # noqa: BLE001 - see NOTE [never hurt the job]
            self.monitor = None
            log.warning("iolens: monitoring did not start (%r); training goes on unrecorded", exc)

    def arm(self, loader: Any) -> None:
        """The loader (or loaders) of the epoch about to start: decide who times its batches."""
        self.timer.arm(loader)

    def recent(self) -> dict[str, float]:
        """The data-wait share and steps per second since the last call, from the hooks."""
        t = self.timer
        b0, w0, s0 = self._mark
        b, w, s = t.batches, t.wait_ns, t.step_ns
        self._mark = (b, w, s)
        if b <= b0 or s <= s0:
            return {}
        return {"iolens/data_wait_share": round(min(1.0, (w - w0) / (s - s0)), 4),
                "iolens/steps_per_s": round((b - b0) * 1e9 / (s - s0), 3)}

    def finish(self) -> Outcome:
        """Training ended: stop the monitor; the verdict and the figures to log."""
        m, self.monitor = self.monitor, None
        summary: dict[str, Any] | None = None
        if m is not None:
            try:
                summary = m.stop()
            except Exception as exc:  # noqa: BLE001 - see NOTE [never hurt the job]
                log.warning("iolens: stopping the monitor failed (%r)", exc)
        verdict = summary.get("verdict") if isinstance(summary, dict) else None
        so_far = False
        outer, self.outer = self.outer, False
        if outer and self.run_dir:
            # The recording goes on past this training and gives the final verdict
            # when it ends: the verdict over what it holds so far.
            verdict, so_far = _verdict_so_far(self.run_dir), True
        try:
            return self._outcome(verdict if isinstance(verdict, dict) else None, so_far)
        except Exception as exc:  # noqa: BLE001 - see NOTE [never hurt the job]
            log.warning("iolens: the figures could not be gathered (%r)", exc)
            return Outcome()

    def _outcome(self, verdict: dict[str, Any] | None, so_far: bool) -> Outcome:
        from iolens.analysis.verdict import (  # noqa: PLC0415 - at the end only
            NO_STEPS,
            severity,
            verdict_lines,
        )

        t = self.timer
        own_share = min(1.0, t.wait_ns / t.step_ns) if t.step_ns > 0 else None
        own_rate = t.batches * 1e9 / t.step_ns if t.step_ns > 0 else None
        if verdict is not None and so_far and verdict.get("class") == NO_STEPS and t.batches:
            verdict = None  # nothing timed in the records yet: the hooks' figures say more
        out = Outcome(verdict=verdict)
        if verdict is not None:
            figures = verdict.get("figures") or {}
            share = verdict.get("data_wait_share")
            sev = str(verdict.get("severity") or "unknown")
            cls = str(verdict.get("class") or "unknown")
            rate, batches = figures.get("steps_per_s"), figures.get("batches")
            if so_far:
                batches = None  # the records lag behind the training by up to an interval
            out.lines = verdict_lines(verdict)
            if so_far and out.lines:
                out.lines[0] = ("verdict so far" + out.lines[0].removeprefix("verdict")
                                + "; the recording gives the final one when it ends")
            elif self.run_dir:
                out.lines.append(f"full report: iolens report {shlex.quote(self.run_dir)}")
        else:
            share, rate, batches, cls = own_share, own_rate, t.batches, "unknown"
            sev = severity(share) if share is not None else "unknown"
            if share is not None:
                out.lines = [f"data wait {share * 100:.1f}% of step time ({sev}) over {t.batches} "
                             f"steps, timed between the {self.hooks} hooks; no recording, so no "
                             "verdict"]
            else:
                out.lines = ["no training step was timed"]
        if not isinstance(share, (int, float)):
            share = own_share  # a recording without timed batches: the hooks' figure
        numbers = {"iolens/data_wait_share": share,
                   "iolens/severity_level": SEVERITY_LEVELS.get(sev),
                   "iolens/steps_per_s": rate, "iolens/batches": batches}
        out.metrics = {k: round(float(v), 4) for k, v in numbers.items()
                       if isinstance(v, (int, float))}
        out.text = {"iolens/verdict": cls, "iolens/severity": sev}
        if self.run_dir:
            out.text["iolens/run_dir"] = self.run_dir
        return out


    def _say(self, msg: str) -> None:
        if not self.quiet:
            print(f"iolens: {msg}", file=sys.stderr, flush=True)


def _verdict_so_far(run_dir: str) -> dict[str, Any] | None:
    """The verdict over the records a run directory holds now (None when it cannot be had)."""
    try:
        from iolens.analysis.rundata import load_run  # noqa: PLC0415 - at the end only
        from iolens.analysis.verdict import diagnose  # noqa: PLC0415

        data = load_run(run_dir)
        return diagnose(data.view, data.meta).to_dict()
    except Exception as exc:  # noqa: BLE001 - see NOTE [never hurt the job]
        log.warning("iolens: no verdict from %s so far (%r)", run_dir, exc)
        return None


def emit(lines: Sequence[str]) -> None:
    """Log the verdict lines (INFO) to the ``iolens.integrations`` logger."""
    for line in lines:
        log.info("iolens: %s", line)
