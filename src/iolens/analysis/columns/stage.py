"""The columns of a run's intervals (:class:`StageColumns`) and the readers of a record's
figures they are made with (NOTE [columns] in iolens/analysis/columns/__init__.py)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
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
    has_gpu: tuple[bool, ...]
    """Whether it recorded a GPU (NVML answering for it or not)."""
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
                    ("has_gpu", bool(rec.get("gpu")) if isinstance(rec, dict) else False),
                    ("helper_b", tuple(
                        (amount(f, "server_read_bytes_s") + amount(f, "daemon_read_bytes_s"))
                        * s for f in st.values()) if isinstance(st, dict) else ())):
                cols[name].append(value)
        return cls(**{k: tuple(v) for k, v in cols.items()})


def added(col: Iterable[float]) -> float:
    """The entries added one after another from 0.0, as a loop over the records adds them
    (``x += ...``): sum() adds floats otherwise from Python 3.12, and a figure read from
    the columns is the one read from the records to the last bit (NOTE [columns])."""
    t = 0.0
    for x in col:
        t += x
    return t
