"""``iolens run --tensorboard DIR``: each record's key figures as TensorBoard scalars.

Written through PyTorch's ``torch.utils.tensorboard.SummaryWriter``
(imported only when asked for; it needs the ``tensorboard`` package), with
the record's ``seq`` as the step and its time as the wall time, so
TensorBoard's "relative" and "wall" axes both line up with the run.

Tags (MB is 2^20 bytes, as in ``iostat -m``):

- ``train/data_wait_share``, ``train/step_p50_s``, ``train/step_p95_s``,
  ``train/data_wait_p50_s``, ``train/data_wait_p95_s``, ``train/batches_per_s``;
- ``device/<dev>/util``, ``device/<dev>/r_await``, ``device/<dev>/w_await``,
  ``device/<dev>/aqu_sz``, ``device/<dev>/rMB_s``, ``device/<dev>/wMB_s``;
- ``job/read_MB_s``, ``job/write_MB_s``, ``job/cache_hit``, ``job/cpu_pct``,
  ``job/worker_cpu_pct``, ``job/worker_cache_hit``;
- ``cpu/busy_pct``, ``cpu/iowait_pct``; ``gpu/<i>/util_pct``, ``gpu/<i>/mem_used_MB``.

A figure the interval does not have (no batch, no reads) is left out.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from typing import Any

from iolens.sinks.base import SinkError
from iolens.sinks.base import number as _num

INSTALL_HINT = "pip install 'iolens[tensorboard]'"
_MB = 1 << 20


def scalars(record: Mapping[str, Any]) -> dict[str, float]:
    """The tags and values written for one record (pure)."""
    out: dict[str, float | None] = {}
    train = record.get("train") or {}
    if train.get("batches"):
        step = train.get("step") or {}
        wait = train.get("data_wait") or {}
        out["train/data_wait_share"] = _num(train.get("data_wait_share"))
        out["train/step_p50_s"] = _num(step.get("p50_s"))
        out["train/step_p95_s"] = _num(step.get("p95_s"))
        out["train/data_wait_p50_s"] = _num(wait.get("p50_s"))
        out["train/data_wait_p95_s"] = _num(wait.get("p95_s"))
        secs = _num(record.get("interval_s"))
        if secs:
            out["train/batches_per_s"] = train["batches"] / secs
    for dev, d in (record.get("devices") or {}).items():
        out[f"device/{dev}/util"] = _num(d.get("util"))
        out[f"device/{dev}/r_await"] = _num(d.get("r_await"))
        out[f"device/{dev}/w_await"] = _num(d.get("w_await"))
        out[f"device/{dev}/aqu_sz"] = _num(d.get("aqu_sz"))
        for src, tag in (("rkB_s", "rMB_s"), ("wkB_s", "wMB_s")):
            kb = _num(d.get(src))
            out[f"device/{dev}/{tag}"] = kb / 1024 if kb is not None else None
    job = record.get("job") or {}
    if job:
        for src, tag in (("read_bytes_s", "read_MB_s"), ("write_bytes_s", "write_MB_s")):
            b = _num(job.get(src))
            out[f"job/{tag}"] = b / _MB if b is not None else None
        out["job/cache_hit"] = _num(job.get("cache_hit"))
        out["job/cpu_pct"] = _num(job.get("cpu_pct"))
        worker = (job.get("roles") or {}).get("worker") or {}
        out["job/worker_cpu_pct"] = _num(worker.get("cpu_pct"))
        out["job/worker_cache_hit"] = _num(worker.get("cache_hit"))
    cpu = record.get("cpu") or {}
    idle = _num(cpu.get("idle"))
    if idle is not None:
        out["cpu/busy_pct"] = max(0.0, 100.0 - idle - (_num(cpu.get("iowait")) or 0.0))
        out["cpu/iowait_pct"] = _num(cpu.get("iowait"))
    for g in record.get("gpu") or ():
        i = g.get("index")
        out[f"gpu/{i}/util_pct"] = _num(g.get("util_pct"))
        used = _num(g.get("mem_used_bytes"))
        out[f"gpu/{i}/mem_used_MB"] = used / _MB if used is not None else None
    return {k: v for k, v in out.items() if v is not None}


class TensorBoardSink:
    """Writes :func:`scalars` of each record into an event file under ``log_dir``."""

    def __init__(self, log_dir: str, flush_secs: int = 10) -> None:
        """Create ``log_dir`` and its event file now; SinkError when it cannot be (a usage
        error) or when the packages are missing."""
        try:
            from torch.utils.tensorboard import (  # noqa: PLC0415 - optional and heavy
                SummaryWriter,
            )
        except ImportError as exc:
            raise SinkError(f"--tensorboard needs PyTorch and TensorBoard ({exc}): "
                            f"{INSTALL_HINT}") from None
        self._hook = _QuietWriterThreads()
        try:
            os.makedirs(log_dir, exist_ok=True)
            if not os.access(log_dir, os.W_OK | os.X_OK):
                raise PermissionError(13, "Permission denied", log_dir)
            self._writer: Any = SummaryWriter(log_dir=log_dir, flush_secs=flush_secs)
        except OSError as exc:
            self._hook.remove()
            raise SinkError(f"--tensorboard {log_dir}: {exc.strerror or exc}") from None
        except Exception as exc:  # noqa: BLE001 - the writer's own errors, whatever their type
            self._hook.remove()
            raise SinkError(f"--tensorboard {log_dir}: {exc}") from None
        self.log_dir = log_dir

    def write(self, record: Mapping[str, Any]) -> None:
        """Add the record's scalars; raises what the writer raised (a full disk)."""
        step = int(record.get("seq") or 0)
        wall = _num(record.get("t"))
        for tag, value in scalars(record).items():
            self._writer.add_scalar(tag, value, global_step=step, walltime=wall)

    def close(self) -> None:
        """Flush and close the event file."""
        writer, self._writer = self._writer, None
        try:
            if writer is not None:
                writer.close()
        finally:
            self._hook.remove()


class _QuietWriterThreads:
    """Keeps the event writer's own thread from printing a traceback when it fails.

    TensorBoard writes in a thread of its own, which keeps the error (a full
    disk) and re-raises it from the next ``add_scalar``: that is where the
    sink fails and is dropped with a note. The thread also lets the error
    escape, and Python's default hook would print its traceback over the
    job's terminal. Other threads' errors go to the previous hook.
    """

    def __init__(self) -> None:
        self._previous = threading.excepthook
        threading.excepthook = self._hook

    def _hook(self, args: threading.ExceptHookArgs) -> None:
        if type(args.thread).__module__.startswith("tensorboard.summary.writer"):
            return
        self._previous(args)

    def remove(self) -> None:
        if threading.excepthook == self._hook:
            threading.excepthook = self._previous
