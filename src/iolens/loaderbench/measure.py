"""Samples per second of a DataLoader (or a training step) after its warm-up, and the cores."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TextIO


@dataclass
class Rate:
    """What one measurement counted after its warm-up."""

    samples: int
    batches: int
    seconds: float
    warmup_batches: int
    warmup_seconds: float
    """Time to the end of the warm-up: worker start-up and the first batches."""

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"samples_per_s": round(self.samples_per_s, 2), "samples": self.samples,
                "batches": self.batches, "seconds": round(self.seconds, 3),
                "warmup_batches": self.warmup_batches,
                "warmup_seconds": round(self.warmup_seconds, 3)}


def batch_len(batch: Any) -> int:
    """How many samples a collated batch holds (its first tensor's first dimension)."""
    shape = getattr(batch, "shape", None)
    if shape is not None and len(shape):
        return int(shape[0])
    if isinstance(batch, Mapping) and batch:
        return batch_len(next(iter(batch.values())))
    if isinstance(batch, list | tuple) and batch:
        first = batch[0]
        if getattr(first, "shape", None) is not None or isinstance(first, list | tuple | Mapping):
            return batch_len(first)
        return len(batch)
    return 1


def measure(batches: Iterable[Any] | Callable[[], Iterable[Any]], *, seconds: float,
            warmup: int, consume: Callable[[Any], None] | None = None,
            finish: Callable[[], None] | None = None, one_pass: bool = False) -> Rate:
    """Draw batches for ``seconds`` after ``warmup`` batches; count the samples after them.

    ``batches`` is iterated again and again (epochs; a DataLoader restarts its
    workers each time unless they persist) until the time is up, or once with
    ``one_pass``. ``consume`` runs on every batch (a copy to the GPU, a training
    step), ``finish`` before the clock stops (a device synchronisation). When
    the first pass holds no more than ``warmup`` batches, the clock starts at
    its end.
    """
    start = time.monotonic()
    t0: float | None = None
    seen = samples = counted = 0
    now = start
    done = False
    while not done:
        source = batches() if callable(batches) else batches
        it = iter(source)
        try:
            for batch in it:
                seen += 1
                if consume is not None:
                    consume(batch)
                if t0 is None:
                    if seen >= warmup:
                        if finish is not None:
                            finish()
                        t0 = time.monotonic()
                    continue
                samples += batch_len(batch)
                counted += 1
                now = time.monotonic()
                if now - t0 >= seconds:
                    done = True
                    break
        finally:
            del it  # a DataLoader's iterator stops its workers here
        if t0 is None:
            if seen == 0:
                break  # an empty source
            t0 = time.monotonic()
        if one_pass:
            break
    if finish is not None:
        finish()
        now = time.monotonic()
    t0 = now if t0 is None else t0
    return Rate(samples, counted, max(now - t0, 0.0), min(seen, warmup), t0 - start)


@dataclass
class Cores:
    """The cores this process may use, how many other work keeps busy now, and how many are
    free."""

    usable: int
    load: float
    """Cores kept busy by other work over BUSY_WINDOW_S before the measurement."""
    free: int

    def text(self) -> str:
        return f"{self.free} of {self.usable} cores free ({self.load:.1f} busy)"

    def to_dict(self) -> dict[str, Any]:
        return {"usable": self.usable, "busy": round(self.load, 2), "free": self.free}


BUSY_WINDOW_S = 0.5
"""How long the machine's busy cores are sampled before a measurement. (The 1-minute load
average was used before: run right after a training, it still held the training, and the
search stopped at one worker where two were faster.)"""


def _cpu_times() -> tuple[float, float] | None:
    """The machine's busy and total CPU time (ticks) from /proc/stat, or None."""
    try:
        with open("/proc/stat") as fh:
            fields = [float(x) for x in fh.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    if len(fields) < 5:
        return None
    total = sum(fields[:8])
    return total - fields[3] - fields[4], total  # less idle and iowait


def cores(window_s: float = BUSY_WINDOW_S) -> Cores:
    """Cores in this process's affinity mask, less those other work keeps busy now."""
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = os.cpu_count() or 1
    busy = 0.0
    a = _cpu_times()
    if a is not None and window_s > 0:
        time.sleep(window_s)
        b = _cpu_times()
        if b is not None and b[1] > a[1]:
            busy = (b[0] - a[0]) / (b[1] - a[1]) * (os.cpu_count() or usable)
    busy = min(max(busy, 0.0), float(usable))
    return Cores(usable, busy, max(1, int(usable - busy + 0.5)))


def to_device(batch: Any, device: Any, non_blocking: bool = False) -> Any:
    """``batch`` with every tensor in it moved to ``device``."""
    if hasattr(batch, "to") and hasattr(batch, "shape"):
        return batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, Mapping):
        return {k: to_device(v, device, non_blocking) for k, v in batch.items()}
    if isinstance(batch, list | tuple):
        return [to_device(v, device, non_blocking) for v in batch]
    return batch


def quiet_loader_warnings() -> None:
    """Silence the DataLoader's advice on worker counts: choosing them is the point here."""
    import warnings  # noqa: PLC0415

    warnings.filterwarnings("ignore", message="This DataLoader will create",
                            category=UserWarning)


class Progress:
    """Progress over the settings or stages: a rich bar on a terminal, plain lines otherwise."""

    def __init__(self, prog: str, total: int, *, enabled: bool = True,
                 stream: TextIO | None = None) -> None:
        self.prog = prog
        self.total = total
        self.done = 0
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self._bar: Any = None
        self._task: Any = None
        if enabled and self.stream.isatty():
            from rich.console import Console  # noqa: PLC0415 - only on a terminal
            from rich.progress import (  # noqa: PLC0415
                BarColumn,
                MofNCompleteColumn,
                TextColumn,
                TimeElapsedColumn,
            )
            from rich.progress import Progress as Bar  # noqa: PLC0415

            self._bar = Bar(TextColumn("{task.description}"), BarColumn(),
                            MofNCompleteColumn(), TimeElapsedColumn(),
                            console=Console(file=self.stream), transient=True)
            self._bar.start()
            self._task = self._bar.add_task(prog, total=total)

    def start(self, label: str) -> None:
        """A setting or stage begins."""
        if self._bar is not None:
            self._bar.update(self._task, description=f"{self.prog}: {label}")

    def finish(self, label: str, result: str) -> None:
        """A setting or stage ended with ``result``."""
        self.done += 1
        self.total = max(self.total, self.done)
        if not self.enabled:
            return
        line = f"{self.prog}: [{self.done}/{self.total}] {label}: {result}"
        if self._bar is not None:
            self._bar.console.print(line, highlight=False, markup=False)
            self._bar.update(self._task, completed=self.done, total=self.total)
        else:
            print(line, file=self.stream, flush=True)

    def set_total(self, total: int) -> None:
        """The number of steps changed (an early stop, a step skipped)."""
        self.total = max(total, self.done)
        if self._bar is not None:
            self._bar.update(self._task, total=self.total)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
