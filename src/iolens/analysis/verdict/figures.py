"""The figures the verdict reads of a run: over spans of its columns (NOTE [columns] in
iolens/analysis/columns/__init__.py) the windows, the workers' CPU, the machine's idle,
the D states, the hand-over and the bursts of waits.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from iolens.analysis import rules
from iolens.analysis.columns import Span, StageColumns
from iolens.analysis.pipeline import Pipeline
from iolens.analysis.verdict.result import Window


def span_window(span: Span, label: str) -> Window | None:
    """The window of the span's intervals: from the first's start to the last's end."""
    bounds = span.bounds()
    return Window(*bounds, label) if bounds is not None else None

def num(d: Any, key: str) -> float:
    try:
        v = d.get(key) if isinstance(d, dict) else None
        return float(v) if v is not None else 0.0
    except (TypeError, ValueError):
        return 0.0

def train(rec: dict[str, Any]) -> dict[str, Any]:
    t = rec.get("train")
    return t if isinstance(t, dict) else {}

def worker_figures(c: StageColumns, picks: Sequence[int]) -> tuple[int, float]:
    """Most workers seen at once, and their mean CPU per worker (% of a core) over the
    intervals ``picks`` of the columns ``c``."""
    most = 0
    per_worker: list[tuple[float, float]] = []
    for i in picks:
        n = int(c.worker_pids[i])
        most = max(most, n)
        if n:
            per_worker.append((c.worker_cpu_pct[i] / n, c.secs[i]))
    secs = sum(s for _, s in per_worker)
    mean = sum(x * s for x, s in per_worker) / secs if secs else 0.0
    return most, mean

def machine_idle(c: StageColumns, picks: Sequence[int]) -> float | None:
    """Mean idle + iowait percent of all CPUs over the intervals ``picks`` of the columns
    ``c`` (None without CPU figures)."""
    vals = [(idle, c.secs[i]) for i in picks if (idle := c.idle_pct[i]) is not None]
    secs = sum(s for _, s in vals)
    return sum(v * s for v, s in vals) / secs if secs else None

def d_state_share(c: StageColumns, picks: Sequence[int]) -> float:
    """Share of the job's process samples in uninterruptible sleep (state D) over the
    intervals ``picks`` of the columns ``c``."""
    total = sum(c.all_states[i] for i in picks)
    return sum(c.d_states[i] for i in picks) / total if total else 0.0

def fetch_d_share(c: StageColumns, picks: Sequence[int], in_process: bool) -> float:
    """Share of the fetching processes' samples in state D over the intervals ``picks``:
    the training process's where it fetches, else the workers'; the job's processes'
    (:func:`d_state_share`) where the records did not keep them by role.

    NOTE [blocked by role]: the training process, while its workers fetch, sleeps in
    state S on their queue. Counted in the job's share, it held a fetch blocked on a
    throttle above the device under the rule's half: with 2 workers the share reaches 2/3
    at most, and a run whose two workers were both on a core in 2 of its 12 intervals
    read 18 of 37 (0.49) and was called loader-starved. The workers alone read D in most
    of their samples there."""
    samples, blocked = ((c.main_samples, c.main_blocked) if in_process
                        else (c.worker_samples, c.worker_blocked))
    total = sum(samples[i] for i in picks)
    if not total:
        return d_state_share(c, picks)
    return sum(blocked[i] for i in picks) / total

def ceiling_text(share: float) -> str:
    """What removing the data wait entirely would give."""
    if share >= 0.999:
        return "the loop does nothing but wait: any faster input speeds it up in proportion"
    return (f"up to {1 / (1 - share):.2f}x more steps per second if the data wait went to zero "
            f"(it is {share * 100:.0f}% of the step time)")

def input_windows(steps: StageColumns) -> list[int]:
    """The timed intervals (their indices in ``steps``, the timed intervals' columns) whose
    data wait is a moderate share of the step time or more; all of them where none is."""
    out = [i for i, (wait, step) in enumerate(zip(steps.wait_s, steps.step_s, strict=True))
           if step > 0 and wait / step >= rules.MODERATE]
    return out or list(range(steps.n))

def handover_share(pipe: Pipeline, span: Span) -> float:
    """The part of the loop's data wait over ``span`` that is the batches' hand-over or the
    epochs' first batches (at most 1: the two overlap in the first batch)."""
    wait = span.total("wait_s")
    if wait <= 0:
        return 0.0
    hand = (pipe.handover_s_per_batch or 0.0) * span.total("batches")
    return min(1.0, (hand + span.total("start_wait_s")) / wait)

def bursty(span: Span) -> str | None:
    """Why deeper prefetch would help, when the waits over ``span`` come in bursts (the p95
    wait well above the median); None when they do not."""
    steps = span.cols.steps
    p50s = [steps.wait_p50_s[i] for i in span.picks]
    p95s = [steps.wait_p95_s[i] for i in span.picks]
    if not p50s:
        return None
    p50, p95 = statistics.median(p50s), statistics.median(p95s)
    if p95 <= 2 * p50 or p95 < 0.001:  # (under a millisecond: no burst worth a setting)
        return None
    return (f"the workers fall behind in bursts: the p95 wait {p95 * 1000:.1f} ms against a "
            f"median {p50 * 1000:.1f} ms")

def busiest_read(span: Span, names: Sequence[str]) -> list[str]:
    """The device of ``names`` that read the most over ``span``."""
    within = span.within()
    loads = [span.load(n, within) for n in names]
    loads = [x for x in loads if x.rkB_s > 0]
    return [max(loads, key=lambda x: x.rkB_s).name] if loads else []
