"""Cost of the stage timing inside DataLoader workers (NOTE [stage timing]), side by side.

Goal from the issue: under 1 microsecond per sample added in the worker, beside
bench_batch.py's per-batch figure for the training process. Three parts, each
in interleaved rounds (the machine is shared: medians, spreads, paired rounds):

  micro   in one child process, a loop doing what torch's worker loop does per
          batch (index_queue.get -> torch's _MapDatasetFetcher: N x
          dataset[i], collate -> data_queue.put) over stand-in queues and a
          trivial dataset, plain and with iolens' wrappers (_TimedIndexQueue,
          _TimedDataQueue, _timed_collate on a _StageClock and TimingWriter),
          batch sizes 1, 8, 32, 128. The wrapped index queue first asks for work
          without blocking (one poll(2) on a real queue, as torch's own get with a
          timeout makes): work waiting (the worker is busy: the case that costs
          the job), or none (the worker is ahead: a flush per batch, while it
          would idle anyway, then the blocking get).
  audit   open()+close() of a small file in child processes without and with
          the "open" audit hook (_audit -> _StageClock.opened), alternated:
          the hook is process-wide and cannot be removed once added.
  macro   a real DataLoader (2 workers, fork, in-memory tensors of 8 floats,
          batch sizes 1 and 32) in child processes, plain and under the timing
          bootstrap (IOLENS_RUN_DIR, _hooks.start, patch_dataloader), A/B
          alternated; samples/s from the first batch to the last.

Results are appended to bench/RESULTS.md by `make bench` (--out).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import queue
import statistics
import subprocess
import sys
import tempfile
import time
from array import array
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from iolens.rundir import records
from iolens.training import _hooks

BATCH_SIZES = (1, 8, 32, 128)
MACRO_BATCH_SIZES = (1, 32)
VARIANTS = ("plain", "timed", "ahead")
"""plain: torch's loop as it is; timed: with iolens' wrappers, the worker busy (its index
queue holds work); ahead: the same with no work waiting (a flush per batch)."""
GOAL_NS_PER_SAMPLE = 1000


# -- micro: one worker's per-batch path, in process -------------------------------------------

class _Dataset:
    """Map-style and trivial: what is left is the loop's own cost."""

    def __getitem__(self, i: int) -> int:
        return i

    def __len__(self) -> int:
        return 1 << 30


class _IndexQueue:
    """Stands in for a worker's index queue: always holds work, or (``ahead``) has none
    when asked without blocking, and then work when asked again with a timeout."""

    __slots__ = ("ahead", "idx", "indices")

    def __init__(self, batch_size: int, ahead: bool) -> None:
        self.indices = list(range(batch_size))
        self.idx = 0
        self.ahead = ahead

    def get(self, block: bool = True, timeout: float | None = None) -> tuple[int, list[int]]:
        if self.ahead and not block:
            raise queue.Empty
        self.idx += 1
        return self.idx, self.indices


class _DataQueue:
    __slots__ = ("last",)

    def __init__(self) -> None:
        self.last: Any = None

    def put(self, obj: Any, timeout: float | None = None) -> None:
        self.last = obj


def _collate(batch: list[int]) -> list[int]:
    return batch


def _worker_batches(index_queue: Any, data_queue: Any, fetcher: Any, resume: type,
                    batches: int) -> float:
    """ns per batch of torch's worker loop body (worker.py, ``while watchdog.is_alive()``)."""
    gc.disable()
    try:
        t0 = time.perf_counter_ns()
        for _ in range(batches):
            r = index_queue.get(timeout=5.0)
            if isinstance(r, resume):
                continue
            if r is None:
                break
            idx, index = r
            data = fetcher.fetch(index)
            data_queue.put((idx, data))
            del data, idx, index, r
        return (time.perf_counter_ns() - t0) / batches
    finally:
        gc.enable()


def _per_call_ns(fn: Callable[[], object], calls: int) -> float:
    gc.disable()
    try:
        t0 = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        return (time.perf_counter_ns() - t0) / calls
    finally:
        gc.enable()


def micro_child(rounds: int, samples: int) -> dict[str, Any]:
    import multiprocessing  # noqa: PLC0415 - only this child needs them

    from torch.utils.data._utils.fetch import _MapDatasetFetcher  # noqa: PLC0415
    from torch.utils.data._utils.worker import _ResumeIteration  # noqa: PLC0415

    ctx = multiprocessing.get_context("fork")
    probe_q: Any = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        w = _hooks.start(os.path.join(tmp, "timing"))
        clock = _hooks._start_clock(True)
        if clock is None:
            raise RuntimeError("no stage clock: timing did not start")
        ds = _Dataset()
        plain_fetcher = _MapDatasetFetcher(ds, True, _collate, False)
        timed_fetcher = _MapDatasetFetcher(ds, True, _hooks._timed_collate(_collate, clock), False)
        runs: dict[int, dict[str, tuple[Any, Any, Any]]] = {}
        for bs in BATCH_SIZES:
            runs[bs] = {
                "plain": (_IndexQueue(bs, False), _DataQueue(), plain_fetcher),
                "timed": (_hooks._TimedIndexQueue(_IndexQueue(bs, False), clock),
                          _hooks._TimedDataQueue(_DataQueue(), clock), timed_fetcher),
                "ahead": (_hooks._TimedIndexQueue(_IndexQueue(bs, True), clock),
                          _hooks._TimedDataQueue(_DataQueue(), clock), timed_fetcher),
            }
        out: dict[str, Any] = {str(bs): {v: [] for v in VARIANTS} for bs in BATCH_SIZES}
        calls: dict[str, Callable[[], object]] = {
            "a no-op lambda (the loop itself)": lambda: None,
            "`time.monotonic_ns`": time.monotonic_ns,
            "`time.thread_time_ns`": time.thread_time_ns,
            "`multiprocessing.Queue.empty()` (one poll, for scale)": probe_q.empty,
        }
        clocks: dict[str, list[float]] = {name: [] for name in calls}
        for bs in BATCH_SIZES:  # warm up
            for v in VARIANTS:
                _worker_batches(*runs[bs][v], _ResumeIteration, 200)
        for r in range(rounds):
            order = list(VARIANTS[r % 3:] + VARIANTS[:r % 3])
            if r % 2:
                order.reverse()
            for bs in BATCH_SIZES:
                n = max(1000, samples // bs)
                for v in order:
                    out[str(bs)][v].append(_worker_batches(*runs[bs][v], _ResumeIteration, n))
            for name, fn in calls.items():
                clocks[name].append(_per_call_ns(fn, 20_000))
        _hooks.stop()
    return {"batches": out, "clocks": clocks, "written": w.written}


# -- audit: the "open" hook, in separate processes ----------------------------------------

def audit_child(hook: bool, opens: int, reps: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        folder = os.path.join(tmp, "data")
        os.mkdir(folder)
        path = os.path.join(folder, "sample.bin")
        with open(path, "wb") as fh:
            fh.write(b"\0" * 64)
        clock = None
        if hook:
            _hooks.start(os.path.join(tmp, "timing"))
            clock = _hooks._start_clock(True)
            if clock is None:
                raise RuntimeError("no stage clock: timing did not start")

        def open_close() -> None:
            open(path, "rb").close()

        _per_call_ns(open_close, 500)
        per_open = [_per_call_ns(open_close, opens) for _ in range(reps)]
        counted = clock.files if clock is not None else 0
        if hook:
            _hooks.stop()
    return {"ns": per_open, "counted": counted, "expected": 500 + opens * reps}


# -- macro: a real DataLoader with 2 forked workers ----------------------------------------

def macro_child(patched: bool, batches: int) -> dict[str, Any]:
    run_dir = os.environ.get("IOLENS_RUN_DIR") if patched else None
    if patched:
        if not run_dir:
            raise RuntimeError("the timed child needs IOLENS_RUN_DIR")
        # What the bootstrap (iolens/_bootstrap/sitecustomize.py) does, in this order.
        _hooks.start(os.path.join(run_dir, "timing"))
    import torch  # noqa: PLC0415 - after the bootstrap, as in a job under `iolens run`
    from torch.utils.data import DataLoader, Dataset, dataloader  # noqa: PLC0415

    if patched:
        _hooks.patch_dataloader(dataloader)
    torch.set_num_threads(1)

    class Tiny(Dataset[torch.Tensor]):
        def __init__(self, n: int) -> None:
            self.data = [torch.full((8,), float(i)) for i in range(n)]

        def __len__(self) -> int:
            return len(self.data)

        def __getitem__(self, i: int) -> torch.Tensor:
            return self.data[i]

    rates: dict[str, float] = {}
    for bs in MACRO_BATCH_SIZES:
        loader = DataLoader(Tiny(bs * batches), batch_size=bs, num_workers=2,
                            multiprocessing_context="fork")
        first = last = 0.0
        n = 0
        for _ in loader:
            last = time.perf_counter()
            if not n:
                first = last  # worker start-up is not the loop's throughput
            n += 1
        rates[str(bs)] = (n - 1) * bs / (last - first)
    fetch = files = 0
    if run_dir:
        _hooks.stop()
        timing = os.path.join(run_dir, "timing")
        for name in os.listdir(timing):
            if not name.endswith(".bin") or name == f"{os.getpid()}.bin":
                continue
            files += 1
            recs = array("q")
            with open(os.path.join(timing, name), "rb") as fh:
                recs.frombytes(fh.read())
            fetch += sum(1 for k in recs[0::3] if k & records.TYPE_MASK == records.FETCH)
    return {"rates": rates, "worker_files": files, "fetch_records": fetch}


# -- the parent: rounds, children, the summary ---------------------------------------------

def _child(argv: Sequence[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    cmd = [sys.executable, os.path.abspath(__file__), *argv]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}):\n{proc.stderr}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def _quartiles(v: Sequence[float]) -> tuple[float, float, float]:
    if len(v) < 2:
        return v[0], v[0], v[0]
    q1, q2, q3 = statistics.quantiles(v, n=4, method="inclusive")
    return q1, q2, q3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="append a Markdown summary here")
    ap.add_argument("--quick", action="store_true", help="fewer rounds: a smoke run")
    ap.add_argument("--child", choices=("micro", "audit", "macro"), help=argparse.SUPPRESS)
    ap.add_argument("--rounds", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--size", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--reps", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--on", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.child == "micro":
        print(json.dumps(micro_child(args.rounds, args.size)))
        return 0
    if args.child == "audit":
        print(json.dumps(audit_child(args.on, args.size, args.reps)))
        return 0
    if args.child == "macro":
        print(json.dumps(macro_child(args.on, args.size)))
        return 0

    micro_rounds, micro_samples = (3, 4096) if args.quick else (15, 16384)
    audit_rounds, opens = (2, 2000) if args.quick else (8, 5000)
    macro_rounds, macro_batches = (1, 300) if args.quick else (7, 1500)
    started = time.monotonic()

    print("micro ...", file=sys.stderr)
    micro = _child(["--child", "micro", "--rounds", str(micro_rounds),
                    "--size", str(micro_samples)])

    print("audit hook ...", file=sys.stderr)
    audit: dict[bool, list[float]] = {False: [], True: []}
    counted_ok = True
    for r in range(audit_rounds):
        for on in ((False, True) if r % 2 == 0 else (True, False)):
            res = _child(["--child", "audit", "--size", str(opens), "--reps", "5",
                          *(["--on"] if on else [])])
            audit[on].append(statistics.median(res["ns"]))
            if on and res["counted"] != res["expected"]:
                counted_ok = False

    print("macro ...", file=sys.stderr)
    macro: dict[bool, list[dict[str, Any]]] = {False: [], True: []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(macro_rounds):
            for on in ((False, True) if r % 2 == 0 else (True, False)):
                env = dict(os.environ)
                env.pop("IOLENS_RUN_DIR", None)
                if on:
                    env["IOLENS_RUN_DIR"] = os.path.join(tmp, f"run{r}")
                argv = ["--child", "macro", "--size", str(macro_batches)]
                macro[on].append(_child([*argv, "--on"] if on else argv, env))
    elapsed = time.monotonic() - started

    lines = [
        "",
        "# Benchmark: stage timing inside the DataLoader workers",
        "",
        f"- when: {datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')}; "
        f"{elapsed:.0f} s{' (--quick)' if args.quick else ''}",
        f"- machine: {platform.machine()}, {os.cpu_count()} CPUs, Linux {platform.release()}, "
        f"Python {platform.python_version()}",
        f"- micro: torch's worker loop body over stand-in queues and a trivial dataset, "
        f"plain and with iolens' wrappers; {micro_rounds} interleaved rounds of "
        f"max(1000, {micro_samples} / batch size) batches; added = the paired difference "
        f"within each round, median (q1 - q3); {micro['written']} records written meanwhile",
        "- busy: work waits in the index queue, the case that costs the job (on a real "
        "queue the non-blocking get makes the one poll torch's own get makes, so the stand-in "
        "queues leave out only what both do); ahead: no work waits, so each batch is flushed "
        "while the worker would wait anyway",
        "",
        "| batch size | plain ns/batch | timed ns/batch | added ns/batch, busy | "
        "added ns/sample, busy | goal < 1000 | added ns/batch, ahead |",
        "|---:|---:|---:|---:|---:|---|---:|",
    ]
    met: list[int] = []
    for bs in BATCH_SIZES:
        v = micro["batches"][str(bs)]
        plain, timed, ahead = v["plain"], v["timed"], v["ahead"]
        busy_q1, busy_med, busy_q3 = _quartiles([t - p for p, t in zip(plain, timed, strict=True)])
        ah_q1, ah_med, ah_q3 = _quartiles([a - p for p, a in zip(plain, ahead, strict=True)])
        ok = busy_med / bs < GOAL_NS_PER_SAMPLE
        if ok:
            met.append(bs)
        lines.append(
            f"| {bs} | {statistics.median(plain):.0f} | {statistics.median(timed):.0f} | "
            f"{busy_med:.0f} ({busy_q1:.0f} - {busy_q3:.0f}) | {busy_med / bs:.0f} "
            f"({busy_q1 / bs:.0f} - {busy_q3 / bs:.0f}) | {'yes' if ok else 'no'} | "
            f"{ah_med:.0f} ({ah_q1:.0f} - {ah_q3:.0f}) |")
    lines += [
        "",
        "- what one timed batch calls (per call, the loop's own cost included; the busy path "
        "makes 5 `monotonic_ns` and 2 `thread_time_ns`):",
        "",
        "| call | ns, median | q1 - q3 |",
        "|---|---:|---:|",
    ]
    for name, vals in micro["clocks"].items():
        q1, med, q3 = _quartiles(vals)
        lines.append(f"| {name} | {med:.0f} | {q1:.0f} - {q3:.0f} |")

    off, on_ = audit[False], audit[True]
    diffs = [b - a for a, b in zip(off, on_, strict=True)]
    a_q1, a_med, a_q3 = _quartiles(diffs)
    lines += [
        "",
        f"- audit hook: `open(path, 'rb').close()` of a 64-byte file, in {2 * audit_rounds} "
        f"child processes alternating without and with the hook (it cannot be removed "
        f"once added); each child the median of 5 x {opens} opens; files counted by the "
        f"hook {'as expected' if counted_ok else 'NOT as expected'}",
        "",
        "| what | ns per open, median | range of children |",
        "|---|---:|---:|",
        f"| without the hook | {statistics.median(off):.0f} | {min(off):.0f} - {max(off):.0f} |",
        f"| with `_audit` -> `_StageClock.opened` | {statistics.median(on_):.0f} | "
        f"{min(on_):.0f} - {max(on_):.0f} |",
        f"| added (paired, median, q1 - q3) | {a_med:.0f} | {a_q1:.0f} - {a_q3:.0f} |",
    ]

    fetch = [m["fetch_records"] for m in macro[True]]
    files = [m["worker_files"] for m in macro[True]]
    expected = macro_batches * len(MACRO_BATCH_SIZES)
    lines += [
        "",
        f"- macro: DataLoader(num_workers=2, fork) over in-memory tensors of 8 floats, "
        f"{macro_batches} batches per batch size, in {2 * macro_rounds} child processes "
        f"alternating plain and under the timing bootstrap (IOLENS_RUN_DIR, `_hooks.start`, "
        f"`patch_dataloader`: the training process's per-batch hook is in too); samples/s "
        f"from the first batch to the last; ratio paired within each round; the timed runs' "
        f"workers wrote {min(fetch)} - {max(fetch)} FETCH records (expected {expected}) "
        f"from {min(files)} - {max(files)} worker files per run",
        "",
        "| batch size | plain samples/s (range) | timed samples/s (range) | "
        "timed / plain, median (range) | resolved |",
        "|---:|---:|---:|---:|---|",
    ]
    for bs in MACRO_BATCH_SIZES:
        p = [m["rates"][str(bs)] for m in macro[False]]
        t = [m["rates"][str(bs)] for m in macro[True]]
        ratios = [b / a for a, b in zip(p, t, strict=True)]
        # A sign test: every paired round on one side of 1, else the difference is noise.
        if len(ratios) < 5:
            verdict = "too few rounds"
        elif max(ratios) < 1:
            verdict = "slower in every round"
        elif min(ratios) > 1:
            verdict = "faster in every round"
        else:
            verdict = "no: below this machine's noise"
        lines.append(
            f"| {bs} | {statistics.median(p):.0f} ({min(p):.0f} - {max(p):.0f}) | "
            f"{statistics.median(t):.0f} ({min(t):.0f} - {max(t):.0f}) | "
            f"{statistics.median(ratios):.4f} ({min(ratios):.4f} - {max(ratios):.4f}) | "
            f"{verdict} |")
    sizes = ", ".join(str(b) for b in met) or "none"
    lines += ["", f"- goal under {GOAL_NS_PER_SAMPLE} ns per sample added in the worker "
              f"(busy, median) met at batch sizes: {sizes}", ""]
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "a") as fh:
            fh.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
