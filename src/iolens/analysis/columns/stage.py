"""The columns of a run's intervals (:class:`StageColumns`) and the readers of a record's
figures they are made with (NOTE [columns] in iolens/analysis/columns/__init__.py)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any


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
    t: tuple[float, ...]
    """The clock at the interval's end (seconds since the epoch)."""
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
    main_samples: tuple[int, ...]
    """The training process's and the workers' samples, and those in state D, where the
    records kept them by role (0 samples where not: NOTE [blocked by role] in
    iolens/analysis/verdict/figures.py)."""
    main_blocked: tuple[int, ...]
    worker_samples: tuple[int, ...]
    worker_blocked: tuple[int, ...]
    iterable: tuple[bool, ...]
    """Whether the loop iterated a loader that is not a torch DataLoader."""
    has_workers: tuple[bool, ...]
    """Whether the interval recorded the DataLoader workers' figures."""
    has_job: tuple[bool, ...]
    """Whether it recorded the job's processes' figures."""
    has_gpu: tuple[bool, ...]
    """Whether it recorded a GPU (NVML answering for it or not)."""
    helper_b: tuple[tuple[float, ...], ...]
    """Bytes read from devices on the job's behalf by each helper outside it (a local
    server of a network dataset, a FUSE daemon) in the interval, one entry per storage
    entry."""
    waiting_s: tuple[float, ...]
    """How long the loop had waited for a batch at the interval's end, where it waited
    (NOTE [no batch for a while] in iolens/recorder/sampler.py)."""
    waiting: tuple[tuple[tuple[bool, int, str, str], ...], ...]
    """Where each process of the loader waited then, as the recorder saw it: whether it
    is not the training process, its pid, its role, and its state and where it sleeps."""

    @property
    def n(self) -> int:
        return len(self.secs)

    def timed(self) -> list[int]:
        """The intervals whose DataLoader batches were timed: what the model is built
        from."""
        return [i for i in range(self.n) if self.loader[i] and self.batches[i] > 0]

    def take(self, idx: Sequence[int]) -> StageColumns:
        """The columns of the intervals ``idx`` only, in that order."""
        return StageColumns(**{name: tuple(col[i] for i in idx)
                               for name, col in vars(self).items()})

    @classmethod
    def of(cls, records: Sequence[dict[str, Any]]) -> StageColumns:
        rows = [_row(rec) for rec in records]
        if not rows:
            return cls(*([()] * len(_FIELDS)))
        return cls(*zip(*rows, strict=True))

    def folded(self, groups: Iterable[Sequence[int]]) -> StageColumns:
        """The intervals of each group folded into one entry, as a long run's buckets fold
        records (iolens.rundir.rollup): counts, seconds and bytes summed; rates and the
        machine's CPU shares their means over the seconds; p50s and p95s their means over
        the steps or waits timed; the longest, the most workers and processes, and each
        flag where any interval had it. NOTE [blocks from the columns]."""
        rows = [tuple(_FOLD[name](self, name, g) for name in _FIELDS)
                for g in groups if g]
        if not rows:
            return StageColumns(*([()] * len(_FIELDS)))
        return StageColumns(*zip(*rows, strict=True))


"""NOTE [blocks from the columns]: the model resamples blocks of a run's intervals (NOTE
[prediction intervals] in iolens/analysis/model/predict.py). It used to fold each block's
records into a long run's bucket and read the bucket's record back, which rounds the
processes' CPU to a hundredth of a percent and each p50 to a microsecond; the blocks are
now folded from the columns, with no rounding, so a block's CPU and bytes are its
intervals' to the last bit, and no record is read again (a week's report spent 0.17 s of
its model there, under a profiler). The recorded runs' reports and the week's did not
move (their predictions' intervals are given to three digits)."""


def _row(rec: Any) -> tuple[Any, ...]:
    """One record's entry of each column, in the order of StageColumns' fields."""
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
    step, wait = t.get("step"), t.get("data_wait")
    handover = p.get("handover")
    cpu = isinstance(c, dict) and c
    return (
        s, amount(rec, "elapsed_s"), amount(rec, "t"), amount(t, "batches"),
        amount(step, "sum_s"), amount(wait, "sum_s"),
        amount(step, "p50_s"), amount(wait, "p50_s"),
        amount(step, "p95_s"), amount(wait, "p95_s"),
        amount(step, "max_s"), amount(wait, "max_s"),
        int(amount(step, "count")), int(amount(wait, "count")),
        t.get("step_source") == "dataloader", t.get("step_source") == "marks",
        amount(t, "epochs_started"), amount(t, "num_workers"),
        amount(sw, "count"), amount(sw, "sum_s"),
        amount(ss, "sum_s") if isinstance(ss, dict) else amount(sw, "sum_s"),
        amount(pause, "count"), amount(pause, "sum_s"), amount(t.get("pause_wait"), "sum_s"),
        amount(main, "cpu_pct") / 100 * s, amount(main, "run_delay_pct") / 100 * s,
        amount(worker, "cpu_pct") / 100 * s, amount(job, "cpu_pct") / 100 * s,
        100 - amount(c, "idle") - amount(c, "iowait") if cpu else None,
        n, int(amount(p, "samples")), amount(p, "fetch_s"), amount(p, "fetch_cpu_s"),
        amount(p, "collate_s"), amount(p, "idle_s"), int(amount(p, "files")),
        int(amount(p, "processes")), int(amount(handover, "count")),
        amount(handover, "sum_s"), p.get("in_process") is True and n > 0,
        amount(worker, "pids"), amount(worker, "run_delay_pct") / 100 * max(0.0, s),
        amount(main, "rchar_s"), amount(main, "wchar_s"), amount(main, "read_bytes_s"),
        amount(worker, "rchar_s"), amount(worker, "wchar_s"), amount(worker, "read_bytes_s"),
        network_bytes(rec) if isinstance(rec, dict) else 0.0,
        amount(job, "read_bytes_s") * s, amount(job, "write_bytes_s") * s,
        amount(main, "write_bytes_s") * s, amount(worker, "cpu_pct"),
        amount(c, "idle") + amount(c, "iowait") if cpu else None,
        _count(states, "D"),
        sum(_count(states, k) for k in states) if isinstance(states, dict) else 0,
        _samples(main), _count(main, "blocked"), _samples(worker), _count(worker, "blocked"),
        t.get("iterable_loader") is True, bool(worker), isinstance(job, dict),
        bool(rec.get("gpu")) if isinstance(rec, dict) else False,
        tuple((amount(f, "server_read_bytes_s") + amount(f, "daemon_read_bytes_s")) * s
              for f in st.values()) if isinstance(st, dict) else (),
        amount(t, "waiting_s"), _waiting(t.get("waiting")),
    )


def _samples(role: dict[str, Any]) -> int:
    """A role's process samples where its record counts those in state D: one a process
    in an interval's record (``pids``), summed in a long run's bucket (``samples``)."""
    if "blocked" not in role:
        return 0
    return _count(role, "samples") or _count(role, "pids")


def _waiting(procs: Any) -> tuple[tuple[bool, int, str, str], ...]:
    """:attr:`StageColumns.waiting` of a record's ``train.waiting``."""
    out = []
    for p in procs if isinstance(procs, list) else ():
        if not isinstance(p, dict):
            continue
        at = ", ".join(x for x in (f"in {p['syscall']}" if p.get("syscall") else "",
                                   f"at {p['wchan']}" if p.get("wchan") else "") if x)
        pid = p.get("pid")
        role = p.get("role")
        out.append((role != "main", pid if type(pid) is int else 0, str(role),
                    f"{p.get('state')}" + (f", {at}" if at else "")))
    return tuple(out)


_FIELDS = tuple(StageColumns.__dataclass_fields__)

_Fold = Callable[[StageColumns, str, Sequence[int]], Any]


def _sum(c: StageColumns, name: str, g: Sequence[int]) -> Any:
    col = getattr(c, name)
    t = 0 if type(col[g[0]]) is int else 0.0
    for i in g:
        t += col[i]
    return t


def _most(c: StageColumns, name: str, g: Sequence[int]) -> Any:
    col = getattr(c, name)
    return max(col[i] for i in g)


def _any(c: StageColumns, name: str, g: Sequence[int]) -> bool:
    col = getattr(c, name)
    return any(col[i] for i in g)


def _by(weight: str) -> _Fold:
    """The mean over ``weight`` (entries that are None left out; None where all are)."""
    def fold(c: StageColumns, name: str, g: Sequence[int]) -> float | None:
        col, w = getattr(c, name), getattr(c, weight)
        total = weighed = 0.0
        for i in g:
            if col[i] is not None:
                total += col[i] * w[i]
                weighed += w[i]
        if weighed > 0:
            return total / weighed
        return None if all(col[i] is None for i in g) else 0.0
    return fold


def _workers(c: StageColumns, name: str, g: Sequence[int]) -> float:
    """The most num_workers of the intervals that started an epoch (where it is recorded)."""
    return max((c.num_workers[i] for i in g if c.epochs[i]), default=0.0)


def _last(c: StageColumns, name: str, g: Sequence[int]) -> Any:
    return getattr(c, name)[g[-1]]


def _helpers(c: StageColumns, name: str, g: Sequence[int]) -> tuple[float, ...]:
    out: list[float] = []
    for i in g:
        for k, b in enumerate(c.helper_b[i]):
            if k < len(out):
                out[k] += b
            else:
                out.append(b)
    return tuple(out)


_FOLD: dict[str, _Fold] = {name: _sum for name in _FIELDS}
_FOLD.update(
    elapsed_s=_most, t=_most, step_max_s=_most, wait_max_s=_most, p_processes=_most,
    worker_pids=_most,
    step_p50_s=_by("step_count"), step_p95_s=_by("step_count"),
    wait_p50_s=_by("wait_count"), wait_p95_s=_by("wait_count"),
    used_pct=_by("secs"), idle_pct=_by("secs"), main_rchar_s=_by("secs"),
    main_wchar_s=_by("secs"), main_read_s=_by("secs"), worker_rchar_s=_by("secs"),
    worker_wchar_s=_by("secs"), worker_read_s=_by("secs"), worker_cpu_pct=_by("secs"),
    loader=_any, marks=_any, p_in_process=_any, iterable=_any, has_workers=_any,
    has_job=_any, has_gpu=_any, num_workers=_workers, helper_b=_helpers, waiting_s=_last,
    waiting=_last)


def added(col: Iterable[float]) -> float:
    """The entries added one after another from 0.0, as a loop over the records adds them
    (``x += ...``): sum() adds floats otherwise from Python 3.12, and a figure read from
    the columns is the one read from the records to the last bit (NOTE [columns])."""
    t = 0.0
    for x in col:
        t += x
    return t
