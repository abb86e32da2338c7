"""The input pipeline from inside: the stage figures of a run's DataLoader workers (pure).

The recorder sums, per interval, what the workers timed of each batch they
made (NOTE [stage timing] in iolens/training/_hooks.py): the fetch of its
samples (wall, and the part on the CPU), the collate, the wait for indices
(idle), the files opened, and the hand-over to the loop. Here they become
per-sample and per-batch figures over a span of records.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any


def amount(d: Any, key: str) -> float:
    """A finite, non-negative figure of ``d``, else 0 (a damaged record hides nothing)."""
    try:
        v = d.get(key) if isinstance(d, dict) else None
        f = float(v) if v is not None else 0.0
    except (TypeError, ValueError):
        return 0.0
    return f if math.isfinite(f) and f > 0 else 0.0


def _secs(rec: dict[str, Any]) -> float:
    return max(0.0, amount(rec, "interval_s"))


def _pipe(rec: dict[str, Any]) -> dict[str, Any]:
    t = rec.get("train")
    p = t.get("pipeline") if isinstance(t, dict) else None
    return p if isinstance(p, dict) else {}


@dataclass
class Pipeline:
    """The stage figures over a span of records."""

    batches: int
    samples: int
    fetch_s: float
    fetch_cpu_s: float
    collate_s: float
    idle_s: float
    files: int
    handovers: int
    handover_s: float
    read_bytes: float
    """Bytes the fetching processes read through syscalls (rchar) in the span."""
    disk_bytes: float
    """Bytes they read from block devices (read_bytes: page faults of a memmap too)."""
    in_process: bool
    """The training process fetched its own batches (num_workers=0)."""
    processes: int

    @property
    def fetch_s_per_sample(self) -> float | None:
        return self.fetch_s / self.samples if self.samples else None

    @property
    def fetch_cpu_share(self) -> float | None:
        return min(1.0, self.fetch_cpu_s / self.fetch_s) if self.fetch_s > 0 else None

    @property
    def fetch_blocked_share(self) -> float | None:
        share = self.fetch_cpu_share
        return None if share is None else 1.0 - share

    @property
    def worker_idle_share(self) -> float | None:
        if self.in_process:
            return None
        busy = self.fetch_s + self.collate_s + self.idle_s
        return self.idle_s / busy if busy > 0 else None

    @property
    def collate_s_per_batch(self) -> float | None:
        return self.collate_s / self.batches if self.batches else None

    @property
    def handover_s_per_batch(self) -> float | None:
        return self.handover_s / self.handovers if self.handovers else None

    @property
    def bytes_per_sample(self) -> float | None:
        return self.read_bytes / self.samples if self.samples else None

    @property
    def disk_bytes_per_sample(self) -> float | None:
        return self.disk_bytes / self.samples if self.samples else None

    @property
    def busy_blocked_share(self) -> float | None:
        """The fetch's time off CPU as a share of the workers' busy time (fetch and
        collate, the collate counted as CPU)."""
        busy = self.fetch_s + self.collate_s
        return max(0.0, self.fetch_s - self.fetch_cpu_s) / busy if busy > 0 else None

    @property
    def files_per_sample(self) -> float | None:
        return self.files / self.samples if self.samples else None

    def to_dict(self) -> dict[str, Any]:
        """The figures of ``report --format json``'s ``pipeline``."""
        def r(v: float | None, n: int = 6) -> float | None:
            return None if v is None else round(v, n)

        return {
            "fetch_s_per_sample": r(self.fetch_s_per_sample, 7),
            "fetch_cpu_share": r(self.fetch_cpu_share, 4),
            "fetch_blocked_share": r(self.fetch_blocked_share, 4),
            "collate_s_per_batch": r(self.collate_s_per_batch, 7),
            "handover_s_per_batch": r(self.handover_s_per_batch, 7),
            "worker_idle_share": r(self.worker_idle_share, 4),
            "bytes_per_sample": r(self.bytes_per_sample, 1),
            "files_per_sample": r(self.files_per_sample, 4),
            "batches": self.batches,
            "samples": self.samples,
            "in_process": self.in_process,
            "processes": self.processes,
        }


def pipeline(records: Iterable[dict[str, Any]]) -> Pipeline | None:
    """The stage figures over ``records``, or None when no batch's stages were timed."""
    batches = samples = files = handovers = processes = 0
    fetch = cpu = collate = idle = handover = read = disk = 0.0
    in_process = False
    for rec in records:
        p = _pipe(rec)
        if not p:
            continue
        n = int(amount(p, "batches"))
        batches += n
        samples += int(amount(p, "samples"))
        fetch += amount(p, "fetch_s")
        cpu += amount(p, "fetch_cpu_s")
        collate += amount(p, "collate_s")
        idle += amount(p, "idle_s")
        files += int(amount(p, "files"))
        processes = max(processes, int(amount(p, "processes")))
        h = p.get("handover")
        handovers += int(amount(h, "count"))
        handover += amount(h, "sum_s")
        inproc = p.get("in_process") is True
        in_process = in_process or (inproc and n > 0)
        roles = ((rec.get("job") or {}).get("roles") or {}) if isinstance(rec.get("job"),
                                                                           dict) else {}
        role = roles.get("main" if inproc else "worker") if isinstance(roles, dict) else None
        read += amount(role, "rchar_s") * _secs(rec)
        disk += amount(role, "read_bytes_s") * _secs(rec)
    if batches == 0:
        return None
    return Pipeline(batches, samples, fetch, cpu, collate, idle, files, handovers, handover,
                    read, disk, in_process, processes)


def stage_series(records: Sequence[dict[str, Any]]) -> list[dict[str, float]]:
    """Per interval with timed stages: the mean per batch of fetch on CPU, fetch blocked,
    collate, hand-over and idle, in seconds (the report's stage chart)."""
    out = []
    for rec in records:
        p = _pipe(rec)
        n = amount(p, "batches")
        if n <= 0:
            continue
        fetch, cpu = amount(p, "fetch_s"), amount(p, "fetch_cpu_s")
        h = p.get("handover")
        hn = amount(h, "count")
        out.append({
            "elapsed_s": amount(rec, "elapsed_s"),
            "fetch_cpu_s": cpu / n,
            "fetch_blocked_s": max(0.0, fetch - cpu) / n,
            "collate_s": amount(p, "collate_s") / n,
            "handover_s": amount(h, "sum_s") / hn if hn else 0.0,
            "idle_s": amount(p, "idle_s") / n,
        })
    return out
