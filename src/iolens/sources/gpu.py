"""GPUs through NVML (nvidia-ml-py), optional and lazy: no NVML is a recorded fact, not an error."""

from __future__ import annotations

import contextlib
from typing import Any


class GpuReader:
    """Utilization, memory and processes of each GPU, or the reason there are none."""

    def __init__(self) -> None:
        self.available = False
        self.reason = ""
        self.names: list[str] = []
        self._nvml: Any = None
        self._handles: list[Any] = []
        try:
            import pynvml  # noqa: PLC0415 - optional dependency, imported only when sampling

            pynvml.nvmlInit()
            count = pynvml.nvmlDeviceGetCount()
            self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
            self.names = [_text(pynvml.nvmlDeviceGetName(h)) for h in self._handles]
            self._nvml = pynvml
            self.available = True
            if not count:
                self.reason = "NVML found no GPU"
        except ImportError:
            self.reason = "nvidia-ml-py is not installed (pip install nvidia-ml-py)"
        except Exception as exc:  # noqa: BLE001 - NVMLError and driver faults alike
            self.reason = f"NVML unavailable: {exc}"

    def sample(self) -> list[dict[str, Any]]:
        """One dict per GPU; a GPU whose query fails reports the error instead."""
        out: list[dict[str, Any]] = []
        if not self.available:
            return out
        nv = self._nvml
        for i, h in enumerate(self._handles):
            try:
                util = nv.nvmlDeviceGetUtilizationRates(h)
                mem = nv.nvmlDeviceGetMemoryInfo(h)
                entry: dict[str, Any] = {
                    "index": i, "util_pct": float(util.gpu), "mem_util_pct": float(util.memory),
                    "mem_used_bytes": int(mem.used), "mem_total_bytes": int(mem.total),
                }
                procs = _processes(nv, h)
                if procs is not None:
                    entry["pids"] = sorted(procs)
                    entry["proc_mem_bytes"] = [procs[p] for p in entry["pids"]]
                out.append(entry)
            except Exception as exc:  # noqa: BLE001
                out.append({"index": i, "error": str(exc)})
        return out

    def close(self) -> None:
        """Shut NVML down; safe to call twice."""
        if self._nvml is not None:
            with contextlib.suppress(Exception):
                self._nvml.nvmlShutdown()
            self._nvml = None
            self.available = False


def _processes(nv: Any, handle: Any) -> dict[int, int | None] | None:
    """pid -> GPU memory it holds (None where NVML does not say), compute and graphics
    contexts alike; None when the driver answers neither query."""
    found: dict[int, int | None] = {}
    answered = False
    for query in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
        try:
            procs = getattr(nv, query)(handle)
        except Exception:  # noqa: BLE001 - not supported on every driver or container
            continue
        answered = True
        for p in procs:
            used = getattr(p, "usedGpuMemory", None)
            mem = int(used) if isinstance(used, int) and used >= 0 else None
            pid = int(p.pid)
            if found.get(pid) is None:
                found[pid] = mem
    return found if answered else None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
