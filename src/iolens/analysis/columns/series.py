"""The figures a run's charts draw, over its intervals in time order, as recorded
(:class:`SeriesColumns`; NOTE [columns] in iolens/analysis/columns/__init__.py).

Unlike the verdict's columns, which read a missing or damaged figure as 0 (it hides
nothing from a sum), a chart leaves it out: each entry here is the figure as the record
holds it, or None where the interval has none (a gap in the line, not a fall to zero).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

DEVICE = ("rkB_s", "wkB_s", "r_await", "w_await", "util")
"""A device's figures as the charts draw them (iostat's)."""
JOB = ("read_bytes_s", "write_bytes_s", "rchar_s", "cache_hit")
"""The job's figures (all its processes')."""
ROLE = ("cpu_pct", "rchar_s", "cache_hit")
"""Each role's figures (its processes', together)."""
GPU = ("util_pct",)
TRAIN = tuple(f"{part}.{key}" for key in ("p50_s", "p95_s", "max_s")
              for part in ("step", "data_wait"))
"""The loop's step and data wait per batch, as ``part.key`` of the record's ``train``."""


def figure(v: Any) -> float | None:
    """A figure as a chart takes it: a finite number, else None (booleans are no figure)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    f = float(v)
    return f if math.isfinite(f) else None


@dataclass(frozen=True)
class Figure:
    """One figure over the run's intervals: its value in each (None where the interval has
    none) and, where the interval is a long run's bucket that kept them, the lowest and
    highest value within it (else None: the value is both)."""

    value: tuple[float | None, ...]
    low: tuple[float | None, ...]
    high: tuple[float | None, ...]


@dataclass(frozen=True)
class SeriesColumns:
    """The figures a run's charts draw, read once from its records: those with an elapsed
    time, in its order. A name's figures are there for every interval, None where the
    interval does not name it."""

    elapsed: tuple[float, ...]
    """Each interval's end, seconds into the run."""
    start: float
    """When the first interval began (seconds into the run, 0 or later; 0 with none)."""
    clock0: float | None
    """Seconds since the epoch at elapsed zero, from the first interval with a clock."""
    devices: dict[str, dict[str, Figure]]
    """Each device's :data:`DEVICE` figures, in the order the intervals first name them."""
    job: dict[str, Figure]
    """The job's :data:`JOB` figures (where no interval names a role, none)."""
    roles: dict[str, dict[str, Figure]]
    """Each role's :data:`ROLE` figures: the training process's, then its workers', then
    the others', then any other role by name."""
    busy: Figure
    """The machine's busy share (%): neither idle nor waiting for I/O."""
    gpus: dict[int, dict[str, Figure]]
    """Each GPU's :data:`GPU` figures, by index (those NVML answered its %util for)."""
    train: dict[str, Figure]
    """The loop's :data:`TRAIN` figures, in the intervals that timed steps (where none
    did, none)."""

    def __len__(self) -> int:
        return len(self.elapsed)

    @classmethod
    def of(cls, records: Sequence[dict[str, Any]]) -> SeriesColumns:
        recs = [r for r in records if isinstance(r, dict)
                and figure(r.get("elapsed_s")) is not None]
        recs.sort(key=lambda r: float(r["elapsed_s"]))  # linear on the usual, ordered input
        devs, roles, gpus, steps = _names(recs)
        merged = ["merged" in r for r in recs]
        return cls(
            elapsed=tuple(float(r["elapsed_s"]) for r in recs),
            start=max(0.0, float(recs[0]["elapsed_s"])
                      - (figure(recs[0].get("interval_s")) or 0.0)) if recs else 0.0,
            clock0=_clock0(recs),
            devices={name: _figures([_d(_d(r.get("devices")).get(name)) for r in recs],
                                    DEVICE, merged) for name in devs},
            job=_figures([_d(r.get("job")) for r in recs], JOB, merged) if roles else {},
            roles={role: _figures([_d(_d(_d(r.get("job")).get("roles")).get(role))
                                   for r in recs], ROLE, merged) for role in roles},
            busy=_busy(recs),
            gpus={i: _figures([_gpu(r, i) for r in recs], GPU, merged) for i in gpus},
            train=_train(recs) if steps else {},
        )


def _d(v: Any) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


def _names(recs: Sequence[dict[str, Any]]) -> tuple[list[str], list[str], list[int], bool]:
    """Devices, roles and GPU indexes seen (devices in order of appearance, roles in the
    charts' order, GPUs by index), and whether any interval timed a step."""
    devs: dict[str, None] = {}
    roles: dict[str, None] = {}
    gpus: dict[int, None] = {}
    steps = False
    for rec in recs:
        for name in _d(rec.get("devices")):
            devs.setdefault(str(name), None)
        for role in _d(_d(rec.get("job")).get("roles")):
            roles.setdefault(str(role), None)
        g = rec.get("gpu")
        if isinstance(g, list):
            for e in g:
                if isinstance(e, dict) and figure(e.get("util_pct")) is not None:
                    idx = e.get("index", 0)
                    if isinstance(idx, int):
                        gpus.setdefault(idx, None)
        if not steps:
            steps = bool(figure(_d(_d(rec.get("train")).get("step")).get("count")))
    order = {"main": 0, "worker": 1, "other": 2}
    return (list(devs), sorted(roles, key=lambda r: (order.get(r, 3), r)), sorted(gpus),
            steps)


def _figures(parts: Sequence[dict[str, Any]], keys: Sequence[str],
             merged: Sequence[bool]) -> dict[str, Figure]:
    """``keys`` of each interval's ``parts`` entry (an empty one: the interval has none),
    with a bucket's own extremes (``KEY_min``, ``KEY_max``)."""
    out = {}
    none = (None,) * len(parts)
    buckets = [p if m else {} for p, m in zip(parts, merged, strict=True)]
    for key in keys:
        out[key] = Figure(_column(parts, key),
                          _column(buckets, key + "_min") if any(buckets) else none,
                          _column(buckets, key + "_max") if any(buckets) else none)
    return out


def _column(parts: Sequence[dict[str, Any]], key: str) -> tuple[float | None, ...]:
    """:func:`figure` of ``key`` of each of ``parts`` (NOTE [hot path]: a week's report
    reads 40 of these over 6,049 buckets; a finite float, the most of them, is taken as
    it is, with no call)."""
    return tuple((v if type(v := p.get(key)) is float and -math.inf < v < math.inf
                  else figure(v)) if p else None for p in parts)


def _gpu(rec: dict[str, Any], index: int) -> dict[str, Any]:
    g = rec.get("gpu")
    if isinstance(g, list):
        for e in g:
            if isinstance(e, dict) and e.get("index", 0) == index:
                return e
    return {}


def _busy(recs: Sequence[dict[str, Any]]) -> Figure:
    value: list[float | None] = []
    for r in recs:
        cpu = _d(r.get("cpu"))
        idle = figure(cpu.get("idle"))
        value.append(None if not cpu or idle is None
                     else max(0.0, 100.0 - idle - (figure(cpu.get("iowait")) or 0.0)))
    none = (None,) * len(value)
    return Figure(tuple(value), none, none)


def _train(recs: Sequence[dict[str, Any]]) -> dict[str, Figure]:
    out = {}
    timed = []
    for r in recs:
        t = _d(r.get("train"))
        timed.append(t if figure(_d(t.get("step")).get("count")) else {})
    none = (None,) * len(recs)
    for name in TRAIN:
        part, key = name.split(".")
        out[name] = Figure(tuple(figure(_d(t.get(part)).get(key)) if t else None
                                 for t in timed), none, none)
    return out


def _clock0(recs: Sequence[dict[str, Any]]) -> float | None:
    for r in recs:
        t, el = figure(r.get("t")), figure(r.get("elapsed_s"))
        if t is not None and el is not None:
            return t - el
    return None
