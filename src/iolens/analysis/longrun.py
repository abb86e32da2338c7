"""Long runs: their interval records folded into time buckets, read in parallel.

A week at a 1 s interval is 604,800 records, over a gigabyte of JSON lines:
as Python dicts it would take gigabytes of memory and minutes to judge. So
above LONG_RUN_RECORDS the records are read in parallel byte ranges, each
folded as it is parsed into buckets of BUCKET_S seconds (chosen to give about
TARGET_BUCKETS of them), and only the buckets are kept.

A bucket is a record of the same shape as the recorder's (so the verdict,
the reports and the charts read it unchanged) with ``merged``, the number of
intervals in it, and:

- rates, utilization and CPU shares: time-weighted means over its intervals,
  awaits weighted by their I/O counts as iostat would over the whole span;
- counts and sums (batches, epochs, data wait and step seconds): summed;
  maxima kept; a bucket's p50 and p95 are the count-weighted means of its
  intervals' (an approximation, said so in the report);
- ``<figure>_min`` and ``<figure>_max`` beside the figures the charts draw
  (device %util, awaits, MB/s, queue; CPU by role; GPU utilization), so a
  one-interval spike is still seen in a week-long chart;
- memory figures: the bucket's last.
"""

# ruff: noqa: PLR1730 - NOTE [hot path]: comparisons, not min()/max() calls, in the fold

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from iolens.rundir import SCHEMA_VERSION

LONG_RUN_RECORDS = 50_000
"""More records than this (14 hours at 1 s) are read as buckets."""
TARGET_BUCKETS = 10_000
"""About this many buckets per run: enough for any chart or verdict window."""

_DEV_MEAN = ("util", "r_s", "rkB_s", "rrqm_s", "w_s", "wkB_s", "wrqm_s", "d_s", "f_s", "aqu_sz")
_DEV_EXT = ("util", "r_await", "w_await", "rkB_s", "wkB_s", "aqu_sz")
_ROLE_MEAN = ("cpu_pct", "read_bytes_s", "write_bytes_s", "rchar_s", "wchar_s")
_ROLE_EXT = ("cpu_pct", "read_bytes_s")
_CPU = ("user", "system", "iowait", "idle", "steal")


# -- what a record may hold ---------------------------------------------------------------
# NOTE [record shape]: the verdict, the reports and the fold below do arithmetic on a
# record's figures without checking each one, so a line that parses as JSON but is not a
# record of ours (another tool's log, a hand edit, a number as a string, NaN, a negative
# rate) is refused whole, with its reason, before anything reads it. Keys this version does
# not know in the job, train and GPU objects are left alone, so that records of a newer
# schema still read; the maps of figures (a device's, a role's, CPU, memory) hold nothing
# but figures.
_TOO_BIG = 1 << 64
"""No counter or figure the recorder writes comes near this (18 EB/s, 5e17 years): larger is
garbage. Floats too: orjson reads an int beyond 64 bits as a float."""
_FIGURES = ("devices", "cpu", "mem")
"""Sections whose every value is a figure (per device: a map of figures)."""
_JOB_FIGURES = frozenset({"pids", "cpu_pct", "read_bytes_s", "write_bytes_s", "rchar_s",
                          "wchar_s", "cache_hit", "run_delay_pct"})
_TRAIN_FIGURES = frozenset({"batches", "epochs_started", "data_wait_share", "num_workers",
                            "world_size"})
_TRAIN_MAPS = ("data_wait", "step", "epoch_start_wait", "epoch_start_step", "pause_wait",
               "pause_step")
_GPU_FIGURES = frozenset({"index", "util_pct", "mem_util_pct", "mem_used_bytes",
                          "mem_total_bytes"})
_GPU_LISTS = frozenset({"pids", "proc_mem_bytes", "job_pids"})


def _not_figure(v: Any) -> bool:
    """True unless ``v`` is None or a finite, non-negative number (a bool is not one)."""
    if v is None:
        return False
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return not 0 <= v < _TOO_BIG  # NaN fails too
    return True


_FLAGS = frozenset({"io_readable", "in_process"})
"""Keys the recorder writes as true/false among figures (a role's /proc/<pid>/io that
could not be read)."""


def _bad_map(d: Any, where: str) -> str | None:
    """Why ``d`` is not a map of figures (and flags), or None when it is one."""
    if not isinstance(d, dict):
        return f"{where} is not an object"
    for k, v in d.items():
        if k in _FLAGS and isinstance(v, bool):
            continue
        if _not_figure(v):
            return f"{where}.{k} is {_show(v)}"
    return None


def _show(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def record_problem(rec: Any) -> str | None:
    """Why ``rec`` (a parsed JSON line) cannot be read as an interval record; None if it can.

    See NOTE [record shape].
    """
    if not isinstance(rec, dict):
        return f"not a JSON object ({type(rec).__name__})"
    if "elapsed_s" not in rec:
        return "no elapsed_s (not an iolens record)"
    if rec["elapsed_s"] is None:  # every interval has an end; records are ordered by it
        return "elapsed_s is None"
    for key in ("elapsed_s", "interval_s", "seq", "t", "merged"):
        if _not_figure(rec.get(key)):
            return f"{key} is {_show(rec[key])}"
    if not isinstance(rec.get("time", ""), (str, type(None))):
        return f"time is {_show(rec['time'])}"
    for key in _FIGURES:
        sec = rec.get(key)
        if sec is None:
            continue
        if not isinstance(sec, dict):
            return f"{key} is not an object"
        if key == "devices":
            for name, d in sec.items():
                if why := _bad_map(d, f"devices.{name}"):
                    return why
        elif why := _bad_map(sec, key):
            return why
    job = rec.get("job")
    if job is not None:
        if not isinstance(job, dict):
            return "job is not an object"
        for k, v in job.items():
            if v is None:
                continue
            if k == "roles":
                if not isinstance(v, dict):
                    return "job.roles is not an object"
                for role, d in v.items():
                    if why := _bad_map(d, f"job.roles.{role}"):
                        return why
            elif k == "states":
                if why := _bad_map(v, "job.states"):
                    return why
            elif k in _JOB_FIGURES and _not_figure(v):
                return f"job.{k} is {_show(v)}"
    train = rec.get("train")
    if train is not None:
        if not isinstance(train, dict):
            return "train is not an object"
        for k, v in train.items():
            if v is None:
                continue
            if k in _TRAIN_MAPS:
                if why := _bad_map(v, f"train.{k}"):
                    return why
            elif k == "pipeline":
                if not isinstance(v, dict):
                    return "train.pipeline is not an object"
                if why := _bad_map({x: y for x, y in v.items() if x != "handover"},
                                   "train.pipeline") or _bad_map(v.get("handover", {}),
                                                                 "train.pipeline.handover"):
                    return why
            elif k == "ranks":
                if not isinstance(v, dict):
                    return "train.ranks is not an object"
                for rank, d in v.items():
                    if why := _bad_map(d, f"train.ranks.{rank}"):
                        return why
            elif k == "step_source":
                if not isinstance(v, str):
                    return f"train.step_source is {_show(v)}"
            elif k == "iterable_loader":
                if not isinstance(v, bool):
                    return f"train.iterable_loader is {_show(v)}"
            elif k in _TRAIN_FIGURES and _not_figure(v):
                return f"train.{k} is {_show(v)}"
    storage = rec.get("storage")
    if storage is not None:
        if not isinstance(storage, dict):
            return "storage is not an object"
        for mount, d in storage.items():
            if why := _bad_map(d, f"storage.{mount}"):
                return why
    gpus = rec.get("gpu")
    if gpus is not None:
        if not isinstance(gpus, list):
            return "gpu is not a list"
        for i, g in enumerate(gpus):
            if not isinstance(g, dict):
                return f"gpu[{i}] is not an object"
            for k, v in g.items():
                if k == "error":
                    if not isinstance(v, str):
                        return f"gpu[{i}].error is {_show(v)}"
                elif k in _GPU_LISTS:
                    if not isinstance(v, list) or any(_not_figure(x) for x in v):
                        return f"gpu[{i}].{k} is {_show(v)}"
                elif k in _GPU_FIGURES and _not_figure(v):
                    return f"gpu[{i}].{k} is {_show(v)}"
    return None


# NOTE [known shapes]: checking every figure of a record costs about four times its
# parsing, and a week of records at 1 s is 604,800 of them. But a recorder writes the
# same shape again and again: the same keys, the same kind of value at each place, only
# the digits change. A line with its digits (and decimal points) taken out is that shape:
# a number leaves nothing behind, or its sign and exponent, which stay; a string keeps
# its quotes, true/false/null their letters. "[]" is marked first, so that an empty list
# is not the shape of a list of one number. Once a line of a shape has passed the whole
# check, another line of that shape can differ from it only in the digits of its numbers
# and of its names; so it passes too, unless one of its digit runs is 20 long (a figure
# that may reach 2**64: the whole check decides). Shapes are remembered only from records
# whose every key at the levels that ignore unknown keys is known, so that a name with
# digits added cannot stand in for a figure's name.
_DIGITS = b"0123456789."
_TO_ZERO = bytes.maketrans(b"123456789", b"000000000")
_LONG_DIGITS = b"0" * 20
_TOP_KEYS = frozenset({"time", "t", "elapsed_s", "interval_s", "seq", "merged", "schema",
                       *_FIGURES, "job", "train", "gpu", "storage"})
_JOB_KEYS = _JOB_FIGURES | {"roles", "states"}
_TRAIN_KEYS = _TRAIN_FIGURES | set(_TRAIN_MAPS) | {"ranks", "step_source", "pipeline",
                                                   "iterable_loader"}
_GPU_KEYS = _GPU_FIGURES | _GPU_LISTS | {"error"}


def _known_keys(rec: dict[str, Any]) -> bool:
    """Every key of ``rec`` where unknown keys are let through is one this version knows."""
    job, train, gpus = rec.get("job") or {}, rec.get("train") or {}, rec.get("gpu") or []
    return (rec.keys() <= _TOP_KEYS and job.keys() <= _JOB_KEYS
            and train.keys() <= _TRAIN_KEYS and all(g.keys() <= _GPU_KEYS for g in gpus))


class ShapeCheck:
    """:func:`record_problem` of a parsed line, fast for shapes seen before (NOTE
    [known shapes])."""

    LIMIT = 64
    """Shapes remembered at most: a run has a handful (a device or a GPU coming or going)."""

    __slots__ = ("known",)

    def __init__(self) -> None:
        self.known: set[bytes] = set()

    def problem(self, line: bytes, rec: Any) -> str | None:
        """Why ``rec``, parsed from ``line``, is not a record; None when it is one."""
        shape = line.replace(b"[]", b"[@]").translate(None, _DIGITS)
        if shape in self.known and _LONG_DIGITS not in line.translate(_TO_ZERO):
            return None
        why = record_problem(rec)
        if why is None and len(self.known) < self.LIMIT and _known_keys(rec):
            self.known.add(shape)
        return why


def _loads() -> Callable[[bytes], Any]:
    try:
        import orjson  # noqa: PLC0415 - optional speed-up, three times faster than json

        return orjson.loads
    except ImportError:
        import json  # noqa: PLC0415

        return json.loads


class _Ext:
    """Running minimum and maximum of several figures."""

    __slots__ = ("hi", "lo")

    def __init__(self, n: int) -> None:
        self.lo = [math.inf] * n
        self.hi = [-math.inf] * n

    def add(self, i: int, v: float) -> None:
        # Compared, not min()/max(): this runs for every figure of every interval.
        if v < self.lo[i]:
            self.lo[i] = v
        if v > self.hi[i]:
            self.hi[i] = v

    def merge(self, other: _Ext) -> None:
        self.lo = [min(a, b) for a, b in zip(self.lo, other.lo, strict=True)]
        self.hi = [max(a, b) for a, b in zip(self.hi, other.hi, strict=True)]

    def put(self, out: dict[str, Any], names: tuple[str, ...]) -> None:
        for i, name in enumerate(names):
            if self.hi[i] >= self.lo[i]:
                out[name + "_min"] = self.lo[i]
                out[name + "_max"] = self.hi[i]


@dataclass
class _Dist:
    """A data-wait or step-time distribution folded over intervals."""

    count: float = 0.0
    sum_s: float = 0.0
    max_s: float = 0.0
    p50w: float = 0.0
    p95w: float = 0.0

    def add(self, d: dict[str, Any]) -> None:
        n = float(d.get("count") or 0)
        self.count += n
        self.sum_s += float(d.get("sum_s") or 0.0)
        self.max_s = max(self.max_s, float(d.get("max_s") or 0.0))
        self.p50w += float(d.get("p50_s") or 0.0) * n
        self.p95w += float(d.get("p95_s") or 0.0) * n

    def merge(self, o: _Dist) -> None:
        self.count += o.count
        self.sum_s += o.sum_s
        self.max_s = max(self.max_s, o.max_s)
        self.p50w += o.p50w
        self.p95w += o.p95w

    def out(self) -> dict[str, float]:
        n = self.count
        return {"count": int(n), "sum_s": round(self.sum_s, 6), "max_s": round(self.max_s, 6),
                "p50_s": round(self.p50w / n, 6) if n else 0.0,
                "p95_s": round(self.p95w / n, 6) if n else 0.0}


@dataclass
class Bucket:
    """The intervals of one time bucket, folded (see the module)."""

    n: int = 0
    secs: float = 0.0
    start: float = math.inf
    end: float = -math.inf
    seq: int | None = None
    t: Any = None
    time: Any = None
    dev: dict[str, list[float]] = field(default_factory=dict)
    dev_ext: dict[str, _Ext] = field(default_factory=dict)
    job: list[float] = field(default_factory=lambda: [0.0] * 8)
    roles: dict[str, list[float]] = field(default_factory=dict)
    role_ext: dict[str, _Ext] = field(default_factory=dict)
    states: dict[str, int] = field(default_factory=dict)
    cpu: list[float] = field(default_factory=lambda: [0.0] * 6)
    mem: dict[str, Any] = field(default_factory=dict)
    batches: int = 0
    epochs: int = 0
    workers: int = 0
    wait: _Dist = field(default_factory=_Dist)
    step: _Dist = field(default_factory=_Dist)
    marks: _Dist = field(default_factory=_Dist)
    epoch_start: _Dist = field(default_factory=_Dist)
    epoch_start_step: _Dist = field(default_factory=_Dist)
    pause: _Dist = field(default_factory=_Dist)
    pause_step: _Dist = field(default_factory=_Dist)
    loader_steps: bool = False
    pipe: list[float] = field(default_factory=lambda: [0.0] * 11)
    """train.pipeline summed: batches, samples, fetch, fetch CPU, collate, idle, files,
    hand-overs and their seconds, in_process (0/1, the most) and processes (the most)."""
    iterable: bool = False
    ranks: dict[str, list[float]] = field(default_factory=dict)
    world: int = 0
    gpu: dict[int, list[float]] = field(default_factory=dict)
    gpu_ext: dict[int, _Ext] = field(default_factory=dict)
    store: dict[str, dict[str, float]] = field(default_factory=dict)
    """Per storage entry (a FUSE mount, a network peer): its figures times seconds, and
    ``_s``: the seconds they cover."""
    waiting: tuple[float, Any] | None = None
    """The latest interval's ``train.waiting_s`` and ``train.waiting`` (NOTE [no batch for
    a while] in iolens/recorder/sampler.py), where it had them: a hang at a long run's end
    is read from its last bucket."""

    def add(self, r: dict[str, Any]) -> None:
        """Fold one interval record in.

        NOTE [hot path]: this runs for every interval of a week-long run, so it
        is written out field by field with no helper calls. Figures are taken
        as the recorder writes them (numbers or null); anything else raises
        TypeError and the caller skips the record.
        """
        s = r.get("interval_s") or 0.0
        end = r.get("elapsed_s") or 0.0
        self.n += 1
        self.secs += s
        if end - s < self.start:
            self.start = end - s
        if end >= self.end:
            self.end, self.t, self.time = end, r.get("t"), r.get("time")
            tw = r.get("train") or {}
            waited = tw.get("waiting_s")
            self.waiting = (waited, tw.get("waiting")) if waited else None
        seq = r.get("seq")
        if isinstance(seq, int) and (self.seq is None or seq < self.seq):
            self.seq = seq
        st = r.get("storage")
        if st:
            for key, d in st.items():
                acc = self.store.get(key)
                if acc is None:
                    acc = self.store[key] = {"_s": 0.0}
                acc["_s"] += s
                for k, v in d.items():
                    if v is not None:
                        acc[k] = acc.get(k, 0.0) + v * s
        devs = r.get("devices")
        if devs:
            for name, d in devs.items():
                a = self.dev.get(name)
                if a is None:
                    a = self.dev[name] = [0.0] * 14
                    self.dev_ext[name] = _Ext(len(_DEV_EXT))
                g = d.get
                util = g("util") or 0.0
                r_s = g("r_s") or 0.0
                w_s = g("w_s") or 0.0
                rkb = g("rkB_s") or 0.0
                wkb = g("wkB_s") or 0.0
                r_aw = g("r_await") or 0.0
                w_aw = g("w_await") or 0.0
                aqu = g("aqu_sz") or 0.0
                a[0] += s
                a[1] += util * s
                a[2] += r_s * s
                a[3] += rkb * s
                a[4] += (g("rrqm_s") or 0.0) * s
                a[5] += w_s * s
                a[6] += wkb * s
                a[7] += (g("wrqm_s") or 0.0) * s
                a[8] += (g("d_s") or 0.0) * s
                a[9] += (g("f_s") or 0.0) * s
                a[10] += aqu * s
                a[11] += r_aw * r_s * s
                a[12] += w_aw * w_s * s
                a[13] += 1
                lo, hi = self.dev_ext[name].lo, self.dev_ext[name].hi
                for i, v in ((0, util), (1, r_aw), (2, w_aw), (3, rkb), (4, wkb), (5, aqu)):
                    if v < lo[i]:
                        lo[i] = v
                    if v > hi[i]:
                        hi[i] = v
        job = r.get("job")
        if job:
            j = self.job
            g = job.get
            j[0] += s
            j[1] += (g("cpu_pct") or 0.0) * s
            j[2] += (g("read_bytes_s") or 0.0) * s
            j[3] += (g("write_bytes_s") or 0.0) * s
            j[4] += (g("rchar_s") or 0.0) * s
            j[5] += (g("wchar_s") or 0.0) * s
            pids = g("pids") or 0
            if pids > j[6]:
                j[6] = pids
            j[7] += (g("run_delay_pct") or 0.0) * s
            states = g("states")
            if states:
                mine = self.states
                for k, v in states.items():
                    mine[k] = mine.get(k, 0) + v
            roles = g("roles")
            if roles:
                for role, d in roles.items():
                    a = self.roles.get(role)
                    if a is None:
                        a = self.roles[role] = [0.0] * 8
                        self.role_ext[role] = _Ext(len(_ROLE_EXT))
                    g = d.get
                    cpu = g("cpu_pct") or 0.0
                    rd = g("read_bytes_s") or 0.0
                    a[0] += s
                    a[1] += cpu * s
                    a[2] += rd * s
                    a[3] += (g("write_bytes_s") or 0.0) * s
                    a[4] += (g("rchar_s") or 0.0) * s
                    a[5] += (g("wchar_s") or 0.0) * s
                    pids = g("pids") or 0
                    if pids > a[6]:
                        a[6] = pids
                    a[7] += (g("run_delay_pct") or 0.0) * s
                    ext = self.role_ext[role]
                    if cpu < ext.lo[0]:
                        ext.lo[0] = cpu
                    if cpu > ext.hi[0]:
                        ext.hi[0] = cpu
                    if rd < ext.lo[1]:
                        ext.lo[1] = rd
                    if rd > ext.hi[1]:
                        ext.hi[1] = rd
        cpu_d = r.get("cpu")
        if cpu_d:
            c = self.cpu
            g = cpu_d.get
            c[0] += s
            c[1] += (g("user") or 0.0) * s
            c[2] += (g("system") or 0.0) * s
            c[3] += (g("iowait") or 0.0) * s
            c[4] += (g("idle") or 0.0) * s
            c[5] += (g("steal") or 0.0) * s
        mem = r.get("mem")
        if mem:
            self.mem = mem
        tr = r.get("train")
        if tr:
            g = tr.get
            self.batches += g("batches") or 0
            epochs = g("epochs_started") or 0
            if epochs:
                self.epochs += epochs
                nw = g("num_workers") or 0
                if nw > self.workers:
                    self.workers = nw
            src = g("step_source")
            if src == "dataloader":
                self.loader_steps = True
                self.wait.add(g("data_wait") or {})
                self.step.add(g("step") or {})
            elif src == "marks":
                self.marks.add(g("step") or {})
            esw = g("epoch_start_wait")
            if esw:
                self.epoch_start.add(esw)
            ess = g("epoch_start_step")
            if ess:
                self.epoch_start_step.add(ess)
            pw = g("pause_wait")
            if pw:
                self.pause.add(pw)
                self.pause_step.add(g("pause_step") or {})
            pl = g("pipeline")
            if pl:
                q = self.pipe
                pg = pl.get
                q[0] += pg("batches") or 0
                q[1] += pg("samples") or 0
                q[2] += pg("fetch_s") or 0.0
                q[3] += pg("fetch_cpu_s") or 0.0
                q[4] += pg("collate_s") or 0.0
                q[5] += pg("idle_s") or 0.0
                q[6] += pg("files") or 0
                h = pg("handover")
                if h:
                    q[7] += h.get("count") or 0
                    q[8] += h.get("sum_s") or 0.0
                if pg("in_process") is True:
                    q[9] = 1.0
                q[10] = max(q[10], pg("processes") or 0)
            if g("iterable_loader") is True:
                self.iterable = True
            ranks = g("ranks")
            if ranks:
                for rank, d in ranks.items():
                    a = self.ranks.get(rank)
                    if a is None:
                        a = self.ranks[rank] = [0.0, 0.0, 0.0, d.get("pid") or 0]
                    a[0] += d.get("batches") or 0
                    a[1] += d.get("data_wait_s") or 0.0
                    a[2] += d.get("step_s") or 0.0
                self.world = max(self.world, g("world_size") or 0)
        gpus = r.get("gpu")
        if gpus:
            for gd in gpus:
                util = gd.get("util_pct")
                if util is None:
                    continue
                idx = gd.get("index") or 0
                a = self.gpu.get(idx)
                if a is None:
                    a = self.gpu[idx] = [0.0] * 5
                    self.gpu_ext[idx] = _Ext(1)
                a[0] += s
                a[1] += util * s
                a[2] += (gd.get("mem_util_pct") or 0.0) * s
                used = gd.get("mem_used_bytes") or 0
                if used > a[3]:
                    a[3] = used
                total = gd.get("mem_total_bytes") or 0
                if total > a[4]:
                    a[4] = total
                self.gpu_ext[idx].add(0, util)

    def merge(self, o: Bucket) -> None:
        self.n += o.n
        self.secs += o.secs
        self.start = min(self.start, o.start)
        if o.end >= self.end:
            self.end, self.t, self.time = o.end, o.t, o.time
            self.waiting = o.waiting
            if o.mem:
                self.mem = o.mem
        elif not self.mem:
            self.mem = o.mem
        if o.seq is not None and (self.seq is None or o.seq < self.seq):
            self.seq = o.seq
        for name, a in o.dev.items():
            if name in self.dev:
                self.dev[name] = [x + y for x, y in zip(self.dev[name], a, strict=True)]
                self.dev_ext[name].merge(o.dev_ext[name])
            else:
                self.dev[name], self.dev_ext[name] = a, o.dev_ext[name]
        self.job = [x + y for x, y in zip(self.job[:6], o.job[:6], strict=True)] + [
            max(self.job[6], o.job[6]), self.job[7] + o.job[7]]
        for k, v in o.states.items():
            self.states[k] = self.states.get(k, 0) + v
        for role, a in o.roles.items():
            if role in self.roles:
                mine = self.roles[role]
                self.roles[role] = [x + y for x, y in zip(mine[:6], a[:6], strict=True)] + [
                    max(mine[6], a[6]), mine[7] + a[7]]
                self.role_ext[role].merge(o.role_ext[role])
            else:
                self.roles[role], self.role_ext[role] = a, o.role_ext[role]
        self.cpu = [x + y for x, y in zip(self.cpu, o.cpu, strict=True)]
        self.batches += o.batches
        self.epochs += o.epochs
        self.workers = max(self.workers, o.workers)
        self.loader_steps |= o.loader_steps
        self.pipe = [x + y for x, y in zip(self.pipe[:9], o.pipe[:9], strict=True)] + [
            max(self.pipe[9], o.pipe[9]), max(self.pipe[10], o.pipe[10])]
        self.iterable |= o.iterable
        for acc, other in ((self.wait, o.wait), (self.step, o.step), (self.marks, o.marks),
                           (self.epoch_start, o.epoch_start),
                           (self.epoch_start_step, o.epoch_start_step),
                           (self.pause, o.pause), (self.pause_step, o.pause_step)):
            acc.merge(other)
        for rank, a in o.ranks.items():
            have = self.ranks.get(rank)
            if have is None:
                self.ranks[rank] = a
            else:
                self.ranks[rank] = [have[0] + a[0], have[1] + a[1], have[2] + a[2], have[3]]
        self.world = max(self.world, o.world)
        for key, fig in o.store.items():
            sums = self.store.setdefault(key, {})
            for k, x in fig.items():
                sums[k] = sums.get(k, 0.0) + x
        for idx, a in o.gpu.items():
            if idx in self.gpu:
                m = self.gpu[idx]
                self.gpu[idx] = [m[0] + a[0], m[1] + a[1], m[2] + a[2], max(m[3], a[3]),
                                 max(m[4], a[4])]
                self.gpu_ext[idx].merge(o.gpu_ext[idx])
            else:
                self.gpu[idx], self.gpu_ext[idx] = a, o.gpu_ext[idx]

    def record(self) -> dict[str, Any]:
        """The bucket as a record of the recorder's shape (see the module)."""
        devices: dict[str, Any] = {}
        for name, a in self.dev.items():
            secs = a[0] or 1.0
            d: dict[str, Any] = {k: a[i] / secs for i, k in enumerate(_DEV_MEAN, 1)}
            r_ios, w_ios = a[2], a[5]
            d["r_await"] = a[11] / r_ios if r_ios else 0.0
            d["w_await"] = a[12] / w_ios if w_ios else 0.0
            d["rareq_sz"] = a[3] / a[2] if a[2] else 0.0
            d["wareq_sz"] = a[6] / a[5] if a[5] else 0.0
            self.dev_ext[name].put(d, _DEV_EXT)
            devices[name] = d
        rec: dict[str, Any] = {
            "schema": SCHEMA_VERSION, "merged": self.n, "seq": self.seq, "t": self.t,
            "time": self.time, "elapsed_s": round(self.end, 3),
            "interval_s": round(self.secs, 4), "devices": devices,
        }
        if self.job[0]:
            secs = self.job[0]
            job: dict[str, Any] = {k: round(self.job[i] / secs, 2)
                                   for i, k in enumerate(_ROLE_MEAN, 1)}
            job["pids"] = int(self.job[6])
            job["run_delay_pct"] = round(self.job[7] / secs, 2)
            job["cache_hit"] = _hit(job)
            job["states"] = dict(self.states)
            roles: dict[str, Any] = {}
            for role, a in self.roles.items():
                rs = a[0] or 1.0
                rd: dict[str, Any] = {k: round(a[i] / rs, 2)
                                      for i, k in enumerate(_ROLE_MEAN, 1)}
                rd["pids"] = int(a[6])
                rd["run_delay_pct"] = round(a[7] / rs, 2)
                rd["cache_hit"] = _hit(rd)
                self.role_ext[role].put(rd, _ROLE_EXT)
                roles[role] = rd
            job["roles"] = roles
            rec["job"] = job
        else:
            rec["job"] = {}
        if self.cpu[0]:
            rec["cpu"] = {k: round(self.cpu[i] / self.cpu[0], 2) for i, k in enumerate(_CPU, 1)}
        else:
            rec["cpu"] = {}
        rec["mem"] = self.mem
        train: dict[str, Any] = {"batches": self.batches, "epochs_started": self.epochs}
        if self.loader_steps:
            train.update(data_wait=self.wait.out(), step=self.step.out(),
                         step_source="dataloader")
            train["data_wait_share"] = (self.wait.sum_s / self.step.sum_s
                                        if self.step.sum_s > 0 else None)
        elif self.marks.count:
            train.update(data_wait=_Dist().out(), step=self.marks.out(), step_source="marks",
                         data_wait_share=None)
        else:
            train.update(data_wait=_Dist().out(), step=_Dist().out(), step_source=None,
                         data_wait_share=None)
        if self.epoch_start.count:
            train["epoch_start_wait"] = self.epoch_start.out()
        if self.epoch_start_step.count:
            train["epoch_start_step"] = self.epoch_start_step.out()
        if self.pause.count:
            train["pause_wait"] = self.pause.out()
            train["pause_step"] = self.pause_step.out()
        if self.epochs:
            train["num_workers"] = self.workers
        q = self.pipe
        if q[0]:
            train["pipeline"] = {
                "batches": int(q[0]), "samples": int(q[1]), "fetch_s": q[2],
                "fetch_cpu_s": q[3], "collate_s": q[4], "idle_s": q[5], "files": int(q[6]),
                "in_process": bool(q[9]), "processes": int(q[10]),
                "handover": {"count": int(q[7]), "sum_s": q[8]}}
        if self.iterable:
            train["iterable_loader"] = True
        if self.waiting is not None:
            train["waiting_s"] = self.waiting[0]
            if self.waiting[1]:
                train["waiting"] = self.waiting[1]
        if self.ranks:
            train["ranks"] = {rank: {"pid": int(a[3]), "batches": int(a[0]),
                                     "data_wait_s": a[1], "step_s": a[2]}
                              for rank, a in self.ranks.items()}
            train["world_size"] = self.world
        rec["train"] = train
        if self.store:
            rec["storage"] = {key: {k: v / (d.get("_s") or 1.0) for k, v in d.items()
                                    if k != "_s"} for key, d in self.store.items()}
        if self.gpu:
            gpus = []
            for idx, a in sorted(self.gpu.items()):
                secs = a[0] or 1.0
                g: dict[str, Any] = {"index": idx, "util_pct": round(a[1] / secs, 2),
                                     "mem_util_pct": round(a[2] / secs, 2),
                                     "mem_used_bytes": int(a[3]), "mem_total_bytes": int(a[4])}
                self.gpu_ext[idx].put(g, ("util_pct",))
                gpus.append(g)
            rec["gpu"] = gpus
        return rec


def _hit(d: dict[str, Any]) -> float | None:
    rchar = float(d.get("rchar_s") or 0.0)
    if rchar <= 0:
        return None
    return round(max(0.0, min(1.0, 1 - float(d.get("read_bytes_s") or 0.0) / rchar)), 4)


@dataclass
class Skipped:
    """Lines of records.jsonl left out, counted by why."""

    counts: dict[str, int] = field(default_factory=dict)
    """Lines skipped, by kind: ``not JSON``, ``not an iolens record``, ``with a bad figure``,
    ``duplicate``."""
    first_at: str = ""
    """Where the first was, e.g. ``line 7`` (``byte 4096`` on the long-run path)."""
    first_why: str = ""
    """Why the first was skipped, e.g. ``devices.vda.util is -1.0``."""

    @property
    def total(self) -> int:
        """All lines skipped."""
        return sum(self.counts.values())

    def add(self, kind: str, where: str, why: str = "") -> None:
        """Count one skipped line."""
        self.counts[kind] = self.counts.get(kind, 0) + 1
        if not self.first_at:
            self.first_at, self.first_why = where, why or kind

    def add_problem(self, where: str, why: str) -> None:
        """Count a line that :func:`record_problem` refused."""
        kind = ("not an iolens record" if why.startswith(("not a JSON object", "no elapsed_s"))
                else "with a bad figure")
        self.add(kind, where, why)

    def merge(self, other: Skipped) -> None:
        """Add another range's counts (``other`` comes later in the file)."""
        for kind, n in other.counts.items():
            self.counts[kind] = self.counts.get(kind, 0) + n
        if not self.first_at:
            self.first_at, self.first_why = other.first_at, other.first_why

    def note(self, name: str) -> str | None:
        """The report's note, or None when nothing was skipped."""
        if not self.counts:
            return None
        kinds = ", ".join(f"{n} {kind}" for kind, n in sorted(self.counts.items()))
        return (f"{self.total} line(s) of {name} were not valid records and were skipped "
                f"(the first at {self.first_at}): {kinds}; {self.first_at}: {self.first_why}")


@dataclass
class ChunkResult:
    """What one byte range of records.jsonl folded into."""

    buckets: dict[int, Bucket]
    lines: int = 0
    newer: int = 0
    skipped: Skipped = field(default_factory=Skipped)

    @property
    def bad(self) -> int:
        """Lines skipped."""
        return self.skipped.total


def _fold_range(path: str, start: int, stop: int, bucket_s: float) -> ChunkResult:
    """Fold the whole lines that begin in [start, stop) of ``path`` into buckets."""
    loads = _loads()
    out = ChunkResult({})
    buckets = out.buckets
    seen: set[tuple[int, float]] = set()
    check = ShapeCheck()
    with open(path, "rb") as fh:
        if start:
            fh.seek(start - 1)
            fh.readline()  # the line under way at ``start`` belongs to the range before
        pos = fh.tell()
        while pos < stop:
            where = f"byte {pos}"  # line numbers are not known inside a byte range
            line = fh.readline()
            if not line:
                break
            pos += len(line)
            if not line.strip():
                continue
            out.lines += 1
            try:
                rec = loads(line)
            except ValueError as exc:  # orjson.JSONDecodeError is one
                out.skipped.add("not JSON", where, str(exc)[:80])
                continue
            why = check.problem(line, rec)
            if why is not None:
                out.skipped.add_problem(where, why)
                continue
            if is_duplicate(rec, seen):
                out.skipped.add("duplicate", where, f"seq {rec['seq']} again")
                continue
            schema = rec.get("schema", SCHEMA_VERSION)
            if isinstance(schema, int) and schema > SCHEMA_VERSION:
                out.newer += 1
            idx = int(float(rec.get("elapsed_s") or 0.0) // bucket_s)
            b = buckets.get(idx)
            if b is None:
                b = buckets[idx] = Bucket()
            b.add(rec)
    return out


def is_duplicate(rec: dict[str, Any], seen: set[tuple[int, float]]) -> bool:
    """True when an interval of the same seq and end was seen before (a line written twice).

    Records without a seq are never called duplicates.
    """
    seq = rec.get("seq")
    if not isinstance(seq, int):
        return False
    key = (seq, float(rec.get("elapsed_s") or 0.0))
    if key in seen:
        return True
    seen.add(key)
    return False


def estimate_records(path: str) -> tuple[int, float]:
    """(about how many lines records.jsonl holds, the elapsed seconds of its last record)."""
    loads = _loads()
    size = os.path.getsize(path)
    if size == 0:
        return 0, 0.0
    with open(path, "rb") as fh:
        head = fh.read(1 << 16)
        lines = head.count(b"\n") or 1
        estimate = int(size / (len(head) / lines)) if len(head) < size else lines
        fh.seek(max(0, size - (1 << 16)))
        tail = fh.read().splitlines()
    last = 0.0
    for line in reversed(tail):
        try:
            rec = loads(line)
        except ValueError:
            continue
        if record_problem(rec) is None:  # a finite, non-negative elapsed_s
            last = float(rec["elapsed_s"] or 0.0)
            break
    return estimate, last


def fold_records(path: str, bucket_s: float, jobs: int | None = None) -> ChunkResult:
    """Every record of ``path`` folded into buckets of ``bucket_s``, in ``jobs`` processes."""
    size = os.path.getsize(path)
    if jobs is None:  # a process per core, each with 8 MiB of records at least
        jobs = min(os.cpu_count() or 1, 16, size // (8 << 20) + 1)
    jobs = max(1, jobs)
    bounds = [size * i // jobs for i in range(jobs + 1)]
    if jobs == 1:
        parts = [_fold_range(path, 0, size, bucket_s)]
    else:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            parts = list(pool.map(_fold_range, [path] * jobs, bounds[:-1], bounds[1:],
                                  [bucket_s] * jobs))
    total = ChunkResult({})
    for part in parts:
        total.lines += part.lines
        total.skipped.merge(part.skipped)
        total.newer += part.newer
        for idx, b in part.buckets.items():
            mine = total.buckets.get(idx)
            if mine is None:
                total.buckets[idx] = b
            else:
                mine.merge(b)
    return total


def bucket_seconds(span_s: float, interval_s: float | None, target: int | None = None) -> float:
    """A bucket length giving about ``target`` (TARGET_BUCKETS) buckets, whole intervals."""
    target = target or TARGET_BUCKETS
    step = interval_s if interval_s and interval_s > 0 else 1.0
    return max(step, math.ceil(span_s / target / step) * step)


def bucket_records(result: ChunkResult) -> Iterator[dict[str, Any]]:
    """The buckets as records, in time order."""
    for idx in sorted(result.buckets):
        yield result.buckets[idx].record()
