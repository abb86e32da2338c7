"""GPUs through NVML (nvidia-ml-py), optional and lazy: no NVML is a recorded fact, not an error.

NOTE [NVML thread]: every NVML call runs on one daemon thread of the
reader's own, and the sampler waits for its answer at most ``timeout``
seconds. A driver in trouble (a GPU fallen off the bus, a wedged kernel
module, a hung persistence daemon) can block an NVML call for minutes; made
on the sampler's thread, such a call stopped the disk and CPU records with
it and kept ``iolens run`` from handing back the job's exit code. A call
that does not answer in time leaves each GPU's entry with the error and
``stale_s``, how long NVML has been blocked, until it answers again. ctypes
releases the GIL during the call, so the blocked thread costs the sampler
nothing, and it is a daemon, so a call that never returns does not hold up
the exit either.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any

INIT_TIMEOUT_S = 3.0
"""How long the constructor waits for nvmlInit. ``iolens run`` builds its reader
after the job has started, so each second here is a second not recorded;
without persistence mode NVML may take longer to start on a machine of many
GPUs, and the reader turns available by itself once it has."""
QUERY_TIMEOUT_S = 1.0
"""How long a sample waits for NVML's answer: a healthy query of 8 GPUs takes
a few milliseconds."""


class GpuReader:
    """Utilization, memory and processes of each GPU, or the reason there are none.

    ``available`` and ``reason`` may change while sampling: NVML that starts
    late becomes available; the first failing query is kept in ``reason``.
    """

    def __init__(self, timeout: float = QUERY_TIMEOUT_S,
                 init_timeout: float = INIT_TIMEOUT_S) -> None:
        self.available = False
        self.reason = ""
        """Why there are no GPU figures, or what went wrong with them."""
        self.names: list[str] = []
        self.timeout = timeout
        """Seconds :meth:`sample` waits for NVML (NOTE [NVML thread])."""
        self._handles: list[Any] = []
        self._cond = threading.Condition()
        self._asked = False
        self._closing = False
        self._answer: list[dict[str, Any]] | None = None
        self._busy_since: float | None = time.monotonic()
        """Monotonic time the NVML call in progress (nvmlInit first) began; None when the
        thread is idle."""
        self._thread: threading.Thread | None = None
        try:
            import pynvml  # noqa: PLC0415 - optional dependency, imported only when sampling
        except ImportError:
            self._busy_since = None
            self.reason = "nvidia-ml-py is not installed (pip install nvidia-ml-py)"
            return
        started = threading.Event()
        self._thread = threading.Thread(target=self._serve, args=(pynvml, started),
                                        name="iolens-nvml", daemon=True)
        self._thread.start()
        if not started.wait(init_timeout):
            with self._cond:
                if not self.available:
                    self.reason = (f"NVML did not start within {init_timeout:g} s (nvmlInit "
                                   "blocked); GPUs are recorded once it does")

    # -- the NVML thread (NOTE [NVML thread]) -----------------------------------------

    def _serve(self, nv: Any, started: threading.Event) -> None:
        try:
            nv.nvmlInit()
        except Exception as exc:  # noqa: BLE001 - NVMLError and driver faults alike
            self._stopped(f"NVML unavailable: {exc}", started)
            return
        try:
            if not self._start(nv, started):
                return
            while True:
                with self._cond:
                    self._cond.wait_for(lambda: self._asked or self._closing)
                    if self._closing:
                        return
                    self._asked = False
                    self._busy_since = time.monotonic()
                answer = [self._query(nv, i, h) for i, h in enumerate(self._handles)]
                with self._cond:
                    self._answer = answer
                    self._busy_since = None
                    self._cond.notify_all()
        finally:
            with contextlib.suppress(Exception):
                nv.nvmlShutdown()

    def _start(self, nv: Any, started: threading.Event) -> bool:
        """The GPUs' handles and names; False when there is nothing to sample."""
        try:
            count = nv.nvmlDeviceGetCount()
            handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
            names = [_text(nv.nvmlDeviceGetName(h)) for h in handles]
        except Exception as exc:  # noqa: BLE001
            self._stopped(f"NVML unavailable: {exc}", started)
            return False
        with self._cond:
            self._busy_since = None
            if not self._closing:
                self._handles, self.names = handles, names
                self.reason = "" if count else "NVML found no GPU"
                self.available = True
        started.set()
        return bool(count) and self.available

    def _stopped(self, reason: str, started: threading.Event) -> None:
        """NVML cannot be sampled: say why, and let the constructor go on."""
        with self._cond:
            self._busy_since = None
            self.reason = reason
        started.set()

    @staticmethod
    def _query(nv: Any, i: int, h: Any) -> dict[str, Any]:
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
            return entry
        except Exception as exc:  # noqa: BLE001
            return {"index": i, "error": str(exc)}

    # -- the sampler's side ------------------------------------------------------------

    def sample(self) -> list[dict[str, Any]]:
        """One dict per GPU; a GPU whose query fails reports the error instead, and
        one whose query has not answered within ``timeout`` carries ``stale_s``, the
        seconds NVML has been blocked."""
        with self._cond:
            if not self.available or self._closing or not self._handles:
                return []
            late, self._answer = self._answer, None
            if self._busy_since is None:
                # Idle: ask for a fresh answer. One that came after its sample gave up
                # (NVML slower than ``timeout``) is used now, and the next is asked for
                # at once, so that a slow NVML gives figures one interval old rather
                # than none.
                self._asked = True
                self._cond.notify_all()
            if late is not None:
                answer: list[dict[str, Any]] | None = late
            else:
                since = self._busy_since
                waited = time.monotonic() - since if since is not None else 0.0
                self._cond.wait_for(lambda: self._answer is not None,
                                    max(0.0, self.timeout - waited))
                answer, self._answer = self._answer, None
            if answer is None:
                since = self._busy_since
                blocked = time.monotonic() - since if since is not None else self.timeout
                error = (f"NVML has not answered for {blocked:.1f} s (a driver call is "
                         "blocked); no GPU figures until it does")
                # A figure, not a flag: records hold numbers (NOTE [record shape]).
                answer = [{"index": i, "error": error, "stale_s": round(blocked, 1)}
                          for i in range(len(self._handles))]
            if not self.reason:
                failed = next((g for g in answer if "error" in g), None)
                if failed is not None:
                    self.reason = f"GPU {failed['index']}: {failed['error']}"
            return answer

    def close(self) -> None:
        """Shut NVML down; safe to call twice. Never waits for a blocked NVML call: the
        thread shuts NVML down itself if that call ever returns."""
        with self._cond:
            self._closing = True
            self.available = False
            busy = self._busy_since is not None
            self._cond.notify_all()
        t = self._thread
        if t is not None and not busy and t is not threading.current_thread():
            t.join(self.timeout)


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
