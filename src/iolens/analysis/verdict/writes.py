"""``write-stall``: steps that stall while the job's writes saturate a device.
"""

from __future__ import annotations

import bisect
import statistics

from iolens.analysis import model as pm
from iolens.analysis import rules
from iolens.analysis.columns import DeviceColumns, RunColumns, added
from iolens.analysis.model import Prediction
from iolens.analysis.verdict.result import Recommendation, Window


def _write_episodes(dev: DeviceColumns) -> list[list[int]]:
    """Runs of consecutive intervals (their indices in the run) in which the device is
    saturated by writes."""
    episodes: list[list[int]] = []
    current: list[int] = []
    for i, peak, rkb, wkb in zip(dev.at, dev.peak, dev.rkb_s, dev.wkb_s, strict=True):
        # A bucket of a long run (iolens.analysis.longrun) is saturated if any of its
        # intervals was: a checkpoint's seconds would vanish in the bucket's mean.
        hit = peak >= rules.UTIL_SATURATED and wkb > 0 and wkb >= rkb
        if current and (not hit or i != current[-1] + 1):
            episodes.append(current)
            current = []
        if hit:
            current.append(i)
    if current:
        episodes.append(current)
    return episodes

def write_stall(cols: RunColumns, share: float
                ) -> tuple[str, list[str], list[str], list[Recommendation], list[Window]] | None:
    """Steps slowed while the job's own writes saturate a device, read from the run's
    columns.

    A checkpoint is written in two phases: write() dirties the page cache (the
    job's write_bytes count then), and the device writes later, at fsync() or
    writeback. So the job's writes are looked for up to WRITE_LOOKBACK_S
    before each episode of write saturation, and the stalled steps are those
    that end in the episode or in the first timed interval after it (a step
    blocked in fsync is handed over only when the write is done).
    """
    run, steps, timed_at, devices = cols.run, cols.steps, cols.timed_at, cols.devices
    step_total = sum(steps.step_s)
    if not steps.n or step_total <= 0:
        return None
    typical = statistics.median(steps.step_p50_s)
    timed = set(timed_at)
    ends = run.elapsed_s
    best: tuple[float, str, list[int], list[int]] | None = None
    for name, dev in devices.items():
        excess = 0.0
        saturated: list[int] = []
        stalled: list[int] = []
        wkb = dict(zip(dev.at, dev.wkb, strict=True))
        for ep in _write_episodes(dev):
            start = ends[ep[0]] - run.secs[ep[0]]
            dev_w = sum(wkb[i] * 1024 for i in ep)
            lo = bisect.bisect_right(ends, start - rules.WRITE_LOOKBACK_S)
            job_w = added(run.job_write_b[lo:ep[-1] + 1])
            if dev_w <= 0 or job_w / dev_w < rules.JOB_SHARE_OWN:
                continue
            hit = [i for i in ep if i in timed]
            k = bisect.bisect_right(timed_at, ep[-1])
            if k < len(timed_at):
                hit.append(timed_at[k])
            excess += sum(max(0.0, run.step_s[i] - typical * run.batches[i]) for i in hit)
            saturated += ep
            stalled += hit
        if saturated and (best is None or excess > best[0]):
            best = (excess, name, saturated, stalled)
    if best is None:
        return None
    excess, name, saturated, stalled = best
    stall_share = excess / step_total
    if stall_share < rules.STALL_SHARE or stall_share <= share:
        return None
    load = devices[name].load(set(saturated))
    first = ends[saturated[0]] - run.secs[saturated[0]]
    since = [i for i, end in enumerate(ends) if end > first - rules.WRITE_LOOKBACK_S]
    job_w = added(run.job_write_b[i] for i in since)
    main_w = added(run.main_write_b[i] for i in since)
    w = Window(first, max(ends[i] for i in saturated + stalled), "write-stall")
    who = "the training process" if main_w >= 0.5 * job_w else "the job"
    evidence = [
        f"{name} {load.util:.0f}% util writing {load.wMB_s:.1f} MB/s (w_await "
        f"{load.w_await:.1f} ms) in {len(saturated)} intervals, the writes by {who}, "
        f"{w.text()}",
        f"steps that waited for those writes took {excess:.1f} s more than the typical "
        f"{typical * 1000:.1f} ms step, {stall_share * 100:.0f}% of the step time",
    ]
    batches = sum(steps.batches)
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
