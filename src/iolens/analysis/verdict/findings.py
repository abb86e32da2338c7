"""The secondary findings, any number beside the class: noisy-neighbor, warm-cache,
cold-start, epoch-start-stall, straggler, hang, no-disk-stats.
"""

from __future__ import annotations

import statistics
from collections import Counter
from typing import Any

from iolens.analysis import model as pm
from iolens.analysis import rules
from iolens.analysis.columns import DeviceColumns, RunColumns, Span, StageColumns, added
from iolens.analysis.verdict.figures import (
    span_window,
)
from iolens.analysis.verdict.ranks import rank_figures, straggler
from iolens.analysis.verdict.result import Finding, Recommendation, Verdict, Window, clock
from iolens.core.words import plural


def hang_finding(run: StageColumns) -> Finding | None:
    """The run ended while the loop waited for a batch (NOTE [no batch for a while] in
    iolens/recorder/sampler.py): a hang, with where each process of the loader waits.
    ``run``: the columns of all the run's intervals."""
    since = run.waiting_s[-1] if run.n else 0.0
    if since <= 0:
        return None
    # Where they waited: each process as most intervals of the hang saw it (a tie goes to
    # the earlier). The last intervals may come as the job is stopped (a worker running
    # its signal handler, a main process gone), so no single one speaks for the hang.
    hung: list[int] = []
    for i in reversed(range(max(0, run.n - rules.HANG_LOOKBACK), run.n)):
        if run.waiting_s[i] <= 0:
            break
        hung.insert(0, i)
    seen: dict[tuple[bool, int, str], Counter[str]] = {}
    for i in hung:
        for others, pid, role, state in run.waiting[i]:
            seen.setdefault((others, pid, role), Counter())[state] += 1
    where = [f"{who[2]} {who[1]} ({seen[who].most_common(1)[0][0]})" for who in sorted(seen)]
    last = run.n - 1
    return Finding("hang", [
        f"no batch came in the last {since:.0f} s recorded: the loop was waiting in next() "
        "for one"
        + (f"; {', '.join(where)}" if where else "")],
        Window(max(0.0, run.elapsed_s[last] - run.secs[last]), run.elapsed_s[last], "hang"), [
        Recommendation(
            "see where the workers wait (py-spy dump --pid PID, or faulthandler), and set "
            "DataLoader(timeout=SECONDS) so that a stuck batch raises instead of hanging; "
            "a spawned worker needs the script's `if __name__ == '__main__':` guard",
            f"the loop waited {since:.0f} s for one batch", "a job that fails fast")])

def all_findings(cols: RunColumns, v: Verdict) -> list[Finding]:
    """The findings beside the verdict; ``cols``: the run's columns (NOTE [columns] in
    iolens/analysis/columns/__init__.py)."""
    out: list[Finding] = []
    hang = hang_finding(cols.run)
    if hang is not None:
        out.append(hang)
    slow = straggler(rank_figures(cols.ranks))
    if slow is not None:
        out.append(slow)
    out += _noisy_neighbors(cols)
    out += _warm_cache(cols, v)
    out += _cold_start(cols)
    out += _epoch_start(cols.steps, v)
    return out

def _noisy_neighbors(cols: RunColumns) -> list[Finding]:
    """Devices kept busy by another process."""
    steps, at, devices = cols.steps, cols.timed_at, cols.devices
    out = []
    names = Span(cols, range(steps.n)).devices()
    loops = [n for n in names if n.startswith("loop")]
    span = sum(steps.secs)
    where = {name: dict(zip(devices[name].at, range(len(devices[name].at)), strict=True))
             for name in names}
    for name in names:
        dev, mine = devices[name], where[name]
        hit: list[int] = []  # (positions among the timed intervals)
        busy: list[int] = []
        for j, i in enumerate(at):
            k = mine.get(i)
            if k is None or dev.util[k] < rules.NEIGHBOR_UTIL:
                continue
            busy.append(j)
            secs = dev.secs[k]
            dev_bytes = (dev.rkb_s[k] + dev.wkb_s[k]) * 1024 * secs
            if dev_bytes <= 0:
                continue
            # A loop device's reads reach its backing disk from the kernel's loop
            # thread, not from the job: that load is the job's, seen one level down.
            looped = sum((devices[lp].rkb_s[n] + devices[lp].wkb_s[n]) * 1024 * secs
                         if (n := where[lp].get(i)) is not None else 0.0
                         for lp in loops if lp != name)
            own = steps.job_read_b[j] + steps.job_write_b[j] + looped + added(steps.helper_b[j])
            if own / dev_bytes < rules.JOB_SHARE_OWN:
                hit.append(j)
        if hit and sum(steps.secs[j] for j in hit) >= rules.NEIGHBOR_SHARE_OF_TIME * span:
            load = dev.load({at[j] for j in hit})
            jr, jw = added(steps.job_read_b[j] for j in hit), added(
                steps.job_write_b[j] for j in hit)
            dev_bytes = (load.rkB_s + load.wkB_s) * 1024 * load.secs
            own = (jr + jw) / dev_bytes if dev_bytes else 0.0
            # A helper's reads (a local server's, a FUSE daemon's) reach its counters an
            # interval early or late: the intervals where they look low are picked by
            # that. Over all the busy intervals they must leave room for a neighbour.
            helped = added(b for j in busy for b in steps.helper_b[j])
            if helped:
                b = dev.load({at[j] for j in busy})
                all_bytes = (b.rkB_s + b.wkB_s) * 1024 * b.secs
                busy_job = added(steps.job_read_b[j] for j in busy) + added(
                    steps.job_write_b[j] for j in busy)
                if all_bytes and (busy_job + helped) / all_bytes >= rules.JOB_SHARE_OWN:
                    continue
            w = span_window(Span(cols, (hit[0], hit[-1])), "noisy-neighbor")
            out.append(Finding("noisy-neighbor", [
                f"{name} {load.util:.0f}% util, {load.rMB_s:.1f} MB/s read and "
                f"{load.wMB_s:.1f} MB/s written, only {own * 100:.0f}% of it by this job"
                + (f", {w.text()}" if w else "")], w, [Recommendation(
                    "find the other reader (iotop, or `iolens top`) and move it or the "
                    "dataset to another device",
                    f"another process makes {100 - own * 100:.0f}% of {name}'s load",
                    "steadier step times")]))
    return out

def _warm_cache(cols: RunColumns, v: Verdict) -> list[Finding]:
    if v.storage and not v.storage[0].get("page_cache_visible", True):
        # Their reads never reach read_bytes: 1 - read_bytes/rchar would claim a cache
        # hit for every byte (NOTE [dataset folders] in iolens/recorder/storage.py).
        return []
    steps = cols.steps
    role = "worker" if any(steps.has_workers) else "main"
    rates = ((steps.worker_rchar_s, steps.worker_read_s) if role == "worker"
             else (steps.main_rchar_s, steps.main_read_s))
    secs = added(steps.secs)
    rchar = added(x * s for x, s in zip(rates[0], steps.secs, strict=True))
    disk = added(x * s for x, s in zip(rates[1], steps.secs, strict=True))
    if secs <= 0 or rchar / secs < rules.WARM_CACHE_MIN_RCHAR:
        return []
    hit = max(0.0, 1 - disk / rchar)
    if hit < rules.WARM_CACHE_HIT:
        return []
    caveat = (" The storage verdict may differ on a cold cache (a first epoch after a "
              "reboot, a dataset larger than RAM).")
    w = span_window(Span(cols, range(steps.n)), "warm-cache")
    return [Finding("warm-cache", [
        f"{hit * 100:.0f}% of what the {role} processes read came from the page cache "
        f"({rchar / secs / 2**20:.1f} MB/s read, {disk / secs / 2**20:.1f} MB/s from disk)."
        + (caveat if v.cls != "storage-bound" else "")], w)]

def _cold_start(cols: RunColumns) -> list[Finding]:
    steps = cols.steps
    span = sum(steps.secs)
    if steps.n < 5 or span <= 0:
        return []
    k = 0  # (the first k intervals: the start-up)
    acc = 0.0
    for s in steps.secs:
        if acc >= rules.COLD_START_SHARE_OF_TIME * span:
            break
        k += 1
        acc += s

    def share(part: slice) -> float | None:  # the part's data wait share
        step = added(steps.step_s[part])
        return added(steps.wait_s[part]) / step if step > 0 else None

    a, b = share(slice(0, k)), share(slice(k, None))
    if a is None or b is None or a < rules.HIGH or a < rules.COLD_START_RATIO * b:
        return []
    w = span_window(Span(cols, range(k)), "cold-start")
    return [Finding("cold-start", [
        f"the loop waited {a * 100:.0f}% of its step time for data in its first "
        f"{sum(steps.secs[:k]):.0f} s" + (f" ({w.text()})" if w else "")
        + f", then {b * 100:.0f}%: the cache filled or the workers warmed up"], w, [
        Recommendation("judge throughput after the start-up, or warm the cache first "
                       "(read the dataset once, vmtouch)",
                       "the start-up waits far more than the rest",
                       "a steady measurement")])]

def _epoch_start(steps: StageColumns, v: Verdict) -> list[Finding]:
    starts_n, starts_sum = sum(steps.start_count), sum(steps.start_wait_s)
    waits = steps.wait_p50_s
    step_total = sum(steps.step_s)
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
        copied = sum(x for w, m, sec in zip(steps.worker_wchar_s, steps.main_wchar_s,
                                            steps.secs, strict=True) for x in (w * sec, m * sec))
        secs = sum(steps.secs) or 1.0
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

def no_disk_stats(run: StageColumns, devices: dict[str, DeviceColumns],
                  meta: dict[str, Any]) -> Finding | None:
    """The ``no-disk-stats`` finding when device figures are missing for the whole run or
    stopped partway (the recorder's note says why), else None. ``run``: the run's
    intervals' columns, ``devices`` its devices'."""
    notes = [n for n in meta.get("notes") or [] if isinstance(n, str)]
    if any(d.at for d in devices.values()):
        stopped = next((n for n in notes if n.startswith("device statistics stopped")), None)
        last = max(d.at[-1] for d in devices.values() if d.at)
        if stopped is None or last == run.n - 1:
            return None
        at = run.elapsed_s[last]
        w = Window(at, run.elapsed_s[-1], "no-disk-stats")
        return Finding("no-disk-stats", [
            f"{stopped} (at {clock(at)}); from then on {_BLIND}"], w)
    why = next((n for n in notes if "statistic" in n), None)
    if why is not None:
        why = why.removesuffix(": no device statistics on this system")
    elif run.n and meta.get("disk_source") is not None:
        why = "no watched device had figures (none serves the job's files?)"
    return Finding("no-disk-stats", [
        f"no device statistics: {why or 'none were recorded'}; {_BLIND}"])
