"""The few lines printed when a run ends: what the loop waited for, and the busiest disk.

The full verdict (classes, evidence, recommendations) belongs to the
analysis; this is the figure-level summary the recorder can give alone.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

# Share of step time spent waiting for data: the bands of TensorFlow's input
# pipeline analyzer (DESIGN.md "The verdict").
MODERATE = 0.05
HIGH = 0.20


def severity(share: float) -> str:
    """none under 5%, moderate 5-20%, high from 20%."""
    if share >= HIGH:
        return "high"
    if share >= MODERATE:
        return "moderate"
    return "none"


def summarize(records: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Totals over a run's interval records."""
    batches = 0
    wait_s = step_s = 0.0
    epochs = 0
    dev: dict[str, dict[str, float]] = {}
    job_read = 0.0
    seconds = 0.0
    for rec in records:
        train = rec.get("train") or {}
        n = int(train.get("batches") or 0)
        batches += n
        epochs += int(train.get("epochs_started") or 0)
        if train.get("step_source") == "dataloader":
            wait_s += float(train["data_wait"]["sum_s"])
            step_s += float(train["step"]["sum_s"])
        secs = float(rec.get("interval_s") or 0)
        seconds += secs
        job_read += float((rec.get("job") or {}).get("read_bytes_s") or 0) * secs
        for name, d in (rec.get("devices") or {}).items():
            acc = dev.setdefault(name, {"secs": 0.0, "util": 0.0, "r_ios": 0.0, "r_wait": 0.0,
                                        "rkB": 0.0})
            acc["secs"] += secs
            acc["util"] += float(d.get("util", 0)) * secs
            r_ios = float(d.get("r_s", 0)) * secs
            acc["r_ios"] += r_ios
            acc["r_wait"] += float(d.get("r_await", 0)) * r_ios
            acc["rkB"] += float(d.get("rkB_s", 0)) * secs
    out: dict[str, Any] = {"batches": batches, "epochs": epochs, "seconds": round(seconds, 3),
                           "job_read_bytes": int(job_read)}
    if step_s > 0:
        share = wait_s / step_s
        out["data_wait_share"] = round(share, 4)
        out["severity"] = severity(share)
    devices: list[dict[str, Any]] = []
    for name, acc in dev.items():
        if acc["secs"] <= 0:
            continue
        devices.append({
            "device": name,
            "util_pct": round(acc["util"] / acc["secs"], 2),
            "r_await_ms": round(acc["r_wait"] / acc["r_ios"], 2) if acc["r_ios"] else 0.0,
            "read_MBps": round(acc["rkB"] / acc["secs"] / 1024, 3),
        })
    devices.sort(key=lambda d: -float(d["util_pct"]))
    out["devices"] = devices
    return out


def summary_lines(summary: dict[str, Any]) -> list[str]:
    """Two or three human lines for the end of ``iolens run``."""
    lines = []
    if summary.get("batches") and "data_wait_share" in summary:
        share = summary["data_wait_share"]
        lines.append(f"data wait {share * 100:.1f}% of step time ({summary['severity']}) over "
                     f"{summary['batches']} batches in {summary['epochs']} epoch(s)")
    elif summary.get("batches") == 0:
        lines.append("no DataLoader batches were timed (not a PyTorch DataLoader loop, or "
                     "instrumentation off: see timing/*.json in the run directory)")
    if summary.get("devices"):
        d = summary["devices"][0]
        lines.append(f"busiest watched device {d['device']}: {d['util_pct']:.0f}% util, "
                     f"r_await {d['r_await_ms']:.1f} ms, {d['read_MBps']:.1f} MB/s read")
    return lines
