"""The machine's pace for Python's own work: a fixed piece of it, timed on the CPU.

NOTE [the machine's pace]: some of the model's figures are lab measurements in
milliseconds (a tensor's hand-over from a worker: iolens/analysis/rules.py), and a
machine runs the same Python faster or slower than the lab did. This one ran it at
different paces on different days: the loop's hand-over of a batch of one 4 MiB tensor
took 1.02-1.37 ms on the days the lab measured it and 1.68-2.22 ms on another, the
iolens timing hook 380 ns a batch on one day and 829 on another, while a bare read of
/proc/diskstats took the same 9 us on both. The recorder times a fixed piece of work of
the same kind (small objects made, pickled and unpickled, a dict kept) on its own thread's
CPU clock, so that the job's use of the cores does not count as time. Its pace swings
within a minute as well: 60 measurements half a second apart, on a quiet machine, took
0.36-0.74 ms (median 0.58). So it measures at most once a second through the run
(PaceClock), meta.json keeps the median (``pace_s``), and the analysis scales the
lab's milliseconds by it over the lab's own (rules.PACE_LAB_S)."""

from __future__ import annotations

import gc
import pickle
import statistics
import time

ROUNDS = 2
"""Rounds of the work a measurement takes; the quickest is the pace (a round slowed by an
interrupt or a neighbour on the core is not)."""


def _work() -> int:
    kept: dict[int, object] = {}
    for i in range(300):
        item = (i, str(i), [i, i + 1], {"k": i})
        kept[i] = pickle.loads(pickle.dumps(item, protocol=pickle.HIGHEST_PROTOCOL))
        kept.pop(i - 50, None)
    return len(kept)


def python_pace(rounds: int = ROUNDS) -> float | None:
    """Seconds of this thread's CPU for the quickest of ``rounds`` rounds of the fixed work
    (NOTE [the machine's pace]); None where the clock did not move (too coarse to time
    it)."""
    enabled = gc.isenabled()
    gc.disable()  # (a collection would time the heap, not the machine)
    try:
        best: int | None = None
        for _ in range(rounds):
            t = time.thread_time_ns()
            _work()
            took = time.thread_time_ns() - t
            if took > 0 and (best is None or took < best):
                best = took
        return None if best is None else best / 1e9
    finally:
        if enabled:
            gc.enable()


KEEP = 512
"""The most paces a run keeps: past that, every other is dropped and the clock takes one
half as often, so that a run of any length keeps paces spread evenly over its time."""


class PaceClock:
    """The machine's pace over a run: one measurement a second at most (ROUNDS rounds,
    about 1 ms of the recorder's CPU), and their median (NOTE [the machine's pace])."""

    def __init__(self, every_s: float = 1.0) -> None:
        self.every_s = every_s
        self.paces: list[float] = []
        self._due = 0.0

    def tick(self, now: float) -> None:
        """Measure the pace if one is due at monotonic time ``now``."""
        if now < self._due:
            return
        self._due = now + self.every_s
        pace = python_pace()
        if pace is None:
            return
        self.paces.append(pace)
        if len(self.paces) >= KEEP:
            del self.paces[1::2]
            self.every_s *= 2

    def seconds(self) -> float | None:
        """The median pace measured, in seconds; None before the first."""
        return statistics.median(self.paces) if self.paces else None
