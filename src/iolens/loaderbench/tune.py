"""The search for the DataLoader settings that deliver the most samples per second.

Settings are tried one after another, each measured for a fixed time after its
warm-up (the workers' start-up and first batches), in four steps:

1. ``num_workers`` over 0, 1, 2, 3, 4, 6, 8, 12, ... up to the limit (by default
   the free cores), with ``prefetch_factor`` 2; from one worker on, the search
   stops when a step gains less than 5% over the one before twice in a row, or
   loses more than 5%;
2. ``prefetch_factor`` 4 then 8 at the best worker count, while it gains 5%;
3. ``persistent_workers=True`` at the best so far (it saves the workers' restart
   at every epoch, which shows when the measurement spans epochs);
4. ``pin_memory=True``, only where CUDA is available (every batch is then copied
   to the GPU in every setting, so that the copies are compared like for like).

The best setting is the simplest one (fewest workers, smallest prefetch, the
defaults) within 3% of the highest rate: differences that small are noise.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from iolens.loaderbench.measure import (
    Cores,
    Progress,
    Rate,
    measure,
    quiet_loader_warnings,
    to_device,
)

GAIN = 0.05
"""A step must gain this share over the one before to count as helping."""
NOISE = 0.03
"""Rates within this share of the best are taken as equal; the simplest setting wins."""
WORKER_STEPS = (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)
PREFETCH_STEPS = (4, 8)


@dataclass(frozen=True)
class Setting:
    """One DataLoader configuration."""

    num_workers: int
    prefetch_factor: int | None = None
    """None with no workers (the DataLoader allows none then); 2 is the default."""
    pin_memory: bool = False
    persistent_workers: bool = False

    def label(self) -> str:
        parts = [f"num_workers={self.num_workers}"]
        if self.num_workers:
            parts.append(f"prefetch_factor={self.prefetch_factor}")
            parts.append(f"persistent_workers={self.persistent_workers}")
        parts.append(f"pin_memory={self.pin_memory}")
        return ", ".join(parts)

    def kwargs(self) -> dict[str, Any]:
        """The DataLoader keyword arguments of this setting."""
        kw: dict[str, Any] = {"num_workers": self.num_workers, "pin_memory": self.pin_memory}
        if self.num_workers:
            kw["prefetch_factor"] = self.prefetch_factor
            kw["persistent_workers"] = self.persistent_workers
        return kw

    def cost(self) -> tuple[int, int, bool, bool]:
        """Orders settings from the simplest (fewest workers, the defaults) up."""
        return (self.num_workers, self.prefetch_factor or 0, self.pin_memory,
                self.persistent_workers)

    def to_dict(self) -> dict[str, Any]:
        return {"num_workers": self.num_workers, "prefetch_factor": self.prefetch_factor,
                "pin_memory": self.pin_memory, "persistent_workers": self.persistent_workers}


@dataclass(frozen=True)
class StepLoad:
    """A stand-in for the training step, run on every batch the loop gets: ``cpu_s`` of
    CPU in the loop's thread (as a step's Python and its CPU kernels), then a sleep to
    ``step_s`` in all (as a wait on a GPU). The workers then compete with it for the
    cores as they do in training (NOTE [the step beside the loader])."""

    step_s: float
    cpu_s: float
    source: str
    """Where the figures come from (a run's folder, or the command line)."""

    def __call__(self, batch: Any) -> None:
        end = time.thread_time() + self.cpu_s
        while time.thread_time() < end:
            pass
        rest = self.step_s - self.cpu_s
        if rest > 0:
            time.sleep(rest)

    def text(self) -> str:
        return (f"beside a stand-in for the training step: {self.step_s * 1000:.1f} ms a batch, "
                f"{self.cpu_s * 1000:.1f} ms of it on CPU ({self.source})")

    def to_dict(self) -> dict[str, Any]:
        return {"step_s": round(self.step_s, 6), "cpu_s": round(self.cpu_s, 6),
                "source": self.source}


"""NOTE [the step beside the loader]: the loader alone is not the training. On a machine
with few cores the step's CPU competes with the workers': measured alone, a JPEG pipeline's
best was num_workers=0 at 896.6 samples/s, and followed, the training went from 28.48 to
19.53 steps/s. With a stand-in for the step (the CPU it takes, and the rest of its time
asleep, from the run's own figures), each setting is measured as the loop will run it,
and the rate is the training's own in samples per second."""


@dataclass
class Trial:
    setting: Setting
    rate: Rate

    def to_dict(self) -> dict[str, Any]:
        return {**self.setting.to_dict(), **self.rate.to_dict()}


@dataclass
class TuneResult:
    """Every setting measured, the best, and what was skipped or stopped and why."""

    dataset: str
    batch_size: int
    seconds: float
    cores: Cores
    max_workers: int
    cuda: bool
    trials: list[Trial] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    step: StepLoad | None = None

    def best(self) -> Trial:
        top = max(t.rate.samples_per_s for t in self.trials)
        near = [t for t in self.trials if t.rate.samples_per_s >= top * (1 - NOISE)]
        return min(near, key=lambda t: t.setting.cost())

    def baseline(self) -> Trial | None:
        """The first setting measured with no workers (loading in the main process)."""
        return next((t for t in self.trials if t.setting.num_workers == 0), None)

    def to_dict(self) -> dict[str, Any]:
        best = self.best()
        base = self.baseline()
        gain = (best.rate.samples_per_s / base.rate.samples_per_s
                if base and base.rate.samples_per_s > 0 else None)
        return {"dataset": self.dataset, "batch_size": self.batch_size,
                "seconds_per_setting": self.seconds, "cores": self.cores.to_dict(),
                "max_workers": self.max_workers, "cuda": self.cuda,
                "settings": [t.to_dict() for t in self.trials],
                "best": best.to_dict(),
                "gain_over_no_workers": None if gain is None else round(gain, 2),
                "step": self.step.to_dict() if self.step is not None else None,
                "notes": list(self.notes)}


def worker_steps(max_workers: int) -> list[int]:
    """The worker counts to try, up to ``max_workers`` (which is always among them)."""
    steps = [n for n in WORKER_STEPS if n <= max_workers]
    if steps[-1] != max_workers:
        steps.append(max_workers)
    return steps


def tune(dataset: Any, *, name: str, batch_size: int, seconds: float, max_workers: int,
         cores: Cores, progress: Progress | None = None, cuda: bool | None = None,
         warmup: int | None = None, step: StepLoad | None = None) -> TuneResult:
    """Measure the settings (see the module) over ``dataset``; the trials in order. With
    ``step``, each batch the loop gets costs it that stand-in for the training step."""
    import torch  # noqa: PLC0415
    from torch.utils.data import DataLoader  # noqa: PLC0415

    quiet_loader_warnings()
    if cuda is None:
        cuda = torch.cuda.is_available()
    result = TuneResult(name, batch_size, seconds, cores, max_workers, cuda, step=step)
    if step is None:
        result.notes.append(
            "measured the loader alone, with no training step beside it: on a machine "
            "without spare cores the step's CPU competes with the workers, and the best "
            "here can be slower in training; give --run RUN (a run recorded with iolens "
            "run) or --step-ms to measure beside a stand-in for the step")
    if max_workers > cores.free:
        result.notes.append(f"--max-workers {max_workers} is more than the {cores.free} free "
                            f"cores: workers beyond them compete for CPU")
    if not cuda:
        result.notes.append("pin_memory skipped: CUDA is not available here (pinned memory "
                            "only speeds up copies to a GPU)")
    steps = worker_steps(max_workers)
    planned = len(steps) + len(PREFETCH_STEPS) + 1 + int(cuda)
    bar = progress or Progress("iolens tune", planned, enabled=False)
    bar.set_total(planned)
    device = torch.device("cuda") if cuda else None

    def copy(batch: Any, *, pinned: bool) -> None:
        to_device(batch, device, non_blocking=pinned)

    def run(setting: Setting) -> Trial:
        bar.start(setting.label())
        loader = DataLoader(dataset, batch_size=batch_size, shuffle=True, **setting.kwargs())
        consume: Callable[[Any], None] | None = step
        finish: Callable[[], None] | None = None
        if device is not None:
            def consume(batch: Any) -> None:
                copy(batch, pinned=setting.pin_memory)
                if step is not None:
                    step(batch)

            finish = torch.cuda.synchronize
        first = warmup if warmup is not None else max(1, setting.num_workers)
        rate = measure(loader, seconds=seconds, warmup=first, consume=consume, finish=finish)
        trial = Trial(setting, rate)
        result.trials.append(trial)
        bar.finish(setting.label(), f"{rate.samples_per_s:,.1f} samples/s")
        return trial

    # 1. workers
    prev: Trial | None = None
    weak = 0
    for i, n in enumerate(steps):
        trial = run(Setting(n, 2 if n else None))
        if prev is not None and prev.setting.num_workers > 0:
            before, now = prev.rate.samples_per_s, trial.rate.samples_per_s
            if now < before * (1 - GAIN):
                why = (f"num_workers={n} delivered {now:,.1f} samples/s, less than "
                       f"{before:,.1f} with {prev.setting.num_workers}")
            elif now < before * (1 + GAIN):
                weak += 1
                why = (f"num_workers={n} gained under {GAIN:.0%} twice in a row "
                       f"({now:,.1f} samples/s)")
            else:
                weak = 0
            if (now < before * (1 - GAIN) or weak >= 2) and i + 1 < len(steps):
                result.notes.append(f"stopped adding workers: {why}")
                planned -= len(steps) - i - 1
                bar.set_total(planned)
                break
        prev = trial
    best = result.best().setting
    # 2. prefetch_factor, 3. persistent_workers: only with workers
    if best.num_workers == 0:
        result.notes.append("prefetch_factor and persistent_workers skipped: loading in the "
                            "main process (num_workers=0) was as fast as with workers")
        planned -= len(PREFETCH_STEPS) + 1
        bar.set_total(planned)
    else:
        prev = next(t for t in result.trials if t.setting == best)
        for k, factor in enumerate(PREFETCH_STEPS):
            trial = run(replace(best, prefetch_factor=factor))
            if trial.rate.samples_per_s < prev.rate.samples_per_s * (1 + GAIN):
                planned -= len(PREFETCH_STEPS) - k - 1
                bar.set_total(planned)
                break
            prev = trial
        best = result.best().setting
        run(replace(best, persistent_workers=True))
    # 4. pin_memory
    if cuda:
        run(replace(result.best().setting, pin_memory=True))
    return result


def render_text(result: TuneResult) -> str:
    """The table of settings and rates, the best setting and the DataLoader line to use."""
    best = result.best()
    base = result.baseline()
    lines = [f"iolens tune: {result.dataset}, batch size {result.batch_size}, "
             f"{result.seconds:g} s per setting after a warm-up, up to "
             f"{result.max_workers} workers ({result.cores.text()})"]
    if result.step is not None:
        lines.append(f"  {result.step.text()}")
    lines.append("")
    head = f"  {'num_workers':>11}  {'prefetch':>8}  {'persistent':>10}  {'pin_memory':>10}" \
           f"  {'samples/s':>11}"
    lines.append(head)
    for t in result.trials:
        s = t.setting
        mark = "  <- best" if t is best else ""
        lines.append(f"  {s.num_workers:>11}  {s.prefetch_factor or '-':>8}  "
                     f"{('yes' if s.persistent_workers else 'no') if s.num_workers else '-':>10}"
                     f"  {'yes' if s.pin_memory else 'no':>10}  "
                     f"{t.rate.samples_per_s:>11,.1f}{mark}")
    lines.append("")
    gain = ""
    if base is not None and base is not best and base.rate.samples_per_s > 0:
        gain = (f", {best.rate.samples_per_s / base.rate.samples_per_s:.1f}x the rate with "
                "num_workers=0")
    steps = (f" ({best.rate.samples_per_s / result.batch_size:,.2f} steps/s)"
             if result.step is not None else "")
    lines.append(f"best: {best.setting.label()}: {best.rate.samples_per_s:,.1f} samples/s"
                 f"{steps}{gain}")
    kw = ", ".join(f"{k}={v}" for k, v in best.setting.kwargs().items())
    lines.append(f"  DataLoader(dataset, batch_size={result.batch_size}, {kw})")
    lines.extend(f"note: {n}" for n in result.notes)
    return "\n".join(lines) + "\n"
