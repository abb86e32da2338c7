"""``write-stall``: steps that stall while the job's writes saturate a device.
"""

from __future__ import annotations

import bisect
import statistics
from collections.abc import Sequence
from typing import Any

from iolens.analysis import model as pm
from iolens.analysis import rules
from iolens.analysis.model import Prediction
from iolens.analysis.verdict.figures import (
    device_load,
    device_names,
    end_of,
    is_timed,
    job_bytes,
    num,
    part_sum,
    secs_of,
    train,
)
from iolens.analysis.verdict.result import Recommendation, Window


def _write_episodes(records: Sequence[dict[str, Any]], name: str) -> list[list[int]]:
    """Runs of consecutive intervals in which ``name`` is saturated by writes."""
    episodes: list[list[int]] = []
    current: list[int] = []
    for i, r in enumerate(records):
        d = (r.get("devices") or {}).get(name)
        # A bucket of a long run (iolens.analysis.longrun) is saturated if any of its
        # intervals was: a checkpoint's seconds would vanish in the bucket's mean.
        util = "util_max" if isinstance(d, dict) and "util_max" in d else "util"
        hit = (isinstance(d, dict) and num(d, util) >= rules.UTIL_SATURATED
               and num(d, "wkB_s") > 0 and num(d, "wkB_s") >= num(d, "rkB_s"))
        if hit:
            current.append(i)
        elif current:
            episodes.append(current)
            current = []
    if current:
        episodes.append(current)
    return episodes

def write_stall(records: Sequence[dict[str, Any]], timed: Sequence[dict[str, Any]],
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
    p50s = [num(train(r).get("step") or {}, "p50_s") for r in timed]
    step_total = sum(part_sum(r, "step") for r in timed)
    if not p50s or step_total <= 0:
        return None
    typical = statistics.median(p50s)
    best: tuple[float, str, list[dict[str, Any]], list[dict[str, Any]]] | None = None
    ends = [end_of(r) for r in records]
    for name in device_names(records):
        excess = 0.0
        saturated: list[dict[str, Any]] = []
        stalled: list[dict[str, Any]] = []
        for ep in _write_episodes(records, name):
            ep_recs = [records[i] for i in ep]
            start = end_of(ep_recs[0]) - secs_of(ep_recs[0])
            dev_w = sum(num((r.get("devices") or {}).get(name) or {}, "wkB_s") * 1024 * secs_of(r)
                        for r in ep_recs)
            window = records[bisect.bisect_right(ends, start - rules.WRITE_LOOKBACK_S):
                             ep[-1] + 1]
            _, job_w = job_bytes(window)
            if dev_w <= 0 or job_w / dev_w < rules.JOB_SHARE_OWN:
                continue
            hit = [r for r in ep_recs if is_timed(r)]
            after = next((r for r in records[ep[-1] + 1:] if is_timed(r)), None)
            if after is not None:
                hit.append(after)
            excess += sum(max(0.0, part_sum(r, "step") - typical * num(train(r), "batches"))
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
    first = end_of(saturated[0]) - secs_of(saturated[0])
    _, job_w = job_bytes([r for r in records if end_of(r) > first - rules.WRITE_LOOKBACK_S])
    _, main_w = job_bytes([r for r in records if end_of(r) > first - rules.WRITE_LOOKBACK_S],
                           "main")
    w = Window(first, max(end_of(r) for r in saturated + stalled), "write-stall")
    who = "the training process" if main_w >= 0.5 * job_w else "the job"
    evidence = [
        f"{name} {load.util:.0f}% util writing {load.wMB_s:.1f} MB/s (w_await "
        f"{load.w_await:.1f} ms) in {len(saturated)} intervals, the writes by {who}, "
        f"{w.text()}",
        f"steps that waited for those writes took {excess:.1f} s more than the typical "
        f"{typical * 1000:.1f} ms step, {stall_share * 100:.0f}% of the step time",
    ]
    batches = sum(num(train(r), "batches") for r in timed)
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
