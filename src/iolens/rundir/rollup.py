"""Time buckets of interval records, and the rollups the recorder writes of them.

NOTE [rollups]: a week at a 1 s interval is 604,800 records, over a gigabyte of
JSON lines; a report of it would parse every one. So the run directory also holds
rollups, one file per slot length of ROLLUP_LEVELS (``rollups-10s.jsonl``,
``rollups-30s.jsonl`` ... ``rollups-1000s.jsonl``): as each record is appended to
records.jsonl, it is folded into the bucket of its slot at each length (by
``elapsed_s``), and when a record of another slot comes, that bucket's whole state
goes out as one line, with the bucket as a record (NOTE [a slot's record]), saying
which bytes of records.jsonl it holds (``from``, ``to``: each line begins where the one
before it ended), the CRC-32 of its last record's line and, last, that of the line
itself (``check``). A long run's report picks the longest slots that make about half
its buckets or more, reads their lines as its buckets (whole slots each: at most 2
lines a bucket, and 16,700 lines, for runs of up to 170 days; where a bucket is one
slot, its record as it stands) and folds only the records past the last line's
``to`` (those of a run still recording, or written after the recorder stopped
writing rollups).
records.jsonl stays the source of truth: rollups that do not match it (a shorter
file, another line where the last one ended) are not used, and a damaged line
(one whose ``check`` fails, or that does not parse) ends what is used of them.

A bucket is a record of the same shape as the recorder's (so the verdict, the
reports and the charts read it unchanged) with ``merged``, the number of
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

Pure: it imports nothing of iolens but the schema's version.
"""

# ruff: noqa: PLR1730 - NOTE [hot path]: comparisons, not min()/max() calls, in the fold

from __future__ import annotations

import json
import math
import os
import zlib
from dataclasses import dataclass, field
from typing import Any

from iolens.rundir.schema import SCHEMA_VERSION

ROLLUP_LEVELS = (10.0, 30.0, 100.0, 300.0, 1000.0)
"""The slot lengths the rollups are written at, in seconds of run time (``elapsed_s``): a
factor of at most 3.34 apart, so that the longest slot of twice the natural bucket or less
is over 0.6 of it and a bucket is 1 or 2 slots, for runs of up to 170 days (a natural
bucket of 1,500 s: 1000 s slots)."""
ROLLUP_VERSION = 3


def rollups_file(slot_s: float) -> str:
    """The name of the rollups of ``slot_s``-second slots in the run directory."""
    return f"rollups-{slot_s:g}s.jsonl"

_DEV_EXT = ("util", "r_await", "w_await", "rkB_s", "wkB_s", "aqu_sz")
_ROLE_MEAN = ("cpu_pct", "read_bytes_s", "write_bytes_s", "rchar_s", "wchar_s")
_ROLE_EXT = ("cpu_pct", "read_bytes_s")
_CPU = ("user", "system", "iowait", "idle", "steal")


def _ext_names(names: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    return tuple((f"{name}_min", f"{name}_max") for name in names)


_DEV_EXT_NAMES, _ROLE_EXT_NAMES = _ext_names(_DEV_EXT), _ext_names(_ROLE_EXT)
_GPU_EXT_NAMES = _ext_names(("util_pct",))


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

    def pair(self) -> list[list[float | None]]:
        """[minima, maxima] as JSON (None: no figure yet)."""
        return [[None if math.isinf(x) else x for x in self.lo],
                [None if math.isinf(x) else x for x in self.hi]]

    def put(self, out: dict[str, Any], names: tuple[tuple[str, str], ...]) -> None:
        """Each figure's ``<name>_min`` and ``<name>_max`` (``names``: _ext_names's) into
        ``out``, where it has one."""
        for lo, hi, (lo_name, hi_name) in zip(self.lo, self.hi, names, strict=True):
            if hi >= lo:
                out[lo_name] = lo
                out[hi_name] = hi


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

    def state(self) -> list[float]:
        return [self.count, self.sum_s, self.max_s, self.p50w, self.p95w]

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
                        a = self.roles[role] = [0.0] * 10
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
                    blocked = g("blocked")
                    if blocked is not None:  # (records from before it was kept lack it)
                        a[8] += g("samples") or pids  # (a bucket's own record has both)
                        a[9] += blocked
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
                    max(mine[6], a[6]), mine[7] + a[7], mine[8] + a[8], mine[9] + a[9]]
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

    def state(self) -> dict[str, Any]:
        """What :meth:`merge` needs of this bucket, as JSON (NOTE [rollups]); read back by
        :meth:`from_state`."""
        return {
            "n": self.n, "secs": self.secs, "start": self.start, "end": self.end,
            "seq": self.seq, "t": self.t, "time": self.time, "dev": self.dev,
            "dev_ext": {k: e.pair() for k, e in self.dev_ext.items()}, "job": self.job,
            "roles": self.roles, "role_ext": {k: e.pair() for k, e in self.role_ext.items()},
            "states": self.states, "cpu": self.cpu, "mem": self.mem, "batches": self.batches,
            "epochs": self.epochs, "workers": self.workers,
            "dists": [d.state() for d in self._dists()], "loader_steps": self.loader_steps,
            "pipe": self.pipe, "iterable": self.iterable, "ranks": self.ranks,
            "world": self.world, "gpu": {str(k): v for k, v in self.gpu.items()},
            "gpu_ext": {str(k): e.pair() for k, e in self.gpu_ext.items()},
            "store": self.store, "waiting": list(self.waiting) if self.waiting else None,
        }

    @classmethod
    def from_state(cls, d: Any) -> Bucket:
        """The bucket :meth:`state` wrote; ValueError when ``d`` is not one (a damaged or
        foreign line), so that nothing of another shape reaches :meth:`merge`.

        NOTE [hot path]: a week's report reads 6,049 of these; each field is set here, with
        no defaults made first (a field added to the class must be read here too: the test
        of the round trip compares every field)."""
        if not isinstance(d, dict):
            raise ValueError("not an object")
        b = cls.__new__(cls)
        b.n = _count(d["n"])
        if not b.n:
            raise ValueError("an empty bucket")
        b.secs, b.start, b.end = _num(d["secs"]), _num(d["start"]), _num(d["end"])
        seq = d["seq"]
        b.seq = None if seq is None else _count(seq)
        b.t, b.time = _scalar(d["t"]), _scalar(d["time"])
        b.dev = _rows(d["dev"], 14)
        b.dev_ext = _exts(d["dev_ext"], b.dev, len(_DEV_EXT))
        b.job = _nums(d["job"], 8)
        b.roles = _rows(d["roles"], 10)
        b.role_ext = _exts(d["role_ext"], b.roles, len(_ROLE_EXT))
        b.states = {_key(k): _count(v) for k, v in _obj(d["states"]).items()}
        b.cpu = _nums(d["cpu"], 6)
        b.mem = _obj(d["mem"])
        b.batches, b.epochs, b.workers = _count(d["batches"]), _count(d["epochs"]), _count(
            d["workers"])
        dists = d["dists"]
        if type(dists) is not list or len(dists) != _N_DISTS:
            raise ValueError("dists")
        (b.wait, b.step, b.marks, b.epoch_start, b.epoch_start_step, b.pause,
         b.pause_step) = [_Dist(*_nums(given, 5)) for given in dists]
        b.loader_steps, b.iterable = _flag(d["loader_steps"]), _flag(d["iterable"])
        b.pipe = _nums(d["pipe"], 11)
        b.ranks = _rows(d["ranks"], 4)
        b.world = _count(d["world"])
        gpu = _rows(d["gpu"], 5)
        b.gpu = {_count(int(k)): v for k, v in gpu.items()}
        b.gpu_ext = {int(k): e for k, e in _exts(d["gpu_ext"], gpu, 1).items()}
        b.store = {_key(k): {_key(f): _num(x) for f, x in _obj(v).items()}
                   for k, v in _obj(d["store"]).items()}
        waiting = d["waiting"]
        b.waiting = None
        if waiting is not None:
            if not isinstance(waiting, list) or len(waiting) != 2:
                raise ValueError("waiting")
            b.waiting = (_num(waiting[0]), waiting[1])
        return b

    def _dists(self) -> tuple[_Dist, ...]:
        return (self.wait, self.step, self.marks, self.epoch_start, self.epoch_start_step,
                self.pause, self.pause_step)

    def record(self) -> dict[str, Any]:
        """The bucket as a record of the recorder's shape (see the module)."""
        devices: dict[str, Any] = {}
        for name, a in self.dev.items():
            secs = a[0] or 1.0
            r_ios, rkb, w_ios, wkb = a[2], a[3], a[5], a[6]
            d: dict[str, Any] = {  # the means, then the awaits and request sizes
                "util": a[1] / secs, "r_s": r_ios / secs, "rkB_s": rkb / secs,
                "rrqm_s": a[4] / secs, "w_s": w_ios / secs, "wkB_s": wkb / secs,
                "wrqm_s": a[7] / secs, "d_s": a[8] / secs, "f_s": a[9] / secs,
                "aqu_sz": a[10] / secs,
                "r_await": a[11] / r_ios if r_ios else 0.0,
                "w_await": a[12] / w_ios if w_ios else 0.0,
                "rareq_sz": rkb / r_ios if r_ios else 0.0,
                "wareq_sz": wkb / w_ios if w_ios else 0.0}
            self.dev_ext[name].put(d, _DEV_EXT_NAMES)
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
                if a[8]:  # its process samples where the records kept them, and in state D
                    rd["samples"], rd["blocked"] = int(a[8]), int(a[9])
                rd["cache_hit"] = _hit(rd)
                self.role_ext[role].put(rd, _ROLE_EXT_NAMES)
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
                self.gpu_ext[idx].put(g, _GPU_EXT_NAMES)
                gpus.append(g)
            rec["gpu"] = gpus
        return rec


_N_DISTS = len(Bucket()._dists())


def _hit(d: dict[str, Any]) -> float | None:
    rchar = float(d.get("rchar_s") or 0.0)
    if rchar <= 0:
        return None
    return round(max(0.0, min(1.0, 1 - float(d.get("read_bytes_s") or 0.0) / rchar)), 4)



# -- reading a bucket's state back: each figure what merge() expects, or ValueError ------

def _num(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ValueError(f"not a figure: {v!r}")
    return v


def _count(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError(f"not a count: {v!r}")
    return v


def _flag(v: Any) -> bool:
    if not isinstance(v, bool):
        raise ValueError(f"not a flag: {v!r}")
    return v


def _key(v: Any) -> str:
    if not isinstance(v, str):
        raise ValueError(f"not a name: {v!r}")
    return v


def _scalar(v: Any) -> Any:
    if v is not None and not isinstance(v, (str, int, float)):
        raise ValueError(f"not a scalar: {v!r}")
    return v


def _obj(v: Any) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise ValueError("not an object")
    return v


_NUMBERS = frozenset((int, float))
_EXTREMES = frozenset((int, float, type(None)))


def _nums(v: Any, n: int) -> list[float]:
    """``v`` when it is a list of ``n`` numbers. (Both parsers refuse NaN and Infinity, so a
    number here is finite: the check is of types alone, for the week's 600,000 figures.)"""
    if type(v) is not list or len(v) != n or not _NUMBERS.issuperset(map(type, v)):
        raise ValueError(f"not {n} figures")
    return v


def _rows(v: Any, n: int) -> dict[str, list[float]]:
    return {_key(k): _nums(row, n) for k, row in _obj(v).items()}


def _exts(v: Any, rows: dict[str, Any], n: int) -> dict[str, _Ext]:
    """The minima and maxima of each row of ``rows``: one pair of ``n`` numbers or None (no
    figure yet) for each, no other."""
    v = _obj(v)
    if v.keys() != rows.keys():
        raise ValueError("extremes for other rows")
    out = {}
    for k, pair in v.items():
        if type(pair) is not list or len(pair) != 2:
            raise ValueError("not a pair")
        lo, hi = pair
        if (type(lo) is not list or type(hi) is not list or len(lo) != n or len(hi) != n
                or not _EXTREMES.issuperset(map(type, lo + hi))):
            raise ValueError(f"not {n} extremes")
        e = out[k] = _Ext.__new__(_Ext)
        e.lo = [math.inf if x is None else x for x in lo] if None in lo else lo
        e.hi = [-math.inf if x is None else x for x in hi] if None in hi else hi
    return out


def loads() -> Any:
    """A JSON parser of bytes that refuses NaN and Infinity: orjson where installed (three
    times faster), else the standard one."""
    try:
        import orjson  # noqa: PLC0415 - optional speed-up

        return orjson.loads
    except ImportError:
        def parse(data: bytes | str) -> Any:
            return json.loads(data, parse_constant=_no_constant)

        return parse


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


# -- the rollups (NOTE [rollups]) ----------------------------------------------------------

class Rollups:
    """Folds each record appended to records.jsonl into the bucket of its ``slot_s``-second
    slot; the line of a slot comes out when a record of another slot arrives, or at
    :meth:`line`."""

    def __init__(self, slot_s: float) -> None:
        self.slot_s = slot_s
        self.bucket: Bucket | None = None
        self.slot = 0
        self.begin = 0
        """Where the slot's first record's line begins in records.jsonl."""
        self.to = 0
        self.crc = 0

    def add(self, rec: dict[str, Any], line: bytes, end: int) -> bytes | None:
        """Fold ``rec``, written as ``line`` (its newline too), which ends at byte ``end``
        of records.jsonl; returns the line of the slot it closed, if it closed one.

        ``rec`` is the record as records.jsonl holds it (parsed back from ``line``): the
        report folds what the file holds, so this folds the same."""
        slot = int(float(rec.get("elapsed_s") or 0.0) // self.slot_s)
        out = None
        if self.bucket is not None and slot != self.slot:
            out = self.line()
        if self.bucket is None:
            self.bucket, self.slot, self.begin = Bucket(), slot, end - len(line)
        self.bucket.add(rec)
        self.to, self.crc = end, zlib.crc32(line)
        return out

    def line(self) -> bytes | None:
        """The line of the slot being folded (None when there is none), which ends it."""
        b, self.bucket = self.bucket, None
        if b is None:
            return None
        state = json.dumps(b.state(), separators=(",", ":"), allow_nan=False)
        head = {"rollup": ROLLUP_VERSION, "slot_s": self.slot_s, "slot": self.slot,
                "from": self.begin, "to": self.to, "crc": self.crc, "bucket_len": len(state)}
        parts = [json.dumps(head, separators=(",", ":"))[:-1], _STATE.decode(), state]
        if self.slot < MADE_SLOTS:  # NOTE [a slot's record]
            parts += [_RECORD.decode(),
                      json.dumps(b.record(), separators=(",", ":"), allow_nan=False)]
        body = "".join(parts).encode()  # (ASCII: lengths in bytes)
        return body + b'%s%d}\n' % (_CHECK, zlib.crc32(body))


@dataclass
class Rolled:
    """What the rollups of a run hold (NOTE [rollups])."""

    slots: list[tuple[int, Bucket]] = field(default_factory=list)
    """Each line's slot and bucket, in the file's order (read as buckets)."""
    made: list[tuple[int, dict[str, Any], bytes]] = field(default_factory=list)
    """Each line's slot, its bucket as a record and its bucket's state as JSON (for
    :meth:`Bucket.from_state`), in the file's order (read as records: NOTE [a slot's
    record])."""
    to: int = 0
    """The byte of records.jsonl where what they hold ends: the records past it are not in
    them."""
    records: int = 0
    seq: int | None = None
    """The seq of the last record they hold (the recorder numbers its records in the order
    it writes them: the greatest they hold), None where it has none."""


_CHECK = b',"check":'
"""Each rollup line ends with the CRC-32 of what comes before this: a figure changed on the
way (a bad disk, a hand edit) would parse, and be merged, as a plausible one."""
_STATE = b',"bucket":'
_RECORD = b',"record":'
_TAIL_MAX = 1 << 20
"""The longest last line of a rollup that is checked (a record is a few KiB)."""
MADE_SLOTS = 10_000
"""The lines of each slot length's first this many slots hold their bucket's record
(NOTE [a slot's record]): a report reads a slot length's lines as records where its
buckets are one slot each, which is where the run spans at most its TARGET_BUCKETS
(iolens.analysis.longrun) of them."""

"""NOTE [a slot's record]: a line holds its slot's bucket twice: its state (what a merge
needs: sums, extremes, counts) and the record a report reads (:meth:`Bucket.record`). The
week's report (bench/bench_report.py) takes its 6,049 buckets of 100 s one slot each:
made from their states (each figure checked, then each bucket made a record) they took
0.42 s of its 1.1 s, where parsing them as records takes 0.12 s. So a report whose
buckets are one slot each parses the records alone, and one whose buckets are two slots
the states alone: each line says how long its state is (``bucket_len``), and the state,
then the record, are cut out of it by that (the line is whole JSON still, and its CRC
covers both). A bucket of one slot that records past the rollups fall in (a run
recorded again into its directory) is merged from its state.
The record is read as its line's CRC says, less a check of the figures every report
indexes (``merged``, ``elapsed_s``, ``interval_s``): checking all of it as the records of
records.jsonl are checked (:func:`iolens.analysis.recordshape.record_problem`) took
0.3-0.47 s for the week's, and a line changed on the way fails its CRC. What
:meth:`Bucket.record` makes is written to disk: a change to it is a new ROLLUP_VERSION,
so that the rollups of an older iolens are rebuilt, not read as records of another
shape.
The record costs disk (3.7 KB a line beside the state's 2.3 KB), and a slot length's
buckets are one slot each only while the run spans at most TARGET_BUCKETS of its slots:
so the lines of the first MADE_SLOTS slots hold it, and no later one. The week's rollups
are then 1.5 times as large as with states alone, not 2.7 times: each slot length's
records are at most 10,000 lines however long the run (bench/RESULTS.md). A line
without its record read as one is made one from its state."""


def read_rollups(run_dir: str, records_path: str, slot_s: float, *,
                 made: bool = False) -> Rolled | None:
    """The rollups of ``slot_s``-second slots beside ``records_path`` as far as they hold and
    match it; None where there are none, or they do not match the records (NOTE
    [rollups]). ``made``: each slot read as its record (:attr:`Rolled.made`), not as its
    bucket (NOTE [a slot's record])."""
    try:
        size = os.path.getsize(records_path)
        fh = open(os.path.join(run_dir, rollups_file(slot_s)), "rb")  # noqa: SIM115
    except OSError:
        return None
    parse = loads()
    out = Rolled()
    crc = None
    with fh:
        for line in fh:
            try:
                cut = line.rfind(_CHECK)
                end = line.rstrip(b"\n")
                if (cut < 0 or not end.endswith(b"}")
                        or _count(int(end[cut + len(_CHECK):-1])) != zlib.crc32(line[:cut])):
                    break
                at = line.find(_STATE)  # (the first: what comes before it is numbers)
                item = parse(line[:at] + b"}") if at > 0 else None
                if not isinstance(item, dict):
                    break
                to = item["to"]
                if (item.get("rollup") != ROLLUP_VERSION
                        or item.get("slot_s") != slot_s or item.get("from") != out.to
                        or _count(to) <= out.to or to > size):
                    break
                slot, line_crc = item["slot"], _count(item["crc"])
                if isinstance(slot, bool) or not isinstance(slot, int):
                    break
                begin = at + len(_STATE)
                stop = begin + _count(item["bucket_len"])
                has = line[stop:stop + len(_RECORD)] == _RECORD
                if not has and stop != cut:
                    break
                if made and has:
                    rec = parse(line[stop + len(_RECORD):cut])
                    n = _made(rec)
                    out.made.append((slot, rec, line[begin:stop]))
                else:
                    b = Bucket.from_state(parse(line[begin:stop]))
                    n = b.n
                    if made:  # (a slot past MADE_SLOTS: its record made here)
                        out.made.append((slot, b.record(), line[begin:stop]))
                    else:
                        out.slots.append((slot, b))
            except (ValueError, TypeError, KeyError, IndexError, RecursionError):
                break
            out.to, out.records, crc = to, out.records + n, line_crc
    last = _last_line(records_path, out.to)
    if not (out.slots or out.made) or last is None or crc != zlib.crc32(last):
        return None
    try:
        seq = parse(last).get("seq")
    except (ValueError, AttributeError, RecursionError):
        seq = None
    out.seq = seq if type(seq) is int else None
    return out


def _made(rec: Any) -> int:
    """The intervals a line's record holds; ValueError where it is not a bucket's record
    (NOTE [a slot's record]: what the reports index in every record, checked; the rest as
    its line's CRC says)."""
    if not isinstance(rec, dict):
        raise ValueError("not an object")
    n = _count(rec["merged"])
    if not n or _num(rec["elapsed_s"]) < 0 or _num(rec["interval_s"]) < 0:
        raise ValueError("not a bucket's record")
    return n


def _last_line(path: str, end: int) -> bytes | None:
    """The line of ``path`` that ends at byte ``end`` (its newline too), or None."""
    start = max(0, end - _TAIL_MAX)
    try:
        with open(path, "rb") as fh:
            fh.seek(start)
            data = fh.read(end - start)
    except OSError:
        return None
    if len(data) != end - start or not data.endswith(b"\n"):
        return None
    cut = data.rfind(b"\n", 0, len(data) - 1)
    if cut < 0 and start > 0:
        return None
    return data[cut + 1:]
