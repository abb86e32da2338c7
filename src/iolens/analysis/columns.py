"""A run's interval figures as typed columns, read once (NOTE [columns]).

:class:`StageColumns` holds, one entry per interval record, the loop's batches, steps and
waits, the epochs' starts and the pauses, the processes' CPU and bytes, the machine's CPU,
the workers' stage timing and what helpers read for the job; :class:`DeviceColumns`,
:class:`RoleColumns`, :class:`StoreColumns`, :class:`RankColumns` and
:class:`GpuColumns` each device's, each role's, each storage entry's, each rank's and each
GPU's figures, and :class:`CpuColumns` the machine's CPU, with the indices of the
intervals that have them. Built once
from a run's records (or from the model's resampling blocks), any span or pick of
intervals is then summed from them without reading a record again: the model
(:func:`iolens.analysis.model.figures`), the pipeline
(:func:`iolens.analysis.pipeline.pipeline_over`), the verdict (:class:`RunColumns`, and
its windows as :class:`Span`) and the report's tables.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Container, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

"""NOTE [columns]: records travel as dicts from the run directory, and each part of the
analysis used to read the figures it needs out of every record again, through its own
helpers. The model read them 201 times a report (the run once, then each of its 200
resamples of up to 40 blocks), and was built twice (before and after the storage's
ceiling was known): in a week's report, 1.5 s of 5.3 under a profiler. The columns are
read from the records once; a figure over a span is a sum over entries, added in the
records' order (the figures are the same to the last bit as those read from the records
one by one: the recorded runs' reports are byte for byte those of the code that read the
records). The verdict's windows are interval indices into the columns, not lists of
records. What still reads records: the long run's fold and the model's resampling blocks
(a Bucket folds records), the hang and the missing-disk findings (the last intervals),
whether any timed interval saw a GPU (the pin_memory advice) and the report's HTML
charts. `iolens compare` reads each run's columns (its interval samples, its per-interval
distributions, the pipeline of its proof) and hands them to the verdicts."""


def amount(d: Any, key: str) -> float:
    """A finite, non-negative figure of ``d``, else 0 (a damaged record hides nothing)."""
    if not isinstance(d, dict):
        return 0.0
    v = d.get(key)
    if type(v) is float:  # (the most of them: read once per figure per interval)
        return v if 0.0 < v < math.inf else 0.0  # (NaN is neither)
    if v is None:
        return 0.0
    try:
        f = float(v)
    except (TypeError, ValueError, OverflowError):  # (an integer beyond any float)
        return 0.0
    return f if math.isfinite(f) and f > 0 else 0.0


def network_bytes(rec: dict[str, Any]) -> float:
    """Bytes the job received from the dataset's network peers in one interval."""
    st = rec.get("storage")
    if not isinstance(st, dict):
        return 0.0
    return sum(amount(fig, "rx_bytes_s") for fig in st.values()) * amount(rec, "interval_s")


def _train(rec: Any) -> dict[str, Any]:
    t = rec.get("train") if isinstance(rec, dict) else None
    return t if isinstance(t, dict) else {}


def _role(rec: Any, role: str) -> dict[str, Any]:
    job = rec.get("job") if isinstance(rec, dict) else None
    roles = job.get("roles") if isinstance(job, dict) else None
    r = roles.get(role) if isinstance(roles, dict) else None
    return r if isinstance(r, dict) else {}


def _dict(d: Any, key: str) -> Any:
    return d.get(key) if isinstance(d, dict) else None


def _count(d: Any, key: str) -> int:
    v = d.get(key) if isinstance(d, dict) else None
    return v if isinstance(v, int) else 0


@dataclass(frozen=True)
class StageColumns:
    """The model's figures of each interval, by column (each entry as the records hold it,
    finite and non-negative, else 0)."""

    secs: tuple[float, ...]
    elapsed_s: tuple[float, ...]
    """The run's seconds at the interval's end."""
    batches: tuple[float, ...]
    step_s: tuple[float, ...]
    wait_s: tuple[float, ...]
    step_p50_s: tuple[float, ...]
    """The interval's median step and data wait, their p95s, their longest, and how many
    steps and waits it timed."""
    wait_p50_s: tuple[float, ...]
    step_p95_s: tuple[float, ...]
    wait_p95_s: tuple[float, ...]
    step_max_s: tuple[float, ...]
    wait_max_s: tuple[float, ...]
    step_count: tuple[int, ...]
    wait_count: tuple[int, ...]
    loader: tuple[bool, ...]
    """Whether the interval's steps were timed at the DataLoader (not marked by hand)."""
    marks: tuple[bool, ...]
    """Whether they were marked by hand (``iolens.step()``)."""
    epochs: tuple[float, ...]
    """Epochs started in the interval."""
    num_workers: tuple[float, ...]
    """The DataLoader's num_workers, where the interval recorded it."""
    start_count: tuple[float, ...]
    """Batches that opened an epoch, and their wait and step (the step taken as the wait
    in records from before the steps were kept)."""
    start_wait_s: tuple[float, ...]
    start_step_s: tuple[float, ...]
    pauses: tuple[float, ...]
    """Batches that held a pause of the loop, and their step and wait (NOTE [pauses])."""
    pause_step_s: tuple[float, ...]
    pause_wait_s: tuple[float, ...]
    main_cpu_s: tuple[float, ...]
    """CPU seconds of the training process, the workers and the whole job, and the
    training process's run delay, over each interval."""
    main_delay_s: tuple[float, ...]
    worker_cpu_s: tuple[float, ...]
    job_cpu_s: tuple[float, ...]
    used_pct: tuple[float | None, ...]
    """The machine's CPU busy (100 less idle and iowait), None where not recorded."""
    # the pipeline's stage timing (iolens.analysis.pipeline)
    p_batches: tuple[int, ...]
    p_samples: tuple[int, ...]
    p_fetch_s: tuple[float, ...]
    p_fetch_cpu_s: tuple[float, ...]
    p_collate_s: tuple[float, ...]
    p_idle_s: tuple[float, ...]
    p_files: tuple[int, ...]
    p_processes: tuple[int, ...]
    p_handovers: tuple[int, ...]
    p_handover_s: tuple[float, ...]
    p_in_process: tuple[bool, ...]
    worker_pids: tuple[float, ...]
    worker_queue_s: tuple[float, ...]
    """Seconds the workers waited for a core in the interval (their run delay)."""
    main_rchar_s: tuple[float, ...]
    """Bytes a second the training process and the workers read through syscalls, wrote,
    and read from block devices (NOTE [bytes per sample] in
    iolens/analysis/pipeline.py)."""
    main_wchar_s: tuple[float, ...]
    main_read_s: tuple[float, ...]
    worker_rchar_s: tuple[float, ...]
    worker_wchar_s: tuple[float, ...]
    worker_read_s: tuple[float, ...]
    net_bytes: tuple[float, ...]
    """Bytes received from the dataset's network peers in the interval."""
    job_read_b: tuple[float, ...]
    """Bytes the job read from and wrote to storage in the interval."""
    job_write_b: tuple[float, ...]
    main_write_b: tuple[float, ...]
    """Bytes the training process itself wrote to storage in the interval."""
    worker_cpu_pct: tuple[float, ...]
    """The workers' CPU, all of them together (% of a core)."""
    idle_pct: tuple[float | None, ...]
    """The machine's CPUs idle and in iowait (%), None where not recorded."""
    d_states: tuple[int, ...]
    """The job's process samples in uninterruptible sleep (state D), and in any state."""
    all_states: tuple[int, ...]
    iterable: tuple[bool, ...]
    """Whether the loop iterated a loader that is not a torch DataLoader."""
    has_workers: tuple[bool, ...]
    """Whether the interval recorded the DataLoader workers' figures."""
    has_job: tuple[bool, ...]
    """Whether it recorded the job's processes' figures."""
    helper_b: tuple[tuple[float, ...], ...]
    """Bytes read from devices on the job's behalf by each helper outside it (a local
    server of a network dataset, a FUSE daemon) in the interval, one entry per storage
    entry."""

    @property
    def n(self) -> int:
        return len(self.secs)

    def take(self, idx: Sequence[int]) -> StageColumns:
        """The columns of the intervals ``idx`` only, in that order."""
        return StageColumns(**{name: tuple(col[i] for i in idx)
                               for name, col in vars(self).items()})

    @classmethod
    def of(cls, records: Sequence[dict[str, Any]]) -> StageColumns:
        cols: dict[str, list[Any]] = {name: [] for name in cls.__dataclass_fields__}
        for rec in records:
            t = _train(rec)
            s = amount(rec, "interval_s")
            main, worker = _role(rec, "main"), _role(rec, "worker")
            sw, ss = t.get("epoch_start_wait"), t.get("epoch_start_step")
            pause = t.get("pause_step")
            c = rec.get("cpu") if isinstance(rec, dict) else None
            job, st = _dict(rec, "job"), _dict(rec, "storage")
            states = _dict(job, "states")
            p = _dict(t, "pipeline")
            p = p if isinstance(p, dict) else {}
            n = int(amount(p, "batches"))
            for name, value in (
                    ("secs", s), ("elapsed_s", amount(rec, "elapsed_s")),
                    ("batches", amount(t, "batches")),
                    ("step_s", amount(t.get("step"), "sum_s")),
                    ("wait_s", amount(t.get("data_wait"), "sum_s")),
                    ("step_p50_s", amount(t.get("step"), "p50_s")),
                    ("wait_p50_s", amount(t.get("data_wait"), "p50_s")),
                    ("step_p95_s", amount(t.get("step"), "p95_s")),
                    ("wait_p95_s", amount(t.get("data_wait"), "p95_s")),
                    ("step_max_s", amount(t.get("step"), "max_s")),
                    ("wait_max_s", amount(t.get("data_wait"), "max_s")),
                    ("step_count", int(amount(t.get("step"), "count"))),
                    ("wait_count", int(amount(t.get("data_wait"), "count"))),
                    ("loader", t.get("step_source") == "dataloader"),
                    ("marks", t.get("step_source") == "marks"),
                    ("epochs", amount(t, "epochs_started")),
                    ("num_workers", amount(t, "num_workers")),
                    ("start_count", amount(sw, "count")),
                    ("start_wait_s", amount(sw, "sum_s")),
                    ("start_step_s", amount(ss, "sum_s") if isinstance(ss, dict)
                     else amount(sw, "sum_s")),
                    ("pauses", amount(pause, "count")),
                    ("pause_step_s", amount(pause, "sum_s")),
                    ("pause_wait_s", amount(t.get("pause_wait"), "sum_s")),
                    ("main_cpu_s", amount(main, "cpu_pct") / 100 * s),
                    ("main_delay_s", amount(main, "run_delay_pct") / 100 * s),
                    ("worker_cpu_s", amount(worker, "cpu_pct") / 100 * s),
                    ("job_cpu_s", amount(job, "cpu_pct") / 100 * s),
                    ("used_pct", 100 - amount(c, "idle") - amount(c, "iowait")
                     if isinstance(c, dict) and c else None),
                    ("p_batches", n), ("p_samples", int(amount(p, "samples"))),
                    ("p_fetch_s", amount(p, "fetch_s")),
                    ("p_fetch_cpu_s", amount(p, "fetch_cpu_s")),
                    ("p_collate_s", amount(p, "collate_s")),
                    ("p_idle_s", amount(p, "idle_s")),
                    ("p_files", int(amount(p, "files"))),
                    ("p_processes", int(amount(p, "processes"))),
                    ("p_handovers", int(amount(p.get("handover"), "count"))),
                    ("p_handover_s", amount(p.get("handover"), "sum_s")),
                    ("p_in_process", p.get("in_process") is True and n > 0),
                    ("worker_pids", amount(worker, "pids")),
                    ("worker_queue_s", amount(worker, "run_delay_pct") / 100 * max(0.0, s)),
                    ("main_rchar_s", amount(main, "rchar_s")),
                    ("main_wchar_s", amount(main, "wchar_s")),
                    ("main_read_s", amount(main, "read_bytes_s")),
                    ("worker_rchar_s", amount(worker, "rchar_s")),
                    ("worker_wchar_s", amount(worker, "wchar_s")),
                    ("worker_read_s", amount(worker, "read_bytes_s")),
                    ("net_bytes", network_bytes(rec) if isinstance(rec, dict) else 0.0),
                    ("job_read_b", amount(job, "read_bytes_s") * s),
                    ("job_write_b", amount(job, "write_bytes_s") * s),
                    ("main_write_b", amount(main, "write_bytes_s") * s),
                    ("worker_cpu_pct", amount(worker, "cpu_pct")),
                    ("idle_pct", amount(c, "idle") + amount(c, "iowait")
                     if isinstance(c, dict) and c else None),
                    ("d_states", _count(states, "D")),
                    ("all_states", sum(_count(states, k) for k in states)
                     if isinstance(states, dict) else 0),
                    ("iterable", t.get("iterable_loader") is True),
                    ("has_workers", bool(worker)),
                    ("has_job", isinstance(job, dict)),
                    ("helper_b", tuple(
                        (amount(f, "server_read_bytes_s") + amount(f, "daemon_read_bytes_s"))
                        * s for f in st.values()) if isinstance(st, dict) else ())):
                cols[name].append(value)
        return cls(**{k: tuple(v) for k, v in cols.items()})


@dataclass
class DeviceLoad:
    """One device over a set of intervals, time-weighted as iostat would over the whole span."""

    name: str
    secs: float = 0.0
    util: float = 0.0
    r_s: float = 0.0
    w_s: float = 0.0
    rkB_s: float = 0.0
    wkB_s: float = 0.0
    r_await: float = 0.0
    w_await: float = 0.0
    aqu_sz: float = 0.0

    @property
    def rareq_kib(self) -> float:
        return self.rkB_s / self.r_s if self.r_s else 0.0

    @property
    def rMB_s(self) -> float:
        return self.rkB_s / 1024

    @property
    def wMB_s(self) -> float:
        return self.wkB_s / 1024


@dataclass(frozen=True)
class DeviceColumns:
    """One device's figures of each interval that has them, by column: seconds, the
    figures times seconds (I/O counts), and the awaits times their I/O counts (each as
    the records hold it, finite and non-negative, else 0), with the index of each
    interval among the run's."""

    name: str
    at: tuple[int, ...]
    secs: tuple[float, ...]
    util: tuple[float, ...]
    """%util as recorded (the others below are over the interval's seconds)."""
    peak: tuple[float, ...]
    """The highest %util in the interval: a long run's bucket's ``util_max`` (a
    checkpoint's seconds vanish in its mean), else its %util."""
    rkb_s: tuple[float, ...]
    """kB read and written a second, as recorded."""
    wkb_s: tuple[float, ...]
    util_s: tuple[float, ...]
    rkb: tuple[float, ...]
    wkb: tuple[float, ...]
    aqu_s: tuple[float, ...]
    r_ios: tuple[float, ...]
    w_ios: tuple[float, ...]
    r_wait: tuple[float, ...]
    w_wait: tuple[float, ...]

    @classmethod
    def of(cls, records: Sequence[dict[str, Any]]) -> dict[str, DeviceColumns]:
        """Each device's columns, in the order the records name them."""
        return {name: cls(name, **c) for name, c in _by_key(
            records, lambda rec: rec.get("devices"), cls.__dataclass_fields__,
            cls._entry).items()}

    @staticmethod
    def _entry(d: dict[str, Any], s: float) -> Iterable[tuple[str, Any]]:
        ri, wi = amount(d, "r_s") * s, amount(d, "w_s") * s
        util, rkb, wkb = amount(d, "util"), amount(d, "rkB_s"), amount(d, "wkB_s")
        return (("util", util), ("peak", amount(d, "util_max") if "util_max" in d else util),
                ("rkb_s", rkb), ("wkb_s", wkb), ("util_s", util * s), ("rkb", rkb * s),
                ("wkb", wkb * s), ("aqu_s", amount(d, "aqu_sz") * s), ("r_ios", ri),
                ("w_ios", wi), ("r_wait", amount(d, "r_await") * ri),
                ("w_wait", amount(d, "w_await") * wi))

    def load(self, within: Container[int] | None = None) -> DeviceLoad:
        """The device over all its intervals, or those of the run's intervals ``within``
        (the sums a loop over their records makes, in the same order: a test holds them
        to one)."""
        if within is None:
            def col(c: tuple[float, ...]) -> Iterable[float]:
                return c
        else:
            keep = [k for k, i in enumerate(self.at) if i in within]

            def col(c: tuple[float, ...]) -> Iterable[float]:
                return (c[k] for k in keep)
        out = DeviceLoad(self.name)
        out.secs = secs = added(col(self.secs))
        if secs > 0:
            r_ios, w_ios = added(col(self.r_ios)), added(col(self.w_ios))
            out.util, out.rkB_s = added(col(self.util_s)) / secs, added(col(self.rkb)) / secs
            out.wkB_s, out.aqu_sz = added(col(self.wkb)) / secs, added(col(self.aqu_s)) / secs
            out.r_s, out.w_s = r_ios / secs, w_ios / secs
            out.r_await = added(col(self.r_wait)) / r_ios if r_ios else 0.0
            out.w_await = added(col(self.w_wait)) / w_ios if w_ios else 0.0
        return out


@dataclass(frozen=True)
class RoleColumns:
    """One role's figures (the training process, its workers, a cache copier ...) of
    each interval that has it, by column: seconds, the most processes, and the CPU and the
    bytes times seconds (each as the records hold it, finite and non-negative, else 0)."""

    name: str
    at: tuple[int, ...]
    secs: tuple[float, ...]
    pids: tuple[float, ...]
    cpu: tuple[float, ...]
    """%CPU times seconds."""
    read: tuple[float, ...]
    write: tuple[float, ...]
    rchar: tuple[float, ...]

    @classmethod
    def of(cls, records: Sequence[dict[str, Any]]) -> dict[str, RoleColumns]:
        """Each role's columns, in the order the records name the roles."""
        return {name: cls(name, **c) for name, c in _by_key(
            records, lambda rec: _dict(rec.get("job"), "roles"), cls.__dataclass_fields__,
            cls._entry).items()}

    @staticmethod
    def _entry(d: dict[str, Any], s: float) -> Iterable[tuple[str, Any]]:
        return (("pids", amount(d, "pids")), ("cpu", amount(d, "cpu_pct") * s),
                ("read", amount(d, "read_bytes_s") * s),
                ("write", amount(d, "write_bytes_s") * s), ("rchar", amount(d, "rchar_s") * s))


@dataclass(frozen=True)
class StoreColumns:
    """One storage entry's figures (a FUSE mount's, a network store's peer) of each
    interval that has it, by column, with the index of each interval among the run's: the
    requests waiting on the FUSE connection (None where not read), and the connections,
    new connections and bytes received a second (as the records hold them, finite and
    non-negative, else 0)."""

    name: str
    at: tuple[int, ...]
    secs: tuple[float, ...]
    waiting: tuple[float | None, ...]
    connections: tuple[float, ...]
    new_connections_s: tuple[float, ...]
    rx_bytes_s: tuple[float, ...]

    @classmethod
    def of(cls, records: Sequence[dict[str, Any]]) -> dict[str, StoreColumns]:
        """Each storage entry's columns, in the order the records name them."""
        return {name: cls(name, **c) for name, c in _by_key(
            records, lambda rec: rec.get("storage"), cls.__dataclass_fields__,
            cls._entry).items()}

    @staticmethod
    def _entry(d: dict[str, Any], s: float) -> Iterable[tuple[str, Any]]:
        return (("waiting", None if d.get("waiting") is None else amount(d, "waiting")),
                ("connections", amount(d, "connections")),
                ("new_connections_s", amount(d, "new_connections_s")),
                ("rx_bytes_s", amount(d, "rx_bytes_s")))

    def rows(self, within: Container[int]) -> list[int]:
        """The positions (in these columns) of the intervals ``within`` (run indices)."""
        return [k for k, i in enumerate(self.at) if i in within]

    def mean(self, column: str, rows: Sequence[int]) -> float | None:
        """``column`` over ``rows``, weighted by their seconds, the intervals without it
        left out; None where none has it or they last no time."""
        col: Sequence[float | None] = getattr(self, column)
        vals = [(x, self.secs[k]) for k in rows if (x := col[k]) is not None]
        secs = sum(s for _, s in vals)
        return sum(x * s for x, s in vals) / secs if secs else None


@dataclass(frozen=True)
class RankColumns:
    """One rank's figures (a multi-rank job's, as its own loop timed them) of each
    interval that has it, by column: the batches and the seconds of data wait and of step
    (as the records hold them, finite and non-negative, else 0)."""

    name: str
    at: tuple[int, ...]
    secs: tuple[float, ...]
    batches: tuple[float, ...]
    wait_s: tuple[float, ...]
    step_s: tuple[float, ...]

    @classmethod
    def of(cls, records: Sequence[dict[str, Any]]) -> dict[str, RankColumns]:
        """Each rank's columns, in the order the records name the ranks."""
        return {name: cls(name, **c) for name, c in _by_key(
            records, lambda rec: _train(rec).get("ranks"), cls.__dataclass_fields__,
            cls._entry).items()}

    @staticmethod
    def _entry(d: dict[str, Any], s: float) -> Iterable[tuple[str, Any]]:
        return (("batches", amount(d, "batches")), ("wait_s", amount(d, "data_wait_s")),
                ("step_s", amount(d, "step_s")))


@dataclass(frozen=True)
class CpuColumns:
    """The machine's CPU time shares (%) of each interval that recorded them, by column,
    with the index of each interval among the run's (as the records hold them, finite and
    non-negative, else 0)."""

    at: tuple[int, ...]
    user: tuple[float, ...]
    system: tuple[float, ...]
    iowait: tuple[float, ...]
    idle: tuple[float, ...]
    steal: tuple[float, ...]

    SHARES = ("user", "system", "iowait", "idle", "steal")

    @classmethod
    def of(cls, records: Sequence[dict[str, Any]]) -> CpuColumns:
        cols: dict[str, list[Any]] = {name: [] for name in ("at", *cls.SHARES)}
        for i, rec in enumerate(records):
            c = rec.get("cpu") if isinstance(rec, dict) else None
            if not isinstance(c, dict) or not c:
                continue
            cols["at"].append(i)
            for name in cls.SHARES:
                cols[name].append(amount(c, name))
        return cls(**{k: tuple(v) for k, v in cols.items()})


@dataclass(frozen=True)
class GpuColumns:
    """One GPU's figures in each interval NVML answered for it, by column: its %util and
    its memory used and in all (bytes), with the index of each interval among the run's
    (as the records hold them, finite and non-negative, else 0)."""

    index: int
    at: tuple[int, ...]
    util: tuple[float, ...]
    mem_used: tuple[float, ...]
    mem_total: tuple[float, ...]

    @classmethod
    def of(cls, records: Sequence[dict[str, Any]]) -> dict[int, GpuColumns]:
        """Each GPU's columns, by its index, in the order the records name them; an
        entry without its %util (NVML failed) is left out."""
        cols: dict[int, tuple[list[int], list[float], list[float], list[float]]] = {}
        for i, rec in enumerate(records):
            gpus = rec.get("gpu") if isinstance(rec, dict) else None
            for g in gpus if isinstance(gpus, list) else ():
                if not isinstance(g, dict) or g.get("util_pct") is None:
                    continue
                c = cols.setdefault(int(amount(g, "index")), ([], [], [], []))
                c[0].append(i)
                c[1].append(amount(g, "util_pct"))
                c[2].append(amount(g, "mem_used_bytes"))
                c[3].append(amount(g, "mem_total_bytes"))
        return {k: cls(k, tuple(at), tuple(util), tuple(used), tuple(total))
                for k, (at, util, used, total) in cols.items()}


def _by_key(records: Sequence[dict[str, Any]], maps: Callable[[dict[str, Any]], Any],
            fields: Iterable[str],
            entry: Callable[[dict[str, Any], float], Iterable[tuple[str, Any]]]
            ) -> dict[str, dict[str, tuple[Any, ...]]]:
    """For each name of the maps of figures that ``maps`` finds in a record (its devices,
    its roles), the columns ``entry`` makes of them in each interval that has them, with
    ``at`` (the interval's index) and ``secs`` (its seconds), in the order the records name
    them."""
    cols: dict[str, dict[str, list[Any]]] = {}
    for i, rec in enumerate(records):
        named = maps(rec) if isinstance(rec, dict) else None
        if not isinstance(named, dict) or not named:
            continue
        s = amount(rec, "interval_s")
        for name, d in named.items():
            if not isinstance(d, dict):
                continue
            c = cols.get(name)
            if c is None:
                c = cols[name] = {f: [] for f in fields if f != "name"}
            c["at"].append(i)
            c["secs"].append(s)
            for f, v in entry(d, s):
                c[f].append(v)
    return {name: {f: tuple(v) for f, v in c.items()} for name, c in cols.items()}


@dataclass(frozen=True)
class RunColumns:
    """What the verdict reads of a run, read once (NOTE [columns]): the columns of its
    intervals and of its devices, and those of its intervals with timed batches (``steps``)
    at ``timed_at`` among them. Spans of the run are indices into these, not records."""

    run: StageColumns
    devices: dict[str, DeviceColumns]
    timed_at: Sequence[int]
    steps: StageColumns
    stores: dict[str, StoreColumns]
    """Each storage entry's columns (a FUSE mount's, a network store's)."""
    ranks: dict[str, RankColumns]
    """Each rank's columns (a multi-rank job's)."""


@dataclass(frozen=True)
class Span:
    """Some of a run's timed intervals (a verdict's window): their positions among them
    (``picks``, in order) in the run's columns."""

    cols: RunColumns
    picks: Sequence[int]

    def total(self, column: str) -> float:
        """The timed intervals' column ``column`` summed over the span, as sum() does."""
        col: Sequence[float] = getattr(self.cols.steps, column)
        out: float = sum(col[i] for i in self.picks)
        return out

    def within(self) -> set[int]:
        """The span's intervals, as indices among the run's."""
        at = self.cols.timed_at
        return {at[i] for i in self.picks}

    def load(self, device: str, within: Container[int] | None = None) -> DeviceLoad:
        """``device`` over the span (``within``: :meth:`within`, where the caller has it)."""
        dev = self.cols.devices.get(device)
        if dev is None:
            return DeviceLoad(device)
        return dev.load(self.within() if within is None else within)

    def devices(self, within: Container[int] | None = None) -> list[str]:
        """The devices the span's intervals name, in the order they first name them."""
        within = self.within() if within is None else within
        first: dict[str, int] = {}
        for name, d in self.cols.devices.items():
            i = next((i for i in d.at if i in within), None)
            if i is not None:
                first[name] = i
        return sorted(first, key=first.__getitem__)

    def bounds(self) -> tuple[float, float] | None:
        """When the span's first interval began and its last ended (seconds into the run,
        the start at 0 or later); None for an empty span."""
        if not self.picks:
            return None
        steps, first = self.cols.steps, self.picks[0]
        return (max(0.0, steps.elapsed_s[first] - steps.secs[first]),
                steps.elapsed_s[self.picks[-1]])


def added(col: Iterable[float]) -> float:
    """The entries added one after another from 0.0, as a loop over the records adds them
    (``x += ...``): sum() adds floats otherwise from Python 3.12, and a figure read from
    the columns is the one read from the records to the last bit (NOTE [columns])."""
    t = 0.0
    for x in col:
        t += x
    return t
