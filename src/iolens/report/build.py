"""The report object: everything ``iolens report`` shows, as one JSON-ready dict.

Its layout is stable (``REPORT_SCHEMA``) and documented in the README:

- ``run``: path, command, host, start, end, duration, exit code, interval
- ``notes``: what was skipped while reading the run, and the recorder's notes
- ``verdict``: class, severity, data_wait_share (0-1), devices, evidence,
  recommendations, windows, figures
- ``findings``: secondary findings, each with ``class`` and ``evidence``
- ``training``: batches, epochs, steps per second, step and data-wait distributions
- ``devices``: per watched device, why it was watched and its load
- ``processes``: per role (main, worker, other) CPU, I/O and cache hits
- ``gpus``: per GPU utilization and memory
- ``cpu``: the machine's mean CPU shares
- ``pipeline``: the input pipeline's stages from inside the workers (per-sample fetch
  time and its on-CPU and blocked shares, collate and hand-over per batch, the workers'
  idle share, bytes and files per sample) and ``stages``, their split per interval; None
  when no worker stage was timed
- ``storage``: what serves the dataset (mount, fstype, device or None, kind, the folders
  read), from the files the input pipeline opened
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from iolens.analysis.columns import (
    CpuColumns,
    DeviceColumns,
    GpuColumns,
    RoleColumns,
    added,
)
from iolens.analysis.pipeline import pipeline_over, stage_series
from iolens.analysis.rundata import RunData
from iolens.analysis.verdict import diagnose, rank_figures
from iolens.rundir import records as trecords

REPORT_SCHEMA = 1
# Above this many bytes of per-batch timing files, distributions come from the
# per-interval figures instead (a week of batches would not fit in memory).
_MAX_TIMING_BYTES = 128 << 20


def build_report(run: RunData) -> dict[str, Any]:
    """The full report of one run."""
    meta = run.meta
    # The run's views, read once, before anything reads them (NOTE [columns] in
    # iolens/analysis/columns/__init__.py).
    devices, roles, cpu, gpus = run.devices, run.roles, run.cpu, run.gpus
    verdict = diagnose(run.view, meta)
    vd = verdict.to_dict()
    notes = [*run.notes, *[n for n in meta.get("notes") or [] if isinstance(n, str)]]
    training = _training(run, notes)
    return {
        "report_schema": REPORT_SCHEMA,
        "run": _run_info(run),
        "notes": notes,
        "verdict": vd,
        "findings": [f.to_dict() for f in verdict.findings],
        "training": training,
        "devices": _devices(devices, meta),
        "processes": _processes(roles, meta),
        "gpus": _gpus(gpus, meta),
        "cpu": _cpu(cpu),
        "pipeline": _pipeline(run, meta),
        "storage": [s for s in meta.get("storage") or [] if isinstance(s, dict)],
        "autotune": autotune(meta),
    }


def autotune(meta: dict[str, Any]) -> list[dict[str, Any]] | None:
    """``iolens run --autotune``: each loader's epochs (settings, prediction, measured rate,
    what was decided) and the settings it ended on, as the code would take them; None for
    a run without it. What a damaged meta.json holds wrongly is left out."""
    at = meta.get("autotune")
    if not isinstance(at, dict):
        return None
    from iolens.training.autotune import settings_text  # noqa: PLC0415 - autotuned runs only

    out = []
    for t in at.get("loaders") or []:
        if not isinstance(t, dict):
            continue
        epochs = []
        for e in t.get("epochs") or []:
            if not isinstance(e, dict) or not isinstance(e.get("settings"), dict):
                continue
            got = e.get("prediction")
            pred: dict[str, Any] = got if isinstance(got, dict) else {}
            epochs.append({
                "epoch": e.get("epoch"), "settings": settings_text(e["settings"]),
                "predicted": _r(_float(pred.get("steps_per_s")), 2),
                "low": _r(_float(pred.get("low")), 2), "high": _r(_float(pred.get("high")), 2),
                "steps_per_s": _r(_float(e.get("steps_per_s")), 2),
                "decision": str(e.get("decision") or "")})
        ended = t.get("ended_on") if isinstance(t.get("ended_on"), dict) else None
        out.append({
            "dataset": str(t.get("dataset") or "?"), "epochs": epochs,
            "ended_on": ended,
            "code": (f"DataLoader(..., {settings_text(ended)})" if ended else None),
            "settled": t.get("settled") if isinstance(t.get("settled"), str) else None,
            "refused": t.get("refused") if isinstance(t.get("refused"), str) else None})
    return out



def _float(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _pipeline(run: RunData, meta: dict[str, Any]) -> dict[str, Any] | None:
    pipe = pipeline_over(run.columns, range(len(run.records)), meta)
    if pipe is None:
        return None
    return {**pipe.to_dict(), "stages": [{k: round(v, 7) for k, v in row.items()}
                                         for row in stage_series(run.columns)]}


def cache_blind(meta: dict[str, Any]) -> str | None:
    """Why the page-cache hit (``1 - read_bytes/rchar``) does not hold for this run's
    dataset, or None when it does: reads of FUSE, NFS or tmpfs never reach read_bytes."""
    served = [s for s in meta.get("storage") or [] if isinstance(s, dict)]
    for s in served[:1]:  # the dataset's: the most files opened there
        if s.get("page_cache_visible") is False:
            return (f"the dataset is on {s.get('mount')} ({s.get('fstype')}), whose reads never "
                    "count in read_bytes: the page-cache hit 1 - read_bytes/rchar does not hold "
                    "there")
    return None


def _run_info(run: RunData) -> dict[str, Any]:
    m = run.meta
    keys = ("command", "host", "cwd", "start", "end", "duration_s", "exit_code", "interval_s",
            "iolens_version", "mode", "cpus", "kernel", "set", "set_loaders")
    info: dict[str, Any] = {"path": os.path.abspath(run.path)}
    info.update({k: m.get(k) for k in keys})
    info["intervals"] = len(run.records)
    if run.bucket_s is not None:  # a long run: its buckets each fold ``merged`` intervals
        info["intervals"] = sum(n for r in run.records
                                if isinstance(n := r.get("merged"), int) and n > 0)
        info["buckets"], info["bucket_s"] = len(run.records), run.bucket_s
    if info["duration_s"] is None and run.records:
        info["duration_s"] = run.records[-1].get("elapsed_s")
    return info


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _r(v: float | None, nd: int = 3) -> float | None:
    return None if v is None else round(v, nd)


def _weighted_pct(pairs: list[tuple[float, float]], q: float) -> float | None:
    """The q-quantile of values weighted by counts (value, weight)."""
    pairs = sorted(p for p in pairs if p[1] > 0)
    total = sum(w for _, w in pairs)
    if not total:
        return None
    acc = 0.0
    for v, w in pairs:
        acc += w
        if acc >= q * total:
            return v
    return pairs[-1][0]


def _training(run: RunData, notes: list[str]) -> dict[str, Any]:
    c = run.columns
    out: dict[str, Any] = {"batches": sum(int(n) for n in c.batches),
                           "epochs": sum(int(n) for n in c.epochs)}
    exact = _exact_distributions(run, notes)
    if exact is not None:
        out["distribution_source"] = "every batch"
        out["data_wait"], out["step"] = exact
        timed_batches = exact[0]["count"]
        if "end" not in run.meta and timed_batches > out["batches"]:
            notes.append(f"the timing files hold {timed_batches} batches, the recorded "
                         f"intervals {out['batches']}: the recording stopped before the "
                         "rest; the verdict and the per-interval figures cover the recorded "
                         "intervals only, the data wait and step distributions every batch")
    else:
        out["distribution_source"] = "per-interval figures (p50 and p95 approximate)"
        timed = [i for i, on in enumerate(c.loader) if on]
        for part, n, sums, p50, p95, most in (
                ("data_wait", c.wait_count, c.wait_s, c.wait_p50_s, c.wait_p95_s, c.wait_max_s),
                ("step", c.step_count, c.step_s, c.step_p50_s, c.step_p95_s, c.step_max_s)):
            count = sum(n[i] for i in timed)
            total = sum(sums[i] for i in timed)
            out[part] = {
                "count": count, "sum_s": _r(total, 6),
                "mean_s": _r(total / count, 6) if count else None,
                "p50_s": _r(_weighted_pct([(p50[i], n[i]) for i in timed], 0.5), 6),
                "p95_s": _r(_weighted_pct([(p95[i], n[i]) for i in timed], 0.95), 6),
                "max_s": _r(max((most[i] for i in timed), default=0.0), 6),
            }
    ranks = rank_figures(run.ranks, run.meta.get("host"))
    if ranks:
        out["ranks"] = ranks
    step_sum = out["step"].get("sum_s") or 0
    out["steps_per_s"] = _r(out["step"]["count"] / step_sum) if step_sum else None
    return out


def _exact_distributions(run: RunData,
                         notes: list[str]) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """Data-wait and step distributions over every batch, from the timing files.

    Damaged timing records are left out, and counted in ``notes``.
    """
    tdir = os.path.join(run.path, "timing")
    spare = _unmoved_spare(run)
    names: list[str] = []
    size = 0
    for folder in (tdir, spare):
        if folder is None:
            continue
        try:
            found = [os.path.join(folder, n) for n in os.listdir(folder) if n.endswith(".bin")]
            size += sum(os.path.getsize(n) for n in found)
        except OSError:
            continue
        names += found
    if not names or size > _MAX_TIMING_BYTES or size < trecords.RECORD_BYTES:
        return None
    from iolens.rundir.timing import (  # noqa: PLC0415 - a run without timing needs none
        TimingReader,
        TrainingAggregator,
    )

    agg = TrainingAggregator()
    TimingReader(tdir, spare=spare).poll(agg)
    if spare is not None and any(n.startswith(spare + os.sep) for n in names):
        notes.append(f"the timing the job wrote once the run directory failed it was read from "
                     f"{spare}: iolens stopped before it could move it into the run")
    if agg.skipped:
        notes.append(f"{agg.skipped} damaged timing record(s) in timing/ were skipped")
    if not agg.waits:
        return None
    taken = agg.take()

    def shaped(d: dict[str, Any]) -> dict[str, Any]:
        n = d["count"]
        return {"count": n, "sum_s": _r(d["sum_s"], 6),
                "mean_s": _r(d["sum_s"] / n, 6) if n else None,
                "p50_s": _r(d["p50_s"], 6), "p95_s": _r(d["p95_s"], 6),
                "max_s": _r(d["max_s"], 6)}

    return shaped(taken["data_wait"]), shaped(taken["step"])


def _unmoved_spare(run: RunData) -> str | None:
    """The spare timing folder of a run whose recorder was stopped before it moved the
    files there into the run (NOTE [spare timing folder] in iolens/training/_hooks.py),
    when it is still there; None otherwise."""
    spare = run.meta.get("timing_spare")
    if "end" in run.meta or not isinstance(spare, str) or not os.path.isdir(spare):
        return None
    return spare


def _devices(devices: dict[str, DeviceColumns], meta: dict[str, Any]) -> dict[str, Any]:
    why = meta.get("devices") if isinstance(meta.get("devices"), dict) else {}
    out: dict[str, Any] = {}
    for name, cols in devices.items():
        load = cols.load()
        utils = cols.util
        out[name] = {
            "why": why.get(name) if isinstance(why, dict) else None,
            "seconds": _r(load.secs),
            "util_pct": _r(load.util, 2), "util_max_pct": _r(max(utils, default=0.0), 2),
            "busy_share": _r(sum(u >= 80 for u in utils) / len(utils)) if utils else None,
            "r_s": _r(load.r_s, 2), "w_s": _r(load.w_s, 2),
            "read_MBps": _r(load.rMB_s), "write_MBps": _r(load.wMB_s),
            "r_await_ms": _r(load.r_await, 2), "w_await_ms": _r(load.w_await, 2),
            "aqu_sz": _r(load.aqu_sz, 2), "rareq_kib": _r(load.rareq_kib, 1),
        }
    return out


def _processes(roles: dict[str, RoleColumns], meta: dict[str, Any]) -> dict[str, Any]:
    acc = {role: {"secs": added(c.secs), "pids": max(c.pids, default=0.0), "cpu": added(c.cpu),
                  "rd": added(c.read), "wr": added(c.write), "rchar": added(c.rchar)}
           for role, c in roles.items()}
    out: dict[str, Any] = {}
    blind = cache_blind(meta)
    for role, a in acc.items():
        s = a["secs"] or 1.0
        out[role] = {
            "pids_max": int(a["pids"]), "seconds": _r(a["secs"]),
            "cpu_pct": _r(a["cpu"] / s, 2),
            "read_MBps": _r(a["rd"] / s / 2**20), "write_MBps": _r(a["wr"] / s / 2**20),
            "read_bytes": int(a["rd"]), "write_bytes": int(a["wr"]),
            "cache_hit": (_r(max(0.0, 1 - a["rd"] / a["rchar"]), 4)
                          if a["rchar"] and blind is None else None),
            "read_rchar_MBps": _r(a["rchar"] / s / 2**20),
        }
        if blind is not None:
            out[role]["cache_hit_note"] = blind
    return out


def _gpus(per: dict[int, GpuColumns], meta: dict[str, Any]) -> dict[str, Any]:
    info = meta.get("gpu") if isinstance(meta.get("gpu"), dict) else {}
    names = info.get("names") or [] if isinstance(info, dict) else []
    gpus = [{
        "index": i, "name": names[i] if 0 <= i < len(names) else None,
        "util_pct": _r(_mean(g.util), 2), "util_max_pct": _r(max(g.util), 2),
        "mem_used_max_bytes": int(max(g.mem_used)), "mem_total_bytes": int(max(g.mem_total)),
    } for i, g in sorted(per.items())]
    return {"available": bool(info.get("available")) if isinstance(info, dict) else False,
            "reason": info.get("reason") if isinstance(info, dict) else None, "gpus": gpus}


def _cpu(cpu: CpuColumns) -> dict[str, Any]:
    return {k: _r(_mean(getattr(cpu, k)), 2) for k in CpuColumns.SHARES}
